"""The paths a GPU takes, checked on CPU without compiling: the compile setting, one thread at a time in
moshi, the shared STT warmed up, the separate STT stepping once per frame period."""

from __future__ import annotations

import importlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from kame.asr.config import AsrConfig
from kame.asr.kyutai_core import SttCore
from kame.asr.stt_pacing import wait_before_step
from kame.audio.media import FRAME_S, FRAME_SIZE
from kame.frontend.config import FrontendConfig, SamplingConfig
from kame.frontend.moshi_gate import _KERNELS, MoshiMode, compiled_graphs, make_kernels_compilable, moshi_call, resolve_compile


@pytest.fixture(scope="module")
def stt_ckpt(kame_cache_dir: Path) -> Path:
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0, stt=True)


def test_compile_setting_resolves_per_device() -> None:
    assert resolve_compile("auto", "cuda") and not resolve_compile("auto", "cpu")
    assert resolve_compile("on", "cpu") and not resolve_compile("off", "cuda")
    # YAML 1.1 reads a bare on/off as a boolean: it still means the setting
    assert FrontendConfig.model_validate(yaml.safe_load("compile: on")).compile == "on"
    assert FrontendConfig.model_validate(yaml.safe_load("compile: off")).compile == "off"
    with pytest.raises(ValueError):
        FrontendConfig(compile="sometimes")  # type: ignore[arg-type]


def test_kernels_imported_without_compile_become_compilable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite imports moshi with NO_TORCH_COMPILE=1: its kernels are plain functions; the setting wraps
    them with moshi's lazy compiler, which compiles only when a call's mode asks for it."""
    assert os.environ.get("NO_TORCH_COMPILE") == "1"
    raw = {}
    for module_name, name in _KERNELS:
        module = importlib.import_module(module_name)
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after this test
        raw[module_name] = getattr(module, name)
        assert not hasattr(raw[module_name], "__wrapped__")
    assert make_kernels_compilable() == len(_KERNELS)
    assert make_kernels_compilable() == 0  # idempotent
    assert os.environ.get("NO_TORCH_COMPILE") == "1"
    for module_name, name in _KERNELS:
        assert getattr(importlib.import_module(module_name), name).__wrapped__ is raw[module_name]
    rms = importlib.import_module("moshi.modules.transformer")._rms_norm
    x, alpha = torch.randn(2, 1, 8), torch.ones(1, 1, 8)
    before = compiled_graphs()
    with moshi_call(MoshiMode(compile=False)):
        assert torch.allclose(rms(x, alpha, torch.float32, 1e-5), raw["moshi.modules.transformer"](x, alpha, torch.float32, 1e-5))
    assert compiled_graphs() == before  # off: the wrapper ran the plain function


def test_moshi_call_sets_and_restores_moshis_switches() -> None:
    from moshi.utils import compile as mc

    saved = (mc._compile_disabled, mc._disable_cuda_graph)
    with moshi_call(MoshiMode(compile=True, cuda_graphs=False)):
        assert (mc._compile_disabled, mc._disable_cuda_graph) == (False, True)
        with moshi_call(MoshiMode(compile=False, cuda_graphs=True)):  # re-entrant (engine tick -> shared STT)
            assert (mc._compile_disabled, mc._disable_cuda_graph) == (True, False)
        assert (mc._compile_disabled, mc._disable_cuda_graph) == (False, True)
    assert (mc._compile_disabled, mc._disable_cuda_graph) == saved


def _offsets(gen: Any) -> list[int]:
    """Steps each slot of an LMGen has taken since its last reset (moshi's streaming state)."""
    return [int(x) for x in gen._streaming_state.offsets.tolist()]


def test_warm_up_steps_the_shared_stt(stt_ckpt: Path, tiny_kame_ckpt: Path) -> None:
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.warmup import warm_up_engine

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2, cuda_graphs=False)
    stt = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 2, own_mimi=False)
    core = EngineCore(load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32), cfg, stt=stt)
    assert stt.mode == core.mode == MoshiMode(compile=False, cuda_graphs=False)  # the engine's settings
    assert _offsets(stt.gen) == [0, 0]
    warm_up_engine(core, 3)
    # 3 ticks of both slots, then slot 0, both, slot 1, both (each exec mask set more than once)
    assert _offsets(stt.gen) == [6, 6] and _offsets(core.lm_gen) == [6, 6]
    assert core.attached_slots() == []


def test_separate_stt_is_warmed_up_before_its_thread_runs(stt_ckpt: Path) -> None:
    from kame.asr.kyutai_recognizer import KyutaiRecognizer

    rec = KyutaiRecognizer(AsrConfig(kind="kyutai", model=str(stt_ckpt), device="cpu"), batch_size=2,
                           mode=MoshiMode(compile=False, cuda_graphs=False), warmup_steps=2)
    try:
        assert _offsets(rec.core.gen) == [2, 2] and rec.steps == 0
        assert rec.core.mode.cuda_graphs is False
    finally:
        rec.close()


def test_pacing_steps_once_a_period_unless_a_slot_is_behind() -> None:
    assert wait_before_step(10.0, 9.99, []) is None
    assert wait_before_step(10.0, 9.99, [0, 0]) is None
    assert wait_before_step(10.0, None, [1, 0]) == 0.0  # the first frame ever: at once
    assert wait_before_step(10.0, 9.99, [1, 1]) == pytest.approx(FRAME_S - 0.01)
    assert wait_before_step(10.0, 10.0 - FRAME_S - 0.005, [1, 0]) == 0.0  # the period is over
    assert wait_before_step(10.0, 9.99, [1, 2]) == 0.0  # a backlog: catch up now


def test_separate_stt_steps_once_per_period_for_eight_sessions(stt_ckpt: Path) -> None:
    """8 sessions whose frames arrive at 8 phases of the 80 ms period: ~12.5 batched steps a second (one per
    arrival would be 100), and every frame fed is stepped."""
    from kame.asr.kyutai_recognizer import KyutaiRecognizer

    rec = KyutaiRecognizer(AsrConfig(kind="kyutai", model=str(stt_ckpt), device="cpu"), batch_size=8)
    stepped: list[int] = []
    step_pcm = rec.core.step_pcm

    def counting(frames: Any) -> Any:
        stepped.append(len(frames))
        return step_pcm(frames)

    rec.core.step_pcm = counting  # type: ignore[method-assign]
    try:
        streams = [rec.open_stream() for _ in range(8)]
        rng = np.random.default_rng(0)
        periods = 15
        t0 = time.monotonic() + 0.05
        for p in range(periods):
            for i, s in enumerate(streams):
                delay = t0 + (p + i / 8) * FRAME_S - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                s.feed((0.1 * rng.standard_normal(FRAME_SIZE)).astype(np.float32))
        deadline = time.monotonic() + 5
        while sum(stepped) < 8 * periods and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sum(stepped) == 8 * periods  # no frame lost
        # the prefix of this tiny STT is empty: the steps come once per period, a few more where a late frame
        # made a backlog to catch up (a step per arrival: 3-8 times as many, each with 1-2 frames)
        assert len(stepped) <= 1.5 * periods, f"{len(stepped)} steps for {periods} periods: {stepped}"
        assert np.mean(stepped) >= 5
        for s in streams:
            s.close()
    finally:
        rec.close()


def test_engine_and_separate_stt_are_never_inside_moshi_at_once(
    stt_ckpt: Path, tiny_kame_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine (this thread) and a separate Kyutai STT (its own thread) both step: every call through moshi's
    graph machinery (``CUDAGraphed``: the LMs' and Mimi's steps, on CPU too) is alone."""
    from moshi.utils.compile import CUDAGraphed

    from kame.asr.kyutai_recognizer import KyutaiRecognizer
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    inside: set[int] = set()
    overlaps: list[set[int]] = []
    callers: set[str] = set()
    guard = threading.Lock()
    call = CUDAGraphed.__call__

    def watched(self: Any, *args: Any, **kwargs: Any) -> Any:
        me = threading.get_ident()
        with guard:
            if inside - {me}:
                overlaps.append(set(inside))
            inside.add(me)
            callers.add(threading.current_thread().name)
        try:
            time.sleep(0.001)  # widen the window another thread would have to enter
            return call(self, *args, **kwargs)
        finally:
            with guard:
                inside.discard(me)

    monkeypatch.setattr(CUDAGraphed, "__call__", watched)
    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2, sampling=SamplingConfig(use_sampling=False))
    core = EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
    rec = KyutaiRecognizer(AsrConfig(kind="kyutai", model=str(stt_ckpt), device="cpu"), batch_size=2)
    try:
        core.attach(0)
        streams = [rec.open_stream(), rec.open_stream()]
        rng = np.random.default_rng(1)
        for s in streams:
            s.feed((0.1 * rng.standard_normal(FRAME_SIZE * 15)).astype(np.float32))  # a backlog: steps at once
        for _ in range(15):
            core.tick({0: (0.1 * rng.standard_normal(FRAME_SIZE)).astype(np.float32)})
        for s in streams:
            s.close()
            assert s.join(30)
    finally:
        rec.close()
    assert "kame-kyutai-stt" in callers and len(callers) == 2
    assert not overlaps, f"{len(overlaps)} calls entered moshi while another thread was inside"


# ---------------------------------------------------------------- every moshi call inside the gate


@pytest.fixture
def gate_checked() -> Any:
    from kame.frontend.moshi_gate import install_gate_check, remove_gate_check

    assert install_gate_check()
    try:
        yield
    finally:
        remove_gate_check()


def test_the_gate_check_catches_a_call_outside_the_gate(gate_checked: None, tiny_kame_ckpt: Path) -> None:
    from kame.frontend.loading import load_mimi
    from kame.frontend.models import load_frontend
    from kame.frontend.moshi_gate import GateNotHeld

    models = load_frontend(FrontendConfig(checkpoint=str(tiny_kame_ckpt)), torch.device("cpu"))
    mimi = load_mimi(models.files, torch.device("cpu"), 8)
    silence = torch.zeros(1, 1, 1920)
    with pytest.raises(GateNotHeld, match="MimiModel.encode called outside kame's moshi gate"):
        with torch.no_grad():
            mimi.encode(silence)
    with moshi_call(MoshiMode()), torch.no_grad():
        assert mimi.encode(silence).shape == (1, 8, 1)
    from moshi.modules import transformer

    with pytest.raises(GateNotHeld, match="kernel _rms_norm"):  # moshi's kernels are checked too
        transformer._rms_norm(torch.ones(1, 4), torch.ones(4), 1e-5)


def test_wav_voice_and_sessions_step_moshi_only_inside_the_gate(
    gate_checked: None, tiny_personaplex_ckpt: Path, tmp_path: Path
) -> None:
    """A PersonaPlex checkpoint with an operator's WAV voice served by the engine thread (the voice's Mimi pass
    in the engine thread, as the server does, and from this thread, as ``kame run`` does)."""
    import shutil
    import threading as th

    from kame.audio.files import write_wav
    from kame.frontend.engine import EngineCore
    from kame.frontend.engine_thread import EngineThread, PromptRequest
    from kame.frontend.models import load_frontend
    from kame.frontend.warmup import warm_up_engine
    from tests.support.personaplex_tiny import voice_pcm

    ckpt = tmp_path / "pp"
    shutil.copytree(tiny_personaplex_ckpt, ckpt)
    write_wav(ckpt / "voices" / "MINE.wav", voice_pcm(5, seconds=0.3))
    cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=2)
    models = load_frontend(cfg, torch.device("cpu"))
    core = EngineCore(models, cfg)
    warm_up_engine(core, 2)  # encodes the wav voice (and frees the Mimi it needed)
    assert models._wav_mimi is None and list(models._wav_codes_cache) == ["MINE"]
    models._wav_codes_cache.clear()
    plan = models.prompt_plan("MINE", "Talk.")  # this thread, as `kame run` does
    assert plan is not None and plan.embeddings is None and plan.voice_frames == 4
    models._wav_codes_cache.clear()  # the engine thread encodes it again below
    engine = EngineThread(core)
    got: list[Any] = []
    errors: list[str] = []
    ready = th.Event()
    engine.start()
    try:
        slot = engine.attach(got.append, errors.append, lambda s: ready.set(), prompt=PromptRequest("MINE", "Talk."))
        assert ready.wait(20), errors
        deadline = time.monotonic() + 30
        while core.prompting(slot) and time.monotonic() < deadline:
            time.sleep(0.02)
        for _ in range(4):
            engine.feed(slot, np.zeros(FRAME_SIZE, np.float32))
            time.sleep(FRAME_S)
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        engine.stop()
    assert errors == [] and engine.error is None, (errors, engine.error)
    assert len(got) >= 4 and models._wav_mimi is not None


def test_a_shared_stt_engine_steps_moshi_only_inside_the_gate(
    gate_checked: None, stt_ckpt: Path, tiny_kame_ckpt: Path
) -> None:
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.warmup import warm_up_engine

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2)
    stt = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 2, own_mimi=False)
    core = EngineCore(load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32), cfg, stt=stt)
    warm_up_engine(core, 2)
    core.attach(0)
    core.stt_attach(0)
    for _ in range(4):
        out = core.tick({0: np.zeros(FRAME_SIZE, np.float32)})
    assert out[0].stt is not None
    core.close()
