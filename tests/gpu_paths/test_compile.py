"""torch.compile as a GPU box runs it, on CPU: inductor (g++ with OpenMP) builds moshi's kernels at warm-up.

The main suite never compiles (``NO_TORCH_COMPILE=1``, ``frontend.compile: auto`` on CPU). Here one server
runs with ``frontend.compile: on`` and ``NO_TORCH_COMPILE`` unset through a real session, and a warm-up
whose compiler is missing falls back to eager with one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2, compile="on")
    core = EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
    assert core.mode.compile
    caplog.set_level(logging.INFO)
    try:
        with inductor_config.patch({"cpp.cxx": (None, str(tmp_path / "no-such-g++"))}):
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


def _greedy(ckpt: Path, batch: int, compile_setting: str, stt: Path | None = None) -> tuple[Any, Any]:
    from kame.asr.kyutai_core import SttCore
    from kame.frontend.config import FrontendConfig, SamplingConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=batch, compile=compile_setting,
                         sampling=SamplingConfig(use_sampling=False))
    core_stt = None
    if stt is not None:
        from kame.frontend.moshi_gate import MoshiMode

        core_stt = SttCore.from_spec(str(stt), torch.device("cpu"), batch, own_mimi=False,
                                     mode=MoshiMode(compile=compile_setting == "on"))
    models = load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32 if stt is not None else None)
    return EngineCore(models, cfg, stt=core_stt), models


def _session(core: Any, frames: int, stt: bool) -> list[tuple[Any, ...]]:
    core.attach(0)
    if stt:
        core.stt_attach(0)
    rng = np.random.default_rng(3)
    out = []
    for _ in range(frames):
        o = core.tick({0: (0.1 * rng.standard_normal(core.frame_size)).astype(np.float32)})[0]
        out.append((o.text_id, o.audio_codes, None if o.stt is None else o.stt.text_id))
    return out


@pytest.fixture
def every_kernel_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moshi's CPU switch off (its transformer layers turn compile off on CPU), and no C++ compiler: the first
    kernel any model call reaches fails to compile."""
    import torch._inductor.config as inductor_config
    from moshi.modules import transformer

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(transformer, "no_compile", contextlib.nullcontext)
    try:
        with inductor_config.patch({"cpp.cxx": (None, str(tmp_path / "no-such-g++"))}):
            yield
    finally:
        torch._dynamo.reset()


@pytest.fixture(scope="module")
def stt_prefix_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny STT with stt-2.6b-en's 1 s silence prefix (written before any kernel is made to compile)."""
    from kame.frontend.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("stt-prefix") / "ck", seed=0, stt=True, silence_prefix_s=1.0)


def test_a_compile_failure_at_load_with_a_silence_prefix_stt_runs_eager(
    tiny_kame_ckpt: Path, stt_prefix_ckpt: Path, every_kernel_compiles: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Kyutai's stt-2.6b-en has a silence prefix: its codes are the first Mimi call of a load, before any
    warm-up. A compile failure there: one log line, eager, the streaming state rebuilt; the session after
    it is the session an engine that never compiled gives (greedy, same input)."""
    from kame.frontend.warmup import warm_up_engine

    stt = stt_prefix_ckpt
    caplog.set_level(logging.INFO)
    core, _ = _greedy(tiny_kame_ckpt, 2, "on", stt)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("torch.compile failed at load, running eager:"), warnings
    assert "no-such-g++" in warnings[0] and "\n" not in warnings[0]
    assert not core.mode.compile and not core.stt.mode.compile and core.stt_lag_frames == 13
    warm_up_engine(core, 2)
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1  # no second line at warm-up
    got = _session(core, 8, stt=True)
    eager, _ = _greedy(tiny_kame_ckpt, 2, "off", stt)
    warm_up_engine(eager, 2)
    assert got == _session(eager, 8, stt=True)


def test_a_compile_failure_in_a_warm_up_step_rebuilds_the_streaming_state(
    tiny_kame_ckpt: Path, every_kernel_compiles: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The first warm-up tick fails inside the LM step, after Mimi encoded its frame: the rebuilt state is a
    fresh one (the next session equals an eager engine's), and the warning is the only one."""
    from kame.frontend.warmup import warm_up_engine

    caplog.set_level(logging.INFO)
    core, _ = _greedy(tiny_kame_ckpt, 2, "on")
    assert core.mode.compile  # no model call at load without an STT: nothing failed yet
    warm_up_engine(core, 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("torch.compile failed at warm-up, running eager:"), warnings
    assert not core.mode.compile
    got = _session(core, 8, stt=False)
    eager, _ = _greedy(tiny_kame_ckpt, 2, "off")
    warm_up_engine(eager, 2)
    assert got == _session(eager, 8, stt=False)
