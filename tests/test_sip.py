"""SIP's fast parts, without a server: the webhook's signature as the real ``openai`` SDK verifies it, the
``sip`` config section, the flow's decisions, the IPC framing and the INVITE's headers. The calls
themselves (a real phone, SIPp, an SDK app) are tests/calls/test_sip_*.py."""

from __future__ import annotations

import json

import openai
import pytest
from openai import OpenAI

from kame.server.config import load_app_config
from kame.server.telephony import decisions, ipc, webhook
from kame.server.telephony.config import SipConfig

SECRET = "whsec_" + "c2lwLXVuaXQtdGVzdC1zZWNyZXQ="


def _client(secret: str = SECRET) -> OpenAI:
    return OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1", webhook_secret=secret)


@pytest.mark.parametrize("kind", [webhook.REALTIME_INCOMING, webhook.LIVE_INCOMING])
def test_the_sdk_verifies_and_reads_the_incoming_call_webhooks(kind: str) -> None:
    headers_in = [{"name": "From", "value": "<sip:+15550100@trunk>;tag=1"}, {"name": "X-Custom", "value": "a"}]
    body = webhook.incoming_event(kind, "rtc_abc" if kind == webhook.REALTIME_INCOMING else "live_abc", headers_in)
    headers = webhook.signed_headers(SECRET, body, webhook.message_id())
    event = _client().webhooks.unwrap(body.decode(), headers)
    assert event.type == kind
    assert [(h.name, h.value) for h in event.data.sip_headers] == [("From", "<sip:+15550100@trunk>;tag=1"), ("X-Custom", "a")]
    if kind == webhook.REALTIME_INCOMING:
        assert event.data.call_id == "rtc_abc"
    else:
        assert event.data.session_id == "live_abc" and event.data.type == "sip"
    # another secret, or a body changed on the way: the SDK refuses it
    with pytest.raises(openai.InvalidWebhookSignatureError):
        _client("whsec_" + "b3RoZXItc2VjcmV0").webhooks.unwrap(body.decode(), headers)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        _client().webhooks.unwrap(body.decode().replace("abc", "abd"), headers)


def test_sip_config_from_the_environment_and_its_secret_never_shown() -> None:
    cfg = load_app_config(environ={"KAME_SIP__PORT": "5070", "KAME_SIP__WEBHOOK_URL": "https://app.example/hook",
                                   "KAME_SIP__WEBHOOK_SECRET": SECRET, "KAME_SIP__ALLOWED_NETWORKS": '["10.0.0.0/8"]'})
    assert cfg.sip.port == 5070 and cfg.sip.allowed_networks == ["10.0.0.0/8"]
    assert cfg.sip.webhook_secret is not None and cfg.sip.webhook_secret.get_secret_value() == SECRET
    assert SECRET not in repr(cfg) and SECRET not in cfg.model_dump_json()
    assert load_app_config(environ={}).sip.port is None  # SIP is off unless a port is set
    with pytest.raises(ValueError, match="whsec_"):
        SipConfig(webhook_secret="not-a-secret")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a network"):
        SipConfig(allowed_networks=["10.0.0.300/8"])
    with pytest.raises(ValueError, match="rtp_port_max"):
        SipConfig(rtp_port_min=40000, rtp_port_max=40000)


def test_who_may_ring_and_what_a_refusal_answers() -> None:
    base = {"allowed": ["192.0.2.0/24"], "draining": False, "ready": True, "free_slots": 1, "ringing": 0, "max_ringing": 4}
    assert decisions.admission(src="192.0.2.7:5060", **base) is None  # type: ignore[arg-type]
    assert decisions.admission(src="198.51.100.1:5060", **base) == (403, "forbidden")  # type: ignore[arg-type]
    assert decisions.admission(src="garbage", **base) == (403, "forbidden")  # type: ignore[arg-type]
    assert decisions.admission(src="192.0.2.7:5060", **{**base, "free_slots": 0}) == (486, "busy")  # type: ignore[arg-type]
    assert decisions.admission(src="192.0.2.7:5060", **{**base, "ringing": 4}) == (486, "busy")  # type: ignore[arg-type]
    assert decisions.admission(src="192.0.2.7:5060", **{**base, "draining": True}) == (503, "draining")  # type: ignore[arg-type]
    assert decisions.admission(src="192.0.2.7:5060", **{**base, "ready": False}) == (503, "starting")  # type: ignore[arg-type]
    assert decisions.allowed("[2001:db8::1]:5060", ["2001:db8::/32"]) and decisions.allowed("anything", [])


def test_reject_refer_and_accept_bodies_as_openai_takes_them() -> None:
    assert decisions.reject_status({}, required=False) == 603  # Realtime: 603 Decline when absent
    assert isinstance(decisions.reject_status({}, required=True), str)  # Live: required
    assert decisions.reject_status({"status_code": 486}, required=True) == 486
    for bad in (299, 700, "486", True):
        assert isinstance(decisions.reject_status({"status_code": bad}, required=False), str)
    assert decisions.refer_target({"target_uri": " tel:+14155550123 "}) == "tel:+14155550123"
    assert decisions.refer_target({"target_uri": "sip:desk@pbx.example;transport=tcp"}) is not None
    for bad in ("", "http://x", "sip:a\r\nVia: x", None):
        assert decisions.refer_target({"target_uri": bad}) is None
    session = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}, "noise_reduction": None},
                                             "output": {"format": {"type": "audio/pcma"}, "voice": "x"}}}
    stripped = decisions.without_phone_format(session)
    assert stripped["audio"] == {"input": {"noise_reduction": None}, "output": {"voice": "x"}}
    pcm = {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}
    assert decisions.without_phone_format(pcm) == pcm  # other formats are the session parser's to judge
    assert decisions.realtime_accept_problem({"type": "transcription"}) is not None
    assert decisions.realtime_accept_problem({"type": "realtime"}) is None


def test_logs_never_carry_a_webhook_query_or_a_uri_header() -> None:
    assert decisions.url_for_log("https://u:p@app.example:8443/hook?token=abc") == "https://app.example:8443/hook"
    assert decisions.uri_for_log("sip:desk@pbx;transport=tcp?X-Token=abc") == "sip:desk@pbx"
    assert [decisions.retry_delay(n) for n in (1, 2, 3, 9)] == [0.5, 1.0, 2.0, 2.0]


def test_ipc_frames_and_the_invite_headers() -> None:
    frame = ipc.control(7, op="answer", code=180)
    kind, cid, size = ipc.HEADER.unpack_from(frame)
    assert (kind, cid, size) == (ipc.CONTROL, 7, len(frame) - ipc.HEADER.size)
    assert json.loads(frame[ipc.HEADER.size:]) == {"op": "answer", "code": 180}
    assert ipc.HEADER.unpack_from(ipc.audio(1 << 24, bytes(320)))[1] == 1 << 24
    with pytest.raises(ValueError):
        ipc.pack(ipc.AUDIO, 1, bytes(70000))
    from kame.server.telephony.child import sip_headers

    invite = ("INVITE sip:kame@host SIP/2.0\r\nVia: SIP/2.0/UDP 1.2.3.4\r\nFrom: <sip:a@b>;tag=1\r\n"
              "Authorization: Digest secret\r\nX-Id: 1\r\nX-Id: 2\r\n\r\nv=0\r\n")
    assert sip_headers(invite) == [{"name": "Via", "value": "SIP/2.0/UDP 1.2.3.4"}, {"name": "From", "value": "<sip:a@b>;tag=1"},
                                   {"name": "X-Id", "value": "1"}, {"name": "X-Id", "value": "2"}]


class _Sideband:
    """What SipTransport needs of a sideband websocket: ``send_text`` (records what it got)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send_text(self, data: str) -> None:
        self.sent.append(json.loads(data))


def test_sip_transport_resamples_the_phone_and_words_keys_for_each_api() -> None:
    import asyncio

    import numpy as np

    from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
    from kame.server.telephony.transport import SipTransport

    async def main() -> tuple[SipTransport, SipTransport, list[bytes], _Sideband, _Sideband]:
        frames: list[bytes] = []
        rt = SipTransport(call_id="rtc_x", cid=1, api="realtime", send_child=frames.append)
        live = SipTransport(call_id="live_x", cid=2, api="live", send_child=frames.append)
        side_rt, side_live = _Sideband(), _Sideband()
        rt.attach(side_rt)  # type: ignore[arg-type]
        live.attach(side_live)  # type: ignore[arg-type]
        t = np.arange(ipc.RATE) / ipc.RATE
        tone = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes()
        for i in range(0, len(tone), ipc.FRAME_BYTES):  # one second of 20 ms frames at 8 kHz
            rt.audio_in(tone[i:i + ipc.FRAME_BYTES])
        rt.dtmf_in("5")
        rt.dtmf_in("x")  # not a key: dropped
        live.dtmf_in("#")
        live.from_sideband({"type": "websocket.receive", "text": json.dumps({"type": "transport.dtmf.send", "event": "9",
                                                                             "event_id": "c1"})})
        live.from_sideband({"type": "websocket.receive", "text": json.dumps({"type": "transport.dtmf.send", "event": "99"})})
        rt.from_sideband({"type": "websocket.receive", "text": json.dumps({"type": "transport.dtmf.send", "event": "1"})})
        live.dtmf_sent("9", "c1")
        await asyncio.sleep(0.05)
        return rt, live, frames, side_rt, side_live

    rt, live, frames, side_rt, side_live = asyncio.run(main())
    assert SAMPLE_RATE - 1000 < rt._position <= SAMPLE_RATE  # 8 kHz in, 24 kHz on the clock (the filter holds ~25 ms)
    pcm = np.concatenate([rt.clock.take() for _ in range(SAMPLE_RATE // FRAME_SIZE)])
    assert 0.15 < float(np.sqrt(np.mean(pcm[4800:] ** 2))) < 0.25  # the tone, at its level
    [dtmf] = side_rt.sent[:1]
    assert dtmf["type"] == "input_audio_buffer.dtmf_event_received" and dtmf["event"] == "5"
    assert isinstance(dtmf["received_at"], int)
    assert side_rt.sent[1]["type"] == "error"  # transport.dtmf.send is the Live API's
    types = [e["type"] for e in side_live.sent]
    assert types == ["transport.dtmf.received", "error", "transport.dtmf.sent"], side_live.sent
    assert side_live.sent[2]["client_event_id"] == "c1"
    sent = [json.loads(f[ipc.HEADER.size:]) for f in frames if ipc.HEADER.unpack_from(f)[0] == ipc.CONTROL]
    assert sent == [{"op": "dtmf", "digits": "9", "ref": "c1"}]  # only the valid key reached the phone
