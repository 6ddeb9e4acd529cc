"""Warm-up does what a session does, for every checkpoint family (kame/frontend/warmup.py).

moshi compiles and captures a CUDA graph on a module's second call; an exec mask's graph on its second
change. Counted here during warm-up, on CPU: the LM's steps, Mimi's encodes and decodes, the shared STT's
steps, each module's exec mask (set at least twice), and on PersonaPlex prompt steps beside conversations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from kame.frontend.config import FrontendConfig


@pytest.fixture(scope="module")
def stt_ckpt(kame_cache_dir: Path) -> Path:
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0, stt=True)


@contextmanager
def counting(core: Any) -> Iterator[Counter[str]]:
    """Counts the calls of each module a session steps, on this engine's own objects."""
    calls: Counter[str] = Counter()
    targets: list[tuple[str, Any, str]] = [
        ("lm step", core.lm_gen, "step"), ("lm exec mask", core.lm_gen, "set_exec_mask"),
        ("mimi encode", core.mimi, "encode"), ("mimi decode", core.mimi, "decode"),
        ("mimi exec mask", core.mimi, "set_exec_mask"),
    ]
    if core.stt is not None:
        targets += [("stt step", core.stt.gen, "step_with_extra_heads" if core.stt.eot_head is not None else "step"),
                    ("stt exec mask", core.stt.gen, "set_exec_mask")]

    def wrap(name: str, fun: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            calls[name] += 1
            return fun(*a, **k)

        return call

    for name, obj, attr in targets:
        setattr(obj, attr, wrap(name, getattr(obj, attr)))
    try:
        yield calls
    finally:
        for _, obj, attr in targets:
            obj.__dict__.pop(attr, None)


@pytest.mark.parametrize("family", ["kame+stt", "moshi", "personaplex"])
def test_warm_up_steps_every_module_a_session_steps(
    family: str, tiny_kame_ckpt: Path, tiny_moshi_ckpt: Path, tiny_personaplex_ckpt: Path, stt_ckpt: Path
) -> None:
    from kame.asr.kyutai_core import SttCore
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.warmup import warm_up_engine

    ckpt = {"kame+stt": tiny_kame_ckpt, "moshi": tiny_moshi_ckpt, "personaplex": tiny_personaplex_ckpt}[family]
    cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=3)
    stt = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 3, own_mimi=False) if family == "kame+stt" else None
    core = EngineCore(load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32 if stt else None), cfg, stt=stt)
    prompt_steps: list[int] = []
    if core.prompts is not None:
        real = core.prompts.before_step

        def before_step(cache: Any, stepped: Any) -> None:
            prompt_steps.append(sum(1 for s in stepped if core.prompting(s)))
            real(cache, stepped)

        core.prompts.before_step = before_step  # type: ignore[method-assign]
    with counting(core) as calls:
        warm_up_engine(core, 1)
    # every module called at least twice: compiled on the first call, its CUDA graph captured on the second
    for name in ("lm step", "mimi encode", "mimi decode"):
        assert calls[name] >= 2, (name, calls)
    # every exec mask changed at least twice (its graph too is captured on its second call)
    assert calls["lm exec mask"] >= 3 and calls["mimi exec mask"] >= 3, calls
    if family == "kame+stt":
        assert calls["stt step"] >= 2 and calls["stt exec mask"] >= 3, calls
    if family == "personaplex":
        assert sum(prompt_steps) >= 2, prompt_steps  # prompt steps beside slots hearing their frames
        assert calls["mimi encode"] >= 2  # not every warm-up tick is a prompt tick
    assert core.attached_slots() == []
    core.close()


def test_warm_up_encodes_wav_voices_so_a_session_runs_no_mimi_pass(
    tiny_personaplex_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from moshi.models.compression import MimiModel

    from kame.audio.files import write_wav
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.warmup import warm_up_engine
    from tests.support.personaplex_tiny import voice_pcm

    ckpt = tmp_path / "pp"
    shutil.copytree(tiny_personaplex_ckpt, ckpt)
    write_wav(ckpt / "voices" / "MINE.wav", voice_pcm(5, seconds=0.3))
    cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=1)
    models = load_frontend(cfg, torch.device("cpu"))
    core = EngineCore(models, cfg)
    warm_up_engine(core, 1)
    assert list(models._wav_codes_cache) == ["MINE"] and models._wav_mimi is None  # its Mimi freed
    encodes: list[int] = []
    real = MimiModel.encode
    monkeypatch.setattr(MimiModel, "encode", lambda self, x: encodes.append(1) or real(self, x))
    plan = models.prompt_plan("MINE", "Talk.")
    assert plan is not None and plan.voice_frames == 4 and encodes == []  # a session's attach: no Mimi pass
    core.close()
