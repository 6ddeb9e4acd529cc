"""WebRTC in real networks: a call relayed through a real TURN server (Debian's coturn) on loopback, and the
ICE set-up from the config (TURN credentials, the relay-only policy, a 1:1 NAT's public address).

kame is configured with ``webrtc_ice_transport_policy: relay`` and coturn as its TURN server (long-term
credentials): its answer offers nothing but a relay candidate in coturn's relay port range, so every RTP
and data-channel packet of the call goes through coturn, and the call still speaks and hears. The
password never appears in kame's log.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from kame.server.config import ServerConfig
from kame.server.webrtc.ice import rtc_configuration, with_public_address
from tests.support.moshi_client import ServerProcess
from tests.support.servers import OPENAI_TOKEN
from tests.support.speech import synthesize
from tests.support.turn import RELAY_PORTS, TURN_PASSWORD, TURN_USER, Turn
from tests.support.webrtc_peer import SpeechTrack, start_call


@pytest.fixture(scope="module")
def server(openai_server: ServerProcess) -> ServerProcess:
    """tests/support/servers.py ``OPENAI``: ``webrtc_ice_transport_policy: relay`` with ``coturn`` as its TURN
    server (long-term credentials); Whisper, a token."""
    return openai_server


def test_a_call_relayed_through_coturn(server: ServerProcess, coturn: Turn) -> None:
    question = synthesize("What is the capital of France?")

    async def main() -> tuple[Any, str]:
        import soxr

        pcm48 = soxr.resample(question, 24000, 48000).astype(np.float32)
        track = SpeechTrack(np.concatenate([np.zeros(24000, np.float32), pcm48]))
        call = await start_call(server.http_url, token=OPENAI_TOKEN, track=track)
        answer = call.pc.remoteDescription.sdp
        try:
            await asyncio.wait_for(call.opened.wait(), 20)
            await call.wait_for(lambda e: e["type"] == "session.created", 15)
            final = await call.wait_for(
                lambda e: e["type"] == "conversation.item.input_audio_transcription.completed", 60)
            await call.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", 40)
            return (call, final), answer
        finally:
            await call.close()

    (call, final), answer = asyncio.run(main())
    candidates = [line for line in answer.splitlines() if line.startswith("a=candidate:")]
    assert candidates, answer
    # kame offered nothing but coturn's relay: every packet of the call went through it
    assert all(" typ relay " in c for c in candidates), candidates
    ports = [int(c.split()[5]) for c in candidates]
    assert all(RELAY_PORTS[0] <= p <= RELAY_PORTS[1] for p in ports), ports
    # "capital", not "france": over WebRTC tiny.en hears "... of France" as "... and friends" now and then
    assert "capital" in final["transcript"].lower()
    pcm = call.pcm()
    assert len(pcm) > 48000 * 2 and float(np.sqrt(np.mean(pcm**2))) > 1e-3, "the assistant's audio, relayed"
    turn_log = coturn.log.read_text()
    assert re.search(rf"user <{TURN_USER}>", turn_log) and "ALLOCATE processed, success" in turn_log, turn_log[-3000:]
    assert TURN_PASSWORD not in server.log_path.read_text()


# --------------------------------------------------------------------------- the config, without a server

ANSWER = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    "a=candidate:abc 1 udp 2130706431 10.0.0.5 40001 typ host\r\n"
    "a=candidate:def 1 udp 2130706431 fd00::5 40002 typ host\r\n"
    "a=candidate:ghi 1 udp 16777215 192.0.2.9 49152 typ relay raddr 10.0.0.5 rport 40003\r\n"
    "a=end-of-candidates\r\n"
)


def test_public_address_adds_each_host_port_at_the_nat_address() -> None:
    out = with_public_address(ANSWER, "203.0.113.7")
    added = [line for line in out.splitlines() if "203.0.113.7" in line]
    assert added == ["a=candidate:abcn 1 udp 1694498815 203.0.113.7 40001 typ srflx raddr 10.0.0.5 rport 40001"]
    assert all(line in out.splitlines() for line in ANSWER.splitlines())  # nothing removed
    v6 = with_public_address(ANSWER, "2001:db8::7")
    assert [line for line in v6.splitlines() if "2001:db8::7" in line] == [
        "a=candidate:defn 1 udp 1694498815 2001:db8::7 40002 typ srflx raddr fd00::5 rport 40002"]
    with pytest.raises(ValidationError, match="must be an IP address"):
        ServerConfig(webrtc_public_address="kame.example.com")


def test_ice_servers_from_the_config() -> None:
    cfg = ServerConfig.model_validate({
        "webrtc_ice_servers": ["stun:stun.example:3478",
                               {"urls": ["turn:turn.example:3478", "turns:turn.example:5349"],
                                "username": "u", "credential": "p"}],
        "webrtc_ice_transport_policy": "relay",
    })
    rtc = rtc_configuration(cfg)
    assert [s.urls for s in rtc.iceServers] == ["stun:stun.example:3478", ["turn:turn.example:3478", "turns:turn.example:5349"]]
    assert (rtc.iceServers[1].username, rtc.iceServers[1].credential) == ("u", "p")
    assert rtc.iceTransportPolicy.value == "relay"
    assert "'p'" not in repr(cfg) and str(cfg.webrtc_ice_servers[1].credential) == "**********"  # type: ignore[union-attr]
    assert rtc_configuration(ServerConfig()).iceServers is None
