"""The pure parts of WebRTC calls: the input clock (jitter buffer and concealment), the output buffer, ephemeral
keys, offer checks, the libopus codecs and the packet path around aiortc, and the RTP flavour of the Realtime
wire. No network, no torch."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest

from kame.backend.tools import ToolSpec
from kame.server.access.ephemeral import EphemeralKeyError, EphemeralKeys, signing_secret, ttl_seconds
from kame.server.runtime.wire import Outgoing, Reply
from kame.server.webrtc.clock import InputClock, OutputBuffer
from kame.server.webrtc.codec_worker import CodecWorker, codec_worker
from kame.server.webrtc.opus import OpusDecoder, OpusEncoder, OpusError
from kame.server.webrtc.sdp import OfferError, check_offer
from kame.server.webrtc.transport import EncodedAudio, PassThroughJitter, PreEncoded, WebRtcTransport
from kame.server.wires.realtime.rtp import RealtimeRtpWire
from kame.server.wires.realtime.settings import ServerInfo
from kame.session.events import AssistantFrame
from kame.session.settings import SessionSettings

F = 1920  # one 80 ms frame at 24 kHz
P = 480  # one 20 ms packet


def _ramp(start: int, n: int) -> np.ndarray:
    """Samples whose value is their position (scaled), so placement can be checked exactly."""
    return (np.arange(start, start + n, dtype=np.float32) / 1e6).astype(np.float32)


def test_packets_are_placed_by_timestamp_whatever_their_order() -> None:
    clock = InputClock(delay=0)
    order = [0, 2, 1, 3]  # one reordered pair
    for k in order:
        clock.push(k * P, _ramp(k * P, P))
    out = clock.take()
    assert np.allclose(out, _ramp(0, F))
    assert clock.stats.concealed == 0 and clock.stats.played == F


def test_a_lost_packet_is_concealed_and_the_clock_goes_on() -> None:
    clock = InputClock(delay=0)
    for k in (0, 1, 3):  # packet 2 never arrives
        clock.push(k * P, np.full(P, 0.5, np.float32))
    out = clock.take()
    assert clock.stats.concealed == P
    assert np.all(out[2 * P + 60 : 3 * P - 60] == 0.0)  # silence in the gap
    assert out[P] == pytest.approx(0.5) and out[3 * P + 100] == pytest.approx(0.5)
    assert abs(out[2 * P - 1]) < 0.05 and abs(out[3 * P]) < 0.05  # faded at the edges, no click
    # nothing arrives any more (DTX, a muted track): every tick still gets a frame
    for _ in range(5):
        assert len(clock.take()) == F
    assert clock.stats.concealed == P + 5 * F


def test_a_packet_later_than_what_was_played_is_dropped() -> None:
    clock = InputClock(delay=0)
    for k in (0, 2, 3):  # packet 1 is late: 2 and 3 are played before it comes
        clock.push(k * P, np.ones(P, np.float32))
    clock.take()
    clock.push(P, np.ones(P, np.float32))
    assert clock.stats.late_dropped == P and clock.stats.delay_raises == 0


def test_audio_after_a_stall_raises_the_delay_instead_of_being_dropped_then_the_delay_shrinks() -> None:
    clock = InputClock(delay=0, max_late=3 * F)
    clock.push(0, np.ones(P, np.float32))
    clock.take()  # 0..479 real, then the network stalls: 480..1919 concealed
    clock.take()  # and the next two frames too
    clock.take()
    # the stalled packets arrive in a burst, 4 frames' worth
    for k in range(1, 17):
        clock.push(k * P, np.full(P, 0.5, np.float32))
    assert clock.stats.late_dropped == 0 and clock.stats.delay_raises == 1
    out = clock.take()
    assert out[100] == pytest.approx(0.5)  # played, later
    for k in range(17, 60):  # the sender goes on at real time; the added latency is given back bit by bit
        clock.push(k * P, np.full(P, 0.5, np.float32))
        if k % 4 == 0:
            clock.take()
    assert clock.stats.overflow_dropped > 0
    beyond = InputClock(delay=0, max_late=P)
    beyond.push(0, np.ones(P, np.float32))
    beyond.take()
    beyond.take()
    beyond.push(P, np.ones(P, np.float32))  # later than max_late: dropped
    assert beyond.stats.late_dropped == P


def test_the_playout_delay_absorbs_jitter() -> None:
    clock = InputClock(delay=P)
    clock.push(0, np.ones(P, np.float32))  # the first packet anchors the timeline `delay` behind it
    out = clock.take()
    assert np.all(out[:P] == 0.0) and out[P + 100] == pytest.approx(1.0)


def test_a_timeline_jump_re_anchors() -> None:
    clock = InputClock(delay=0, max_ahead=24000)
    clock.push(0, np.ones(P, np.float32))
    clock.take()
    clock.push(10 * 24000, np.full(P, 0.5, np.float32))  # a new sender clock, 10 s ahead
    assert clock.stats.resyncs == 1
    out = clock.take()
    assert out[100] == pytest.approx(0.5)


def test_duplicates_keep_the_first_copy() -> None:
    clock = InputClock(delay=0)
    clock.push(0, np.full(F, 0.1, np.float32))
    clock.push(P, np.full(P, 0.9, np.float32))  # a retransmitted duplicate
    out = clock.take()
    assert np.allclose(out, 0.1)


def test_output_buffer_prefills_then_plays_continuously_and_is_bounded() -> None:
    buf = OutputBuffer(rtp_frame=P, prefill=2 * P, limit=4 * F)
    assert not buf.take().any()  # nothing yet: silence, RTP still flows
    buf.push(np.full(F, 0.5, np.float32))
    for _ in range(4):
        assert buf.take()[0] == pytest.approx(0.5)
    assert not buf.take().any()  # underrun: silence
    assert buf.stats.underruns == 1
    for _ in range(10):
        buf.push(np.full(F, 0.5, np.float32))
    assert buf.size <= 4 * F and buf.stats.overflow_dropped == 6 * F
    assert buf.clear() == 4 * F and buf.size == 0


def _tone(n: int, rate: int = 24000) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / rate) * 32767).astype(np.int16)


def test_libopus_codes_24_khz_mono_and_decodes_a_browsers_48_khz_packets_at_24_khz() -> None:
    encoder, decoder = OpusEncoder(24000, 1), OpusDecoder(24000, 1)
    packets = [encoder.encode(_tone(24000)[i:i + 960]) for i in range(0, 24000, 960)]
    assert 80 < np.mean([len(p) for p in packets]) < 220  # ~32 kbit/s in 40 ms packets
    pcm = np.concatenate([decoder.decode(p) for p in packets])
    assert len(pcm) == 24000 and pcm.dtype == np.float32
    assert abs(float(np.sqrt(np.mean(pcm[4800:] ** 2))) - 0.3 / np.sqrt(2)) < 0.05
    browser = OpusEncoder(48000, 1)  # what a browser sends: 20 ms at 48 kHz
    assert len(decoder.decode(browser.encode(_tone(960, 48000)))) == P
    with pytest.raises(OpusError):
        decoder.decode(b"\xff" * 3)


class _Packet:
    def __init__(self, payload_type: int, timestamp: int, data: bytes) -> None:
        self.payload_type, self.timestamp, self._data = payload_type, timestamp, data


def test_opus_packets_skip_aiortcs_decoder_thread_and_are_placed_across_the_timestamp_wrap() -> None:
    """The call's Opus goes to the transport's sink and is decoded by the codec thread, off the loop (no decoder
    thread of aiortc's); other payload types (G.711) still go to aiortc's decoder; RTP timestamps that wrap at
    2**32 stay one timeline."""

    async def main() -> None:
        from aiortc import RTCPeerConnection

        pc = RTCPeerConnection()
        transport = WebRtcTransport(pc, call_id="c", connect_timeout_s=5, input_delay_s=0)
        sender = type("Sender", (), {"_RTCRtpSender__encoder": None})()
        jitter = PassThroughJitter()
        answer = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96 0\r\na=rtpmap:96 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\n"
        assert transport.use_native_opus(sender, jitter, answer)
        assert isinstance(sender._RTCRtpSender__encoder, PreEncoded) and transport.output_track.encoder is not None
        browser = OpusEncoder(48000, 1)
        jobs_before = codec_worker().jobs_run
        first = (1 << 32) - 2 * 960  # the third packet's timestamp wraps to 0
        for k in range(8):
            assert jitter.add(_Packet(96, (first + k * 960) & 0xFFFFFFFF, browser.encode(_tone(960, 48000)))) == (
                False, None)
        pcmu = jitter.add(_Packet(0, 5, b"\x7f" * 160))[1]
        assert pcmu is not None and pcmu.data == b"\x7f" * 160
        deadline = time.monotonic() + 5
        while len(transport._decoded) < 8 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the codec thread decodes in batches
        worker = codec_worker()
        assert worker._thread is not None and worker._thread.ident != threading.get_ident()
        assert codec_worker().jobs_run >= jobs_before + 8
        frames = [transport.input_frame() for _ in range(2)]
        assert transport.clock.stats.concealed == 0 and transport.clock.stats.resyncs == 0
        assert all(float(np.sqrt(np.mean(f[480:] ** 2))) > 0.1 for f in frames)
        transport.output.push(np.full(F, 0.2, np.float32))
        packet = await transport.output_track.recv()
        assert isinstance(packet, EncodedAudio) and packet.timestamp == 0 and len(packet.payload) > 10
        assert PreEncoded().pack(packet) == ([packet.payload], 0)
        await pc.close()

    asyncio.run(main())


def test_the_codec_worker_runs_jobs_in_order_in_batches_off_the_loop() -> None:
    """Many jobs queued at once run in a few batches on one thread (not one wake-up each), in order; a failing
    job fails only its own future."""

    async def main() -> None:
        worker = CodecWorker(batch_s=0.02)
        ran: list[tuple[int, int]] = []

        def job(k: int) -> int:
            ran.append((k, threading.get_ident()))
            if k == 13:
                raise ValueError("corrupt packet")
            return k * k

        futures = [worker.run(job, k) for k in range(50)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert [k for k, _ in ran] == list(range(50))
        assert {t for _, t in ran} == {worker._thread.ident} != {threading.get_ident()}  # type: ignore[union-attr]
        assert results[12] == 144 and isinstance(results[13], ValueError) and results[49] == 49 * 49
        assert worker.batches <= 3  # 50 jobs queued within one batch window
        worker.submit(job, 13)  # a fire-and-forget job that fails is logged; the worker goes on
        assert await worker.run(job, 7) == 49

    asyncio.run(main())


def test_g711_calls_and_a_missing_libopus_keep_aiortcs_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        from aiortc import RTCPeerConnection

        from kame.server.webrtc import transport as module

        pc = RTCPeerConnection()
        transport = WebRtcTransport(pc, call_id="c", connect_timeout_s=5)
        sender = type("Sender", (), {"_RTCRtpSender__encoder": None})()
        jitter = PassThroughJitter()
        pcmu = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0 96\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:96 opus/48000/2\r\n"
        assert not transport.use_native_opus(sender, jitter, pcmu)
        monkeypatch.setattr(module, "libopus", lambda: None)
        assert not transport.use_native_opus(sender, jitter, pcmu.replace(" 0 96", " 96 0"))
        assert jitter.sink is None and sender._RTCRtpSender__encoder is None and transport.output_track.encoder is None
        assert jitter.add(_Packet(96, 0, b"x"))[1].data == b"x"  # to aiortc's decoder, as before
        await pc.close()

    asyncio.run(main())


def test_ephemeral_keys_expire_and_are_many_use() -> None:
    now = [1000.0]
    keys = EphemeralKeys(clock=lambda: now[0])
    key, grant = keys.mint(SessionSettings(backend="beta"), {"type": "realtime"}, 60)
    assert key.startswith("ek_") and grant.expires_at == 1060.0
    assert keys.lookup(key) is not None and keys.lookup(key) is not None  # any number of sessions
    assert keys.lookup("ek_unknown") is None and keys.lookup("sk-real") is None
    now[0] = 1060.0
    assert keys.lookup(key) is None


def test_a_key_opens_sessions_on_every_replica_sharing_the_secret_and_nowhere_else() -> None:
    """Keys are signed grants: a replica behind the same load balancer (the same auth_token, or the same
    ephemeral_key_secret) honours a key another one minted; a tampered key or another secret does not."""
    token = "sk-fleet-token"
    one, two = EphemeralKeys(signing_secret(None, token)), EphemeralKeys(signing_secret(None, token))
    other = EphemeralKeys(signing_secret("another-secret", token))
    settings = SessionSettings(backend="beta", instructions="Be brief.", mcp_servers=("clock",),
                               functions=(ToolSpec("get_weather", "Weather.", {"type": "object", "properties": {}}),))
    key, _ = one.mint(settings, {"type": "realtime", "instructions": "Be brief."}, 60)
    grant = two.lookup(key)
    assert grant is not None and grant.settings == settings and grant.session["instructions"] == "Be brief."
    assert other.lookup(key) is None
    body, mac = key.split(".")
    assert two.lookup(body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + mac) is None
    assert two.lookup(key + "x") is None and two.lookup("ek_" + "A" * 40) is None and two.lookup("ek_.") is None
    assert token not in key and "sk-" not in key  # the secret never travels
    assert signing_secret(None, None) != signing_secret(None, None)  # no token: random per process


def test_a_session_config_too_large_for_a_key_is_refused_in_one_sentence() -> None:
    import secrets

    huge = secrets.token_hex(60_000)  # incompressible
    with pytest.raises(EphemeralKeyError, match="too large"):
        EphemeralKeys().mint(SessionSettings(instructions=huge), {"instructions": huge}, 60)


def test_ttl_follows_openai() -> None:
    assert ttl_seconds(None) == 600
    assert ttl_seconds({"anchor": "created_at", "seconds": 10}) == 10
    for bad in ({"seconds": 9}, {"seconds": 7201}, {"seconds": "60"}, {"anchor": "now"}, 5):
        with pytest.raises(EphemeralKeyError):
            ttl_seconds(bad)


def test_a_grant_narrows_back_ends_and_mcp_servers_to_its_own() -> None:
    keys = EphemeralKeys()
    _, grant = keys.mint(SessionSettings(backend="beta", mcp_servers=("clock",)), {}, 60)
    info = ServerInfo(session_id="s", backends=("alpha", "beta"), default_backend="alpha",
                      mcp_servers=("clock", "files"), tools_backends=("alpha", "beta"))
    narrowed = grant.narrow(info)
    assert narrowed.backends == ("beta",) and narrowed.mcp_servers == ("clock",) and narrowed.tools_backends == ("beta",)
    _, default = keys.mint(SessionSettings(), {}, 60)
    assert default.narrow(info).backends == ("alpha",) and default.narrow(info).mcp_servers == ()


OFFER = ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\n"
         "a=rtpmap:111 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\n")


def test_offer_checks() -> None:
    check_offer(OFFER)
    for bad, word in (("", "no SDP"), ("hello", "v=0"), (OFFER.replace("m=audio 9", "m=video 9"), "audio"),
                      (OFFER.replace("opus", "G722").replace("PCMU", "G729"), "codec"),
                      (OFFER.replace("m=audio 9", "m=audio 0"), "audio")):
        with pytest.raises(OfferError, match=word):
            check_offer(bad)


def _frame(step: int, loud: bool, piece: str | None = None) -> AssistantFrame:
    pcm = np.full(F, 0.3 if loud else 0.0, np.float32)
    return AssistantFrame(step=step, pcm=pcm, text_id=5 if piece else 3, piece=piece, oracle_id=3)


def _events(outs: list[Outgoing]) -> list[dict[str, object]]:
    return [json.loads(o.data) for o in outs if o.data]


def test_the_rtp_wire_sends_pcm_not_deltas_and_frames_responses_with_the_output_buffer() -> None:
    wire = RealtimeRtpWire(ServerInfo(session_id="abcdef123456"), SessionSettings())
    outs = wire.frame(_frame(0, True, "\u2581Hi"), 0, True)
    assert outs[0].pcm is not None and outs[0].data == "" and outs[0].audio_index == 0
    types = [e["type"] for e in _events(outs)]
    assert "output_audio_buffer.started" in types and not [t for t in types if t.endswith("audio.delta")]
    assert types.index("output_audio_buffer.started") > types.index("response.created")
    outs = []
    for i in range(1, 15):
        outs += wire.frame(_frame(i, False), i, True)
    types = [e["type"] for e in _events(outs)]
    assert types.index("output_audio_buffer.stopped") > types.index("response.done")
    assert all(o.pcm is not None for o in outs if not o.data)


def test_output_audio_buffer_clear_withholds_the_rest_of_the_response() -> None:
    wire = RealtimeRtpWire(ServerInfo(session_id="abcdef123456"), SessionSettings())
    wire.frame(_frame(0, True, "\u2581Hi"), 0, True)
    commands = wire.decode({"type": "websocket.receive", "text": json.dumps({"type": "output_audio_buffer.clear"})}, 0.0)
    assert len(commands) == 1 and isinstance(commands[0], Reply)
    reply = commands[0].messages[0]
    assert reply.clear_audio and json.loads(reply.data)["type"] == "output_audio_buffer.cleared"
    outs = wire.frame(_frame(1, True), 1, True)
    assert outs[0].pcm is not None and not outs[0].pcm.any()  # the rest of that response is silence
    for i in range(2, 15):
        wire.frame(_frame(i, False), i, True)
    outs = wire.frame(_frame(20, True, "\u2581Again"), 20, True)  # the next response is heard again
    assert outs[0].pcm is not None and outs[0].pcm.any()


def test_appends_on_the_data_channel_get_an_error() -> None:
    wire = RealtimeRtpWire(ServerInfo(session_id="abcdef123456"), SessionSettings())
    commands = wire.decode({"type": "websocket.receive", "text": json.dumps(
        {"type": "input_audio_buffer.append", "audio": "AAAA"})}, 0.0)
    assert len(commands) == 1 and "RTP" in commands[0].message  # type: ignore[union-attr]


def test_the_consent_timeout_sets_aioices_check_interval() -> None:
    """aioice closes after 6 unanswered consent checks: the configured timeout spreads them (RFC 7675's
    30 s by default: a check every 5 s, aioice's own value)."""
    import aioice.ice

    from kame.server.config import ServerConfig
    from kame.server.webrtc.ice import rtc_configuration

    before = aioice.ice.CONSENT_INTERVAL
    try:
        rtc_configuration(ServerConfig(webrtc_consent_timeout_s=12))
        assert aioice.ice.CONSENT_INTERVAL * aioice.ice.CONSENT_FAILURES == pytest.approx(12)
        rtc_configuration(ServerConfig())
        assert aioice.ice.CONSENT_INTERVAL == pytest.approx(5)
    finally:
        aioice.ice.CONSENT_INTERVAL = before


def test_replicas_configured_alike_sign_alike() -> None:
    """The app's signing secret comes from the config: the same token (or ephemeral_key_secret) on two
    replicas signs alike, another one does not."""
    from kame.server.app.factory import _secret_of
    from kame.server.config import AppConfig

    def cfg(**server: str) -> AppConfig:
        return AppConfig.model_validate({"server": server})

    assert _secret_of(cfg(auth_token="t1")) == _secret_of(cfg(auth_token="t1")) != _secret_of(cfg(auth_token="t2"))
    assert _secret_of(cfg(auth_token="t1", ephemeral_key_secret="s")) == _secret_of(cfg(auth_token="t2", ephemeral_key_secret="s"))
    assert _secret_of(cfg()) != _secret_of(cfg())
