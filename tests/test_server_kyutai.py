"""The server with Kyutai STT sharing the front-end engine (tiny STT checkpoint on CPU)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from kame.client.realtime_client import RealtimeClient
from tests.support.moshi_client import ServerProcess

#: the real-time lane under xdist (tests/conftest.py): its own server process
pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, kame_cache_dir: Path):  # type: ignore[no-untyped-def]
    log = tmp_path_factory.mktemp("kyutai") / "server.log"
    proc = ServerProcess(cache_dir=kame_cache_dir, log_path=log,
                         env={"KAME_ASR__KIND": "kyutai", "KAME_ASR__MODEL": "tiny:0", "KAME_FRONTEND__BATCH_SIZE": "2"})
    proc.start()
    yield proc
    proc.stop()


def test_shared_kyutai_stt_serves_a_session(server: ServerProcess) -> None:
    log = server.log_path.read_text()
    assert "shares the front-end engine" in log
    assert "warm-up: 4 ticks of 2 slots with the shared STT" in log  # compiled and graphed before ready
    status, health = server.get_json("/health")
    assert status == 200 and health["status"] == "ok"

    async def session() -> RealtimeClient:
        client = await RealtimeClient.connect(server.http_url.replace("http", "ws") + "/v1/realtime")
        assert await client.wait_for_type("session.created", 30)
        rng = np.random.default_rng(0)
        await client.send_pcm((0.2 * rng.standard_normal(24000 * 3)).astype(np.float32))
        await client.drain_output(1.5)
        await client.close()
        return client

    client = asyncio.run(session())
    assert client.stats.audio_received_s > 2.5
    assert not client.errors
    # the tiny STT is random: it may or may not "hear" words, but its events flow through the session
    speech_events = client.of_type("input_audio_buffer.speech_started", "conversation.item.input_audio_transcription.delta")
    assert speech_events, "no ASR event came from the shared STT"
