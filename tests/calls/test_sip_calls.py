"""Phones over SIP, end to end: a real SIP phone (PJSIP's user agent, tests/support/sip_phone.py) calls
``kame serve`` (the CPU demo, SIP on) over loopback, and the operator's app is written only with the
``openai`` SDK, as against OpenAI: it verifies each webhook (``client.webhooks.unwrap``), accepts inside
its handler (before its 200), follows the call on the sideband, transfers it (REFER), hangs up, rejects.

The phone plays espeak-ng speech, records what it hears, presses keys (RFC 4733); what it does not cover:
a carrier's trunk (its SIP quirks, SRTP, NAT), and TLS (terminated in front of kame, docs/sip.md).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.support.moshi_client import ServerProcess
from tests.support.sip import (
    Kamailio,
    Phone,
    WebhookApp,
    first_sound,
    free_rtp_range,
    free_sip_port,
    speech_wav,
    wav_rms,
)

TOKEN = "sip-test-token"
SECRET = "whsec_c2lwLXRlc3Qtc2VjcmV0LWtleS0xMjM0NTY3ODkw"
ACCEPT_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def app() -> Iterator[WebhookApp]:
    hook = WebhookApp()
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def sip_server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory, app: WebhookApp) -> Iterator[ServerProcess]:
    port, rtp = free_sip_port(), free_rtp_range()
    env = {"KAME_SIP__PORT": str(port), "KAME_SIP__RTP_PORT_MIN": str(rtp), "KAME_SIP__RTP_PORT_MAX": str(rtp + 63),
           "KAME_SIP__WEBHOOK_URL": app.url, "KAME_SIP__WEBHOOK_SECRET": SECRET,
           "KAME_SIP__ACCEPT_TIMEOUT_S": str(ACCEPT_TIMEOUT_S), "KAME_SIP__ALLOWED_NETWORKS": '["127.0.0.1/32"]',
           "KAME_SIP__PROCESSES": "1", "KAME_SERVER__AUTH_TOKEN": TOKEN}
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp_path_factory.mktemp("sip") / "server.log", env=env,
                        label="cpu-demo + sip")
    srv.sip_port = port  # type: ignore[attr-defined]
    srv.start()
    deadline = time.monotonic() + 20
    while "SIP listening" not in srv.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speech_wav(tmp_path_factory.mktemp("speech") / "question.wav",
                      "Hello, this is a phone call. Could you tell me the opening hours of the shop today?")


def _uri(srv: ServerProcess, user: str = "kame") -> str:
    return f"sip:{user}@127.0.0.1:{srv.sip_port}"  # type: ignore[attr-defined]


def _client(srv: ServerProcess) -> OpenAI:
    return OpenAI(base_url=f"{srv.http_url}/v1", api_key=TOKEN, webhook_secret=SECRET)


def _auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


def _confirmed(call: int = 0) -> Any:
    return lambda e: e["event"] == "state" and e["state"] == "CONFIRMED" and e.get("call", 0) == call


def test_a_phone_is_verified_accepted_followed_transferred_and_hung_up(
        sip_server: ServerProcess, app: WebhookApp, speech: Path, tmp_path: Path) -> None:
    client = _client(sip_server)
    accepted: list[str] = []
    live_seen: list[str] = []

    def handler(headers: dict[str, str], body: bytes) -> None:
        event = client.webhooks.unwrap(body, headers)  # raises on a bad signature
        if event.type == "realtime.call.incoming":
            names = [h.name.lower() for h in event.data.sip_headers]
            assert "from" in names and "call-id" in names
            # accepted inside the handler, before the webhook's 200 (OpenAI's own example)
            client.realtime.calls.accept(event.data.call_id, type="realtime", instructions="Answer briefly.",
                                         audio={"input": {"format": {"type": "audio/pcmu"}},
                                                "output": {"format": {"type": "audio/pcmu"}}})
            accepted.append(event.data.call_id)
        elif event.type == "live.transport.incoming":
            live_seen.append(event.data.session_id)

    app.handler = handler
    answered0 = sip_server.metric("kame_sip_calls_total", 'result="answered"', _auth())
    record = tmp_path / "heard.wav"
    phone = Phone(uri=_uri(sip_server), play=str(speech), record=str(record), actions=[{"at": 3.0, "dtmf": "5"}],
                  max_s=60)
    phone.wait_for(_confirmed(0), 20)
    assert accepted and accepted[0].startswith("rtc_")
    assert live_seen and live_seen[0].startswith("live_")  # the same call, offered to the Live API too

    async def follow() -> list[Any]:
        sdk = AsyncOpenAI(base_url=f"{sip_server.http_url}/v1", api_key=TOKEN)
        seen: list[Any] = []
        async with sdk.realtime.connect(call_id=accepted[0]) as side:
            async for event in side:
                seen.append(event)
                if event.type == "input_audio_buffer.dtmf_event_received":
                    break
            # transfer the caller: PJSIP sends REFER, the phone dials the target (kame again: a new call)
            await sdk.realtime.calls.refer(accepted[0], target_uri=_uri(sip_server, "desk"))
            async for event in side:  # the sideband ends with the transferred call
                seen.append(event)
        await sdk.close()
        return seen

    seen = asyncio.run(asyncio.wait_for(follow(), 40))
    dtmf = next(e for e in seen if e.type == "input_audio_buffer.dtmf_event_received")
    assert dtmf.event == "5" and abs(dtmf.received_at - time.time()) < 60
    phone.wait_for(lambda e: e["event"] == "transfer" and "desk@" in e["target"], 10)
    phone.wait_for(_confirmed(1), 20)
    assert len(accepted) == 2  # the transferred call came in as a new call, announced and accepted
    client.realtime.calls.hangup(accepted[1])
    events = phone.finish(30)
    ended = [e for e in events if e["event"] == "state" and e["state"] == "DISCONNECTED"]
    assert len(ended) == 2, events
    seconds, rms = wav_rms(record)
    assert seconds > 2.0 and rms > 1e-3, (seconds, rms)  # the model's voice reached the phone
    # first audio: from the call's media starting (the recorder's start) to the model's first sound at the
    # phone, through kame's clocks, both resamplers, PJSIP's RTP and the phone's jitter buffer: 0.27 s here
    assert first_sound(record) < 1.0
    assert sip_server.metric("kame_sip_calls_total", 'result="answered"', _auth()) >= answered0 + 2
    assert sip_server.metric("kame_sip_refers_total", 'result="transferred"', _auth()) >= 1
    assert sip_server.metric("kame_sip_dtmf_total", 'direction="in"', _auth()) >= 1
    logs = sip_server.logs()
    assert "peer=sip" in logs and "reason=transferred" in logs
    assert SECRET not in logs and SECRET[6:] not in logs


def test_live_accept_and_keypresses_both_ways(sip_server: ServerProcess, app: WebhookApp) -> None:
    client = _client(sip_server)
    accepted: list[str] = []

    def handler(headers: dict[str, str], body: bytes) -> None:
        event = client.webhooks.unwrap(body, headers)
        if event.type == "live.transport.incoming":
            client.live.sessions.accept(event.data.session_id, session={"type": "live", "model": "gpt-live-1"})
            accepted.append(event.data.session_id)

    app.handler = handler
    phone = Phone(uri=_uri(sip_server), actions=[{"at": 4.0, "dtmf": "3"}], max_s=40)
    phone.wait_for(_confirmed(0), 20)
    # the first accept decides: the Realtime id of the same call is gone
    with pytest.raises(openai.NotFoundError):
        client.realtime.calls.accept("rtc_" + accepted[0][len("live_"):], type="realtime")

    async def follow() -> list[Any]:
        sdk = AsyncOpenAI(base_url=f"{sip_server.http_url}/v1", api_key=TOKEN)
        seen: list[Any] = []
        async with sdk.live.sideband.connect(session_id=accepted[0]) as side:
            await side.send({"type": "transport.dtmf.send", "event": "7", "event_id": "key-1"})  # type: ignore[arg-type]
            async for event in side:
                seen.append(event)
                if event.type == "transport.dtmf.received":
                    break
        await sdk.close()
        return seen

    seen = asyncio.run(asyncio.wait_for(follow(), 30))
    sent = next(e for e in seen if e.type == "transport.dtmf.sent")
    assert sent.event == "7" and sent.client_event_id == "key-1"
    assert next(e for e in seen if e.type == "transport.dtmf.received").event == "3"
    phone.wait_for(lambda e: e["event"] == "dtmf" and e["digit"] == "7", 10)
    client.live.sessions.hangup(accepted[0])
    events = phone.finish(30)
    assert ("DISCONNECTED", 200) in [(s, c) for s, c in Phone.states_of(events)]


def test_reject_timeout_retry_and_refusals(sip_server: ServerProcess, app: WebhookApp) -> None:
    client = _client(sip_server)
    plan: dict[str, Any] = {"mode": "reject"}
    failures: list[int] = []

    def handler(headers: dict[str, str], body: bytes) -> None:
        event = client.webhooks.unwrap(body, headers)
        mode = plan["mode"]
        if mode == "reject" and event.type == "realtime.call.incoming":
            client.realtime.calls.reject(event.data.call_id, status_code=486)
        elif mode == "live-reject" and event.type == "live.transport.incoming":
            client.live.sessions.reject(event.data.session_id, status_code=403)
        elif mode == "default-reject" and event.type == "realtime.call.incoming":
            client.realtime.calls.reject(event.data.call_id)
        elif mode == "flaky" and event.type == "realtime.call.incoming":
            if not failures:
                failures.append(1)
                raise RuntimeError("the app is down once")  # answered 500: kame retries
            client.realtime.calls.reject(event.data.call_id, status_code=600)

    app.handler = handler
    for mode, code in (("reject", 486), ("live-reject", 403), ("default-reject", 603), ("flaky", 600), ("ignore", 480)):
        plan["mode"] = mode
        before = len(app.received)
        phone = Phone(uri=_uri(sip_server), max_s=ACCEPT_TIMEOUT_S + 10)
        events = phone.finish(ACCEPT_TIMEOUT_S + 20)
        assert ("DISCONNECTED", code) in Phone.states_of(events), (mode, events)
        if mode == "flaky":
            ids = [h["webhook-id"] for h, b in app.received[before:] if b"realtime.call.incoming" in b]
            assert len(ids) == 2 and ids[0] == ids[1]  # retried, with the same webhook-id
    assert sip_server.metric("kame_sip_calls_total", 'result="timeout"', _auth()) >= 1
    # an INVITE from outside sip.allowed_networks never rings: 403, and the app hears nothing of it
    before = len(app.received)
    events = Phone(uri=_uri(sip_server), bind="127.0.0.3", max_s=10).finish(20)
    assert ("DISCONNECTED", 403) in Phone.states_of(events)
    assert len(app.received) == before
    assert "refused: 403 (forbidden)" in sip_server.logs()
    # kame's endpoints: the server's key, a known call, OpenAI's bodies
    with pytest.raises(openai.NotFoundError):
        client.realtime.calls.accept("rtc_unknown", type="realtime")
    with pytest.raises(openai.NotFoundError):
        client.live.sessions.refer("live_unknown", target_uri="tel:+15550100")
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{sip_server.http_url}/v1", api_key="wrong").realtime.calls.reject("rtc_unknown")
    raw = httpx.post(f"{sip_server.http_url}/v1/live/sessions/live_x/reject", json={}, headers=_auth())
    assert raw.status_code == 400 and "status_code" in raw.json()["error"]["message"]
    raw = httpx.post(f"{sip_server.http_url}/v1/realtime/calls/rtc_x/refer", json={"target_uri": "http://x"},
                     headers=_auth())
    assert raw.status_code == 400


def test_bad_sip_and_rtp_floods_lose_no_frame_of_another_call(sip_server: ServerProcess, app: WebhookApp,
                                                             speech: Path, tmp_path: Path) -> None:
    client = _client(sip_server)

    def handler(headers: dict[str, str], body: bytes) -> None:
        event = client.webhooks.unwrap(body, headers)
        if event.type == "realtime.call.incoming":
            client.realtime.calls.accept(event.data.call_id, type="realtime")

    app.handler = handler
    phone = Phone(uri=_uri(sip_server), play=str(speech), record=str(tmp_path / "heard.wav"),
                  actions=[{"at": 6.0, "hangup": True}], max_s=30)
    phone.wait_for(_confirmed(0), 20)
    port = sip_server.sip_port  # type: ignore[attr-defined]
    garbage = [b"\x00\xff" * 300, b"INVITE nothing\r\n\r\n", b"INVITE sip:x SIP/2.0\r\nVia: ???\r\nContent-Length: 99999\r\n\r\n",
               b"SIP/2.0 200 OK\r\n\r\n"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        deadline = time.monotonic() + 2.0
        rtp_ports = int(sip_server.env["KAME_SIP__RTP_PORT_MIN"]), 64
        n = 0
        while time.monotonic() < deadline:
            for g in garbage:
                s.sendto(g, ("127.0.0.1", port))
            for p in range(rtp_ports[0], rtp_ports[0] + rtp_ports[1]):  # a flood at every RTP port
                s.sendto(b"\x80\x00" + bytes(170), ("127.0.0.1", p))
            n += 1
            time.sleep(0.002)
    with socket.create_connection(("127.0.0.1", port)) as t:  # TCP: a message that is not SIP, then EOF
        t.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 5000)
    events = phone.finish(30)
    assert ("DISCONNECTED", 200) in Phone.states_of(events)
    seconds, rms = wav_rms(tmp_path / "heard.wav")
    assert seconds > 5.0 and rms > 1e-3
    ended = [line for line in sip_server.logs().splitlines() if "session ended" in line and "peer" not in line]
    last = ended[-1]
    assert "dropped_in_s=0.0" in last and "dropped_out=0" in last, last
    logs = sip_server.logs()
    assert "pjsip: Dropping" in logs and "suppressed" in logs  # PJSIP said what it dropped, without flooding the log
    assert logs.count("kame sip child: pjsip:") < 200


def test_sip_over_tls_through_the_shipped_proxy(sip_server: ServerProcess, app: WebhookApp, speech: Path,
                                                tmp_path: Path) -> None:
    """deploy/sip/kamailio.cfg terminates TLS (kame never uses the PJSIP wheels' OpenSSL) and record-routes:
    the call is answered, audio flows, and kame's own BYE (the app's hangup) reaches the phone over TLS. The
    test phone's TLS is the wheel's (a client here, not kame)."""
    client = _client(sip_server)
    accepted: list[str] = []

    def handler(headers: dict[str, str], body: bytes) -> None:
        event = client.webhooks.unwrap(body, headers)
        if event.type == "realtime.call.incoming":
            client.realtime.calls.accept(event.data.call_id, type="realtime")
            accepted.append(event.data.call_id)

    app.handler = handler
    proxy = Kamailio(tmp_path, sip_server.sip_port)  # type: ignore[attr-defined]
    try:
        record = tmp_path / "heard.wav"
        phone = Phone(uri=f"sip:kame@127.0.0.1:{proxy.tls_port};transport=tls", transport="tls", cert=str(proxy.cert),
                      key=str(proxy.key), play=str(speech), record=str(record), max_s=40)
        phone.wait_for(_confirmed(0), 20)
        time.sleep(4)
        client.realtime.calls.hangup(accepted[0])  # kame's BYE, through the proxy, over TLS
        events = phone.finish(30)
    finally:
        proxy.close()
    assert ("DISCONNECTED", 200) in Phone.states_of(events), events
    seconds, rms = wav_rms(record)
    assert seconds > 3.0 and rms > 1e-3, (seconds, rms)
    assert "reason=hangup" in sip_server.logs()


def _sip_children(srv: ServerProcess) -> list[int]:
    """The server's PJSIP child processes (their pids), read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == srv.proc.pid and b"kame.server.telephony.child" in cmdline:
            pids.append(int(entry.name))
    return pids


def test_a_crashed_sip_stack_is_restarted_and_answers_again(sip_server: ServerProcess, app: WebhookApp) -> None:
    import os
    import signal

    client = _client(sip_server)

    def handler(headers: dict[str, str], body: bytes) -> None:
        event = client.webhooks.unwrap(body, headers)
        if event.type == "realtime.call.incoming":
            client.realtime.calls.accept(event.data.call_id, type="realtime")

    app.handler = handler
    phone = Phone(uri=_uri(sip_server), max_s=8)
    phone.wait_for(_confirmed(0), 20)
    children = _sip_children(sip_server)
    assert len(children) == 1
    os.kill(children[0], signal.SIGKILL)  # PJSIP dies mid-call
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not _sip_children(sip_server) or _sip_children(sip_server) == children
                                           or sip_server.logs().count("SIP listening") < 2):
        time.sleep(0.2)
    logs = sip_server.logs()
    assert "exited with code -9" in logs and "1 call(s) ended; restarting" in logs
    assert "reason=sip_stack" in logs  # the call's session ended and freed its slot
    phone.finish(20)
    again = Phone(uri=_uri(sip_server), actions=[{"at": 1.0, "hangup": True}], max_s=20)
    events = again.finish(30)
    assert ("CONFIRMED", 200) in Phone.states_of(events), events
    assert sip_server.metric("kame_sip_stack_restarts_total", "", _auth()) == 1
