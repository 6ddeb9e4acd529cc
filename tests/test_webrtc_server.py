"""``/v1/realtime/calls`` on the real CPU demo server (Whisper tiny.en, a scripted back-end), with aiortc as the
browser: the real ICE, DTLS, SCTP and RTP stacks on loopback.

A call speaks an espeak question over RTP and gets, on ``oai-events``, the same events a websocket client
gets (without audio deltas), the transcript of its question and the back-end's answer, plus
``output_audio_buffer.started``/``.stopped`` around each response; the assistant's audio comes back as RTP.
Ephemeral keys, both signaling flows (raw SDP and the ``openai`` SDK's multipart ``calls.create``), the
``client_secrets`` endpoint through the SDK, hangup, CORS, the sideband websocket and the faults (bad
offers, bad keys, ICE that never connects, lost packets, a muted microphone, a peer that vanishes without a
word) run against the same server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import websockets

from tests.support.moshi_client import ServerProcess
from tests.support.servers import GOOD_ORIGIN, SECURED_CONSENT_S, SECURED_IDLE_S, SECURED_TOKEN
from tests.support.speech import synthesize
from tests.support.webrtc_peer import SpeechTrack, start_call, wait_sessions

TOKEN = SECURED_TOKEN


@pytest.fixture(scope="module")
def server(secured_server: ServerProcess) -> Iterator[ServerProcess]:
    """The shared ``secured`` server (tests/support/servers.py): a token, an origin allow-list, two slots,
    a 4 s idle timeout, a 3 s ICE connect timeout."""
    yield secured_server


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def _mint(server: ServerProcess, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{server.http_url}/v1/realtime/client_secrets", json=body, headers=_auth())
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_a_call_with_an_ephemeral_key_speaks_and_hears_over_rtp(server: ServerProcess) -> None:
    secret = _mint(server, expires_after={"anchor": "created_at", "seconds": 60},
                   session={"type": "realtime", "kame": {"backend": "beta"}})
    assert secret["value"].startswith("ek_") and secret["expires_at"] > time.time() + 50
    assert secret["session"]["kame"]["backend"] == "beta"
    question = synthesize("What is the capital of France?")

    async def main() -> Any:
        track = SpeechTrack(np.concatenate([np.zeros(24000, np.float32), _to48k(question)]))
        call = await start_call(server.http_url, token=secret["value"], track=track)
        assert call.location is not None and call.location.startswith("/v1/realtime/calls/rtc_")
        try:
            await asyncio.wait_for(call.opened.wait(), 15)
            created = await call.wait_for(lambda e: e["type"] == "session.created", 15)
            # kame's own events are opt-in (issue 24): this test reads the oracle's
            call.send({"type": "session.update", "session": {"type": "realtime", "kame": {"events": True}}})
            final = await call.wait_for(
                lambda e: e["type"] == "conversation.item.input_audio_transcription.completed", 40)
            answer = await call.wait_for(lambda e: e["type"] == "kame.backend.answer" or
                                         e["type"].startswith("kame.oracle"), 20)
            await call.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", 30)
            return call, created, final, answer, track
        finally:
            await call.close()

    call, created, final, answer, track = asyncio.run(main())
    assert created["session"]["kame"]["backend"] == "beta"  # the key's session is the starting one
    # "capital", not "france": over WebRTC tiny.en hears "... of France" as "... and friends" now and then
    assert "capital" in final["transcript"].lower()
    types = call.types()
    assert not [t for t in types if t.endswith("audio.delta")], "audio travels as RTP, not as deltas"
    started = [e for e in call.events if e["type"] == "output_audio_buffer.started"]
    stopped = [e for e in call.events if e["type"] == "output_audio_buffer.stopped"]
    assert started and stopped and stopped[0]["response_id"] == started[0]["response_id"]
    created_at = types.index("response.created")
    assert types.index("output_audio_buffer.started") > created_at
    pcm = call.pcm()
    # the call can be over in 3.0 s of audio on an idle machine: what flows continuously is audio for the
    # whole call (its span of arrival), and at least the length of what was sent
    span = call.audio_t[-1] - call.audio_t[0]
    assert len(pcm) / 48000 >= max(0.8 * span, len(track.pcm) / 48000), ("the assistant's RTP audio flows continuously",
                                                                       len(pcm), span)
    assert float(np.sqrt(np.mean(pcm**2))) > 1e-3, "the assistant's audio is not silence"
    wait_sessions(server, 0)


def _to48k(pcm24: np.ndarray) -> np.ndarray:
    import soxr

    return soxr.resample(np.asarray(pcm24, np.float32), 24000, 48000).astype(np.float32)


def test_the_official_sdk_mints_a_key_and_creates_a_call_with_a_session(server: ServerProcess) -> None:
    from openai import AsyncOpenAI, OpenAI

    client = OpenAI(base_url=f"{server.http_url}/v1", api_key=TOKEN)
    secret = client.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 30},
        session={"type": "realtime", "instructions": "Be brief.", "kame": {"backend": "alpha"}},
    )
    assert secret.value.startswith("ek_") and secret.session.type == "realtime"
    with pytest.raises(Exception) as refused:  # minting needs the server's key, an ek_ key is not one
        OpenAI(base_url=f"{server.http_url}/v1", api_key=secret.value).realtime.client_secrets.create()
    assert getattr(refused.value, "status_code", None) == 401

    async def main() -> tuple[str, list[str], dict[str, Any]]:
        from aiortc import RTCPeerConnection, RTCSessionDescription

        pc = RTCPeerConnection()
        channel = pc.createDataChannel("oai-events")
        events: list[dict[str, Any]] = []
        channel.on("message", lambda m: events.append(json.loads(m)))
        pc.addTrack(SpeechTrack())
        await pc.setLocalDescription(await pc.createOffer())
        sdk = AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key=TOKEN)
        raw = await sdk.realtime.calls.with_raw_response.create(
            sdp=pc.localDescription.sdp, session={"type": "realtime", "kame": {"backend": "beta"}})
        assert raw.http_response.status_code == 201
        assert raw.headers["content-type"].startswith("application/sdp")
        location = raw.headers["location"]
        answer = raw.http_response.text
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        deadline = time.monotonic() + 15
        while not any(e["type"] == "session.created" for e in events) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        created = next(e for e in events if e["type"] == "session.created")
        # the trusted server joins the call's session as a sideband and steers it
        call_id = location.rsplit("/", 1)[-1]
        async with sdk.realtime.connect(call_id=call_id) as side:
            await side.session.update(session={"type": "realtime", "kame": {"backend": "alpha"}})
            async for event in side:
                if event.type == "session.updated":
                    break
        deadline = time.monotonic() + 5
        while not any(e["type"] == "session.updated" for e in events) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await sdk.realtime.calls.hangup(call_id)
        deadline = time.monotonic() + 5
        while pc.connectionState not in ("closed", "failed") and channel.readyState == "open" \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await pc.close()
        return location, [e["type"] for e in events], created

    hangups0 = server.metric("kame_sessions_ended_total", 'reason="hangup"', _auth())
    location, types, created = asyncio.run(main())
    assert location.startswith("/v1/realtime/calls/rtc_")
    assert created["session"]["kame"]["backend"] == "beta"  # the multipart session part
    assert "session.updated" in types  # the sideband's update reached the call's session
    wait_sessions(server, 0)
    assert server.metric("kame_sessions_ended_total", 'reason="hangup"', _auth()) >= hangups0 + 1


def test_an_ek_session_cannot_widen_the_back_end_and_works_on_the_websocket(server: ServerProcess) -> None:
    secret = _mint(server, session={"type": "realtime", "kame": {"backend": "beta"}})

    async def main() -> list[dict[str, Any]]:
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{secret['value']}"]) as ws:
            got = [json.loads(await ws.recv())]
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "kame": {"backend": "alpha"}}}))
            got.append(json.loads(await ws.recv()))
            return got

    created, refused = asyncio.run(main())
    assert created["type"] == "session.created" and created["session"]["kame"]["backend"] == "beta"
    assert refused["type"] == "error" and refused["error"]["code"] == "unknown_backend"
    wait_sessions(server, 0)


def test_bad_offers_and_keys_get_one_sentence_4xx(server: ServerProcess) -> None:
    url = f"{server.http_url}/v1/realtime/calls"
    sdp_headers = {"Content-Type": "application/sdp", "Accept": "application/sdp"}

    def post(body: str, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(url, content=body, headers={**sdp_headers, **headers})

    async def offer(audio: bool) -> str:
        from aiortc import RTCPeerConnection

        pc = RTCPeerConnection()
        pc.createDataChannel("oai-events")
        if audio:
            pc.addTransceiver("audio")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return str(sdp)

    no_audio = asyncio.run(offer(False))
    cases = {
        "no audio": (post(no_audio, _auth()), 400, "audio"),
        "not sdp": (post("hello", _auth()), 400, "v=0"),
        "garbage sdp": (post("v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n", _auth()), 400, "offer"),
        "unknown key": (post(asyncio.run(offer(True)), {"Authorization": "Bearer ek_nope"}), 401, "ephemeral key"),
        "no key": (post(asyncio.run(offer(True)), {}), 401, "key"),
        "foreign origin": (post(asyncio.run(offer(True)), {**_auth(), "Origin": "http://evil.example"}), 403, "origin"),
    }
    for name, (r, status, word) in cases.items():
        assert r.status_code == status, (name, r.status_code, r.text)
        message = r.json()["error"]["message"]
        assert word in message and message.count(". ") == 0 and message.endswith("."), (name, message)
    _, health = server.get_json("/health")
    assert health["sessions"]["active"] == 0


def test_cors_preflight_allows_the_origin_and_exposes_location(server: ServerProcess) -> None:
    r = httpx.options(f"{server.http_url}/v1/realtime/calls", headers={
        "Origin": GOOD_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == GOOD_ORIGIN
    assert "location" in r.headers["access-control-expose-headers"].lower()
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    bad = httpx.options(f"{server.http_url}/v1/realtime/calls", headers={"Origin": "http://evil.example"})
    assert bad.status_code == 403


def test_ice_that_never_connects_frees_the_slot_with_its_own_reason(server: ServerProcess) -> None:
    before = server.metric("kame_sessions_ended_total", 'reason="ice_timeout"', _auth())

    async def main() -> None:
        from aiortc import RTCPeerConnection

        pc = RTCPeerConnection()
        pc.createDataChannel("oai-events")
        pc.addTrack(SpeechTrack())
        await pc.setLocalDescription(await pc.createOffer())
        r = httpx.post(f"{server.http_url}/v1/realtime/calls", content=pc.localDescription.sdp,
                       headers={**_auth(), "Content-Type": "application/sdp"})
        assert r.status_code == 201
        await pc.close()  # the answer is never applied: ICE never completes
        wait_sessions(server, 1, 2)

    asyncio.run(main())
    wait_sessions(server, 0, 3 + 5)  # webrtc_connect_timeout_s is 3 here
    assert server.metric("kame_sessions_ended_total", 'reason="ice_timeout"', _auth()) == before + 1


def test_lost_packets_and_a_muted_microphone_never_stall_the_clock(server: ServerProcess) -> None:
    async def main() -> tuple[int, float]:
        # every 4th packet lost for 2 s, then nothing sent at all (a muted track / DTX)
        track = SpeechTrack(np.full(48000 * 2, 0.05, np.float32), drop=lambda n: n % 4 == 3, mute_after_s=2.0)
        call = await start_call(server.http_url, token=TOKEN, track=track)
        try:
            await asyncio.wait_for(call.opened.wait(), 15)
            await call.wait_for(lambda e: e["type"] == "session.created", 15)
            n0, t0 = len(call.pcm()), time.monotonic()
            await asyncio.sleep(6.0)  # past the idle timeout (4 s): a muted peer is not idle
            received = len(call.pcm()) - n0
            return received, time.monotonic() - t0
        finally:
            await call.close()

    concealed0 = server.metric("kame_webrtc_input_concealed_seconds_total", "", _auth())
    idle0 = server.metric("kame_sessions_ended_total", 'reason="idle"', _auth())
    received, seconds = asyncio.run(main())
    assert received >= 0.8 * seconds * 48000, "output RTP flows continuously"
    wait_sessions(server, 0)
    concealed = server.metric("kame_webrtc_input_concealed_seconds_total", "", _auth()) - concealed0
    assert concealed >= 3.0, concealed  # the muted stretch (and the lost packets) were filled on the server's clock
    assert server.metric("kame_sessions_ended_total", 'reason="idle"', _auth()) == idle0


def test_a_vanished_peer_is_not_idle_and_its_session_ends_when_ice_consent_fails(server: ServerProcess) -> None:
    """A peer that disappears without a word keeps its session past the idle timeout (its input is concealed
    on the server's clock, as a muted one's), until the server's ICE consent checks go unanswered
    (aioice gives up after 6 misses, one every sixth of ``webrtc_consent_timeout_s``: 12 s on this server,
    30 s by default); then the session ends as ``client_closed`` and the slot is free."""
    wait_sessions(server, 0)
    closed0 = server.metric("kame_sessions_ended_total", 'reason="client_closed"', _auth())
    idle0 = server.metric("kame_sessions_ended_total", 'reason="idle"', _auth())

    async def main() -> tuple[int, float]:
        call = await start_call(server.http_url, token=TOKEN, track=SpeechTrack(np.zeros(48000 * 2, np.float32)))
        try:
            await asyncio.wait_for(call.opened.wait(), 15)
            await call.wait_for(lambda e: e["type"] == "session.created", 15)
            await asyncio.sleep(1.0)
            call.vanish()
            t0 = time.monotonic()
            await asyncio.sleep(SECURED_IDLE_S + 2.0)
            active_after_idle = (await asyncio.to_thread(server.get_json, "/health"))[1]["sessions"]["active"]
            await asyncio.to_thread(wait_sessions, server, 0, 60.0)
            return active_after_idle, time.monotonic() - t0
        finally:
            with contextlib.suppress(Exception):
                await call.close()

    active_after_idle, gone_after = asyncio.run(main())
    print(f"webrtc: a vanished peer's session ended {gone_after:.1f} s after it went (ICE consent)")
    assert active_after_idle == 1  # past the idle timeout: a silent peer is not idle
    assert gone_after < SECURED_CONSENT_S + 15, gone_after  # consent: 6 unanswered checks ~2 s apart, then the close
    assert server.metric("kame_sessions_ended_total", 'reason="client_closed"', _auth()) - closed0 == 1
    assert server.metric("kame_sessions_ended_total", 'reason="idle"', _auth()) == idle0


def test_the_sideband_and_hangup_need_the_servers_key_and_a_live_call(server: ServerProcess) -> None:
    secret = _mint(server)

    async def sideband(key: str, call_id: str) -> tuple[Any, Any]:
        url = f"ws://127.0.0.1:{server.port}/v1/realtime?call_id={call_id}"
        async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{key}"]) as ws:
            first = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
            return first, closed.value.rcvd

    first, close = asyncio.run(sideband(secret["value"], "rtc_000000000000"))
    assert first["type"] == "error" and "server's API key" in first["error"]["message"] and close.code == 1008
    first, close = asyncio.run(sideband(TOKEN, "rtc_000000000000"))
    assert first["type"] == "error" and "no such call" in first["error"]["message"] and close.code == 1008
    r = httpx.post(f"{server.http_url}/v1/realtime/calls/rtc_000000000000/hangup", headers=_auth())
    assert r.status_code == 404 and r.json()["error"]["message"].endswith(".")
    r = httpx.post(f"{server.http_url}/v1/realtime/calls/rtc_000000000000/hangup",
                   headers={"Authorization": f"Bearer {secret['value']}"})
    assert r.status_code == 401  # an ek_ key hangs up only its own calls
    r = httpx.post(f"{server.http_url}/v1/realtime/calls/rtc_000000000000/accept", headers=_auth())
    assert r.status_code == 404 and "SIP" in r.json()["error"]["message"]


def test_calls_take_the_same_slots_as_websockets(server: ServerProcess) -> None:
    async def main() -> tuple[Any, Any, Any]:
        calls = [await start_call(server.http_url, token=TOKEN) for _ in range(2)]  # batch_size is 2
        try:
            for call in calls:
                await call.wait_for(lambda e: e["type"] == "session.created", 15)
            third = await start_call(server.http_url, token=TOKEN, raise_for_status=False)
            url = f"ws://127.0.0.1:{server.port}/v1/realtime"
            async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await ws.recv()
            return third.answer_status, third.location, closed.value.rcvd
        finally:
            for call in calls:
                await call.close()

    status, body, refused = asyncio.run(main())
    assert status == 503 and "full" in str(body)
    assert refused.code == 1013 and "full" in refused.reason  # the websocket is refused too: the calls hold the slots
    wait_sessions(server, 0)
