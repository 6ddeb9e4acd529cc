"""torch.compile as a GPU box runs it, on CPU: inductor (g++ with OpenMP) builds moshi's kernels at warm-up.

The main suite never compiles (``NO_TORCH_COMPILE=1``, ``frontend.compile: auto`` on CPU). Here one server
runs with ``frontend.compile: on`` and ``NO_TORCH_COMPILE`` unset through a real session, and a warm-up
whose compiler is missing falls back to eager with one log line.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from kame.client.realtime_client import RealtimeClient
from tests.support.moshi_client import ServerProcess

START_S = 170.0  #: inductor's first C++ build on a loaded 2-core machine


def _built_kernels(cache: Path) -> list[Path]:
    """Shared objects inductor compiled into its cache (one per C++ kernel)."""
    return sorted(cache.rglob("*.so"))


def test_compiled_engine_serves_a_session(tmp_path: Path, kame_cache_dir: Path) -> None:
    cache = tmp_path / "inductor"
    server = ServerProcess(
        cache_dir=kame_cache_dir,
        log_path=tmp_path / "server.log",
        env={
            "KAME_FRONTEND__COMPILE": "on",
            "KAME_FRONTEND__BATCH_SIZE": "1",
            "KAME_ASR__KIND": "none",
            "TORCHINDUCTOR_CACHE_DIR": str(cache),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",  # no pool of compile workers on two cores
        },
        label="compiled",
    )
    server.env.pop("NO_TORCH_COMPILE", None)
    server.start(timeout=START_S)
    try:
        status, health = server.get_json("/health")
        assert status == 200, health
        engine = health["engine"]
        assert engine["device"] == "cpu" and engine["batch_size"] == 1 and engine["dtype"] == "float32"
        assert engine["compile"] is True and engine["cuda_graphs"] is False
        assert engine["compiled_graphs"] >= 1, engine  # dynamo built graphs in the server process
        assert _built_kernels(cache), "inductor built no kernel"
        assert "compile on" in server.logs() and "torch.compile failed" not in server.logs()

        async def session() -> RealtimeClient:
            client = await RealtimeClient.connect(server.http_url.replace("http", "ws") + "/v1/realtime")
            assert await client.wait_for_type("session.created", 30)
            rng = np.random.default_rng(0)
            await client.send_pcm((0.2 * rng.standard_normal(24000 * 2)).astype(np.float32))
            await client.drain_output(1.5)
            await client.close()
            return client

        client = asyncio.run(session())
        assert not client.errors
        assert client.stats.audio_received_s > 1.5
        after = server.get_json("/health")[1]["engine"]
        assert after["compile"] is True
        assert after["compiled_graphs"] == engine["compiled_graphs"], "the first session compiled again"
    finally:
        server.stop()


def test_compile_failure_at_warm_up_runs_eager(
    tmp_path: Path, tiny_kame_ckpt: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No working C++ compiler: one warning naming the cause, the engine runs eager and serves."""
    import torch._inductor.config as inductor_config

    from kame.frontend.config import FrontendConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.warmup import warm_up_engine

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # nothing cached to fall back on
    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, str(tmp_path / "no-such-g++")))
    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2, compile="on")
    core = EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
    assert core.mode.compile
    caplog.set_level(logging.INFO)
    try:
        warm_up_engine(core, 2)
    finally:
        torch._dynamo.reset()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert message.startswith("torch.compile failed at warm-up, running eager:") and "\n" not in message
    assert "no-such-g++" in message, message  # the cause, named
    assert not core.mode.compile
    core.attach(0)
    out = core.tick({0: np.zeros(core.frame_size, np.float32)})
    assert out[0].step == 0
