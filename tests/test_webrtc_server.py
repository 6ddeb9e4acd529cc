"""``/v1/realtime/calls`` on the real CPU demo server (Whisper tiny.en, a scripted back-end), with aiortc as the
browser: the real ICE, DTLS, SCTP and RTP stacks on loopback.

A call speaks an espeak question over RTP and gets, on ``oai-events``, the same events a websocket client
gets (without audio deltas), the transcript of its question and the back-end's answer, plus
``output_audio_buffer.started``/``.stopped`` around each response; the assistant's audio comes back as RTP.
Ephemeral keys, both signaling flows (raw SDP and the ``openai`` SDK's multipart ``calls.create``), the
``client_secrets`` endpoint through the SDK, hangup, CORS, the sideband websocket and the faults (bad
offers, bad keys, ICE that never connects, lost packets, a muted microphone) run against the same server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from moshi_client import ServerProcess
from speech import synthesize
from webrtc_peer import SpeechTrack, start_call

TOKEN = "rtc-secret-77c1"
GOOD_ORIGIN = "http://good.example"
CONFIG = """
device: cpu
frontend:
  checkpoint: "tiny:0"
  batch_size: 2
asr:
  kind: whisper
  device: cpu
backends:
  alpha:
    kind: scripted
    scripted:
      rules: {}
      default_reply: "Alpha thinks about {user}."
      first_token_delay_s: 0.1
  beta:
    kind: scripted
    scripted:
      rules: {}
      default_reply: "Beta answers {user} now."
      first_token_delay_s: 0.1
default_backend: alpha
server:
  idle_timeout_s: 10
  webrtc_connect_timeout_s: 3
"""


@pytest.fixture(scope="module")
def server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("webrtc-server")
    config = tmp / "webrtc.yaml"
    config.write_text(CONFIG)
    srv = ServerProcess(
        cache_dir=kame_cache_dir,
        log_path=tmp / "server.log",
        config=str(config),
        env={"KAME_SERVER__AUTH_TOKEN": TOKEN, "KAME_SERVER__ALLOWED_ORIGINS": json.dumps([GOOD_ORIGIN])},
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def _mint(server: ServerProcess, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{server.http_url}/v1/realtime/client_secrets", json=body, headers=_auth())
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _wait_sessions(server: ServerProcess, active: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, health = server.get_json("/health")
        if health["sessions"]["active"] == active:
            return
        time.sleep(0.1)
    raise AssertionError(f"sessions never became {active}: {health['sessions']}")


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
            final = await call.wait_for(
                lambda e: e["type"] == "conversation.item.input_audio_transcription.completed", 40)
            answer = await call.wait_for(lambda e: e["type"] == "kame.backend.answer" or
                                         e["type"].startswith("kame.oracle"), 20)
            await call.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", 30)
            return call, created, final, answer
        finally:
            await call.close()

    call, created, final, answer = asyncio.run(main())
    assert created["session"]["kame"]["backend"] == "beta"  # the key's session is the starting one
    assert "france" in final["transcript"].lower()
    types = call.types()
    assert not [t for t in types if t.endswith("audio.delta")], "audio travels as RTP, not as deltas"
    started = [e for e in call.events if e["type"] == "output_audio_buffer.started"]
    stopped = [e for e in call.events if e["type"] == "output_audio_buffer.stopped"]
    assert started and stopped and stopped[0]["response_id"] == started[0]["response_id"]
    created_at = types.index("response.created")
    assert types.index("output_audio_buffer.started") > created_at
    pcm = call.pcm()
    assert len(pcm) > 48000 * 3, "the assistant's RTP audio flows continuously"
    assert float(np.sqrt(np.mean(pcm**2))) > 1e-3, "the assistant's audio is not silence"
    _wait_sessions(server, 0)


def _to48k(pcm24: np.ndarray) -> np.ndarray:
    import soxr

    return soxr.resample(np.asarray(pcm24, np.float32), 24000, 48000).astype(np.float32)
