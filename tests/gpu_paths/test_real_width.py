"""The released width in the suite: moshi 7B's shapes at one main and one depformer layer (0.8 B parameters,
plus KAME's oracle table), a float32 file in Kyutai's fused release layout loaded as bf16, ticked by the
engine at batch 2 with an oracle.

The checkpoint (3.7 GB) is generated once and cached outside the checkout (tests/support/real_width.py);
the module-scoped fixture loads it once per run.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.real_width import ensure_real_width_checkpoint

GIB = 1024**3


@dataclass
class Loaded:
    ckpt: Path
    models: Any
    generate_s: float
    load_s: float
    load_rss_growth: int  # bytes the peak RSS grew while loading


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture(scope="module")
def real_width() -> Iterator[Loaded]:
    from kame.frontend.config import FrontendConfig
    from kame.frontend.models import load_frontend

    t0 = time.monotonic()
    ckpt = ensure_real_width_checkpoint()
    generated = time.monotonic() - t0
    before = _peak_rss()
    t0 = time.monotonic()
    models = load_frontend(FrontendConfig(checkpoint=str(ckpt), dtype="bfloat16", batch_size=2), torch.device("cpu"))
    loaded = time.monotonic() - t0
    print(f"\nreal width: checkpoint ready in {generated:.1f} s, loaded as bf16 in {loaded:.1f} s, "
          f"peak RSS +{(_peak_rss() - before) / GIB:.2f} GiB")
    yield Loaded(ckpt, models, generated, loaded, _peak_rss() - before)


def test_fp32_release_file_loads_as_bf16_without_holding_it_whole(real_width: Loaded) -> None:
    from safetensors import safe_open

    lm = real_width.models.lm
    file = real_width.ckpt / "model.safetensors"
    assert file.stat().st_size > 3.5e9  # float32: 0.93 B values
    params = sum(p.numel() for p in lm.parameters())
    assert 0.79e9 < params < 0.81e9  # moshi's LM at one layer each (the oracle table is held apart)
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16}
    assert real_width.models.has_oracle
    with safe_open(str(file), framework="pt") as f:
        fused = f.get_tensor("depformer.layers.0.self_attn.in_proj_weight")  # 8 steps of weights, fused
        oracle = f.get_tensor("oracle_emb.weight")
    steps = fused.view(8, -1, fused.shape[1])
    for i in (0, 7):
        assert torch.equal(lm.depformer.layers[0].self_attn.in_projs[i].weight, steps[i].to(torch.bfloat16))
    assert torch.equal(real_width.models.oracle_weight, oracle.to(torch.bfloat16))
    del fused, steps, oracle
    # read, cast and moved one tensor at a time: the peak is the bf16 model plus about one float32 tensor
    # (the largest, a 32001 x 4096 table, is 0.5 GB) -- the float32 file (3.7 GB) never sits whole in memory
    held = sum(t.numel() * t.element_size() for t in [*lm.parameters(), *lm.buffers(), real_width.models.oracle_weight])
    assert real_width.load_rss_growth < held + GIB < file.stat().st_size


def test_engine_ticks_batch_2_with_an_oracle_at_the_real_width(real_width: Loaded) -> None:
    from kame.frontend.config import FrontendConfig
    from kame.frontend.engine import EngineCore

    models = real_width.models
    cfg = FrontendConfig(checkpoint=str(real_width.ckpt), dtype="bfloat16", batch_size=2, seed=3)
    core = EngineCore(models, cfg, batch_size=2)
    for slot in (0, 1):
        core.attach(slot)
    answer = models.encode_text("the answer is four")
    core.oracle_reset(0, answer)
    rng = np.random.default_rng(0)
    ticks: list[dict[int, Any]] = []
    t0 = time.monotonic()
    for _ in range(5):
        frames = {s: (0.1 * rng.standard_normal(core.frame_size)).astype(np.float32) for s in (0, 1)}
        ticks.append(core.tick(frames))
    per_tick = (time.monotonic() - t0) / len(ticks)
    print(f"\nreal width: {per_tick:.2f} s a tick at batch 2 (bf16, CPU)")
    fed = [t[0].oracle_id for t in ticks]
    expected = [models.start_id, *answer, *[models.idle_id()] * 5][:5]
    assert fed == expected
    assert [t[1].oracle_id for t in ticks] == [models.idle_id()] * 5
    for t in ticks[1:]:  # after moshi's one-frame acoustic delay
        for s in (0, 1):
            out = t[s]
            assert out.text_id is not None and 0 <= out.text_id < 32000
            assert out.audio_codes is not None and all(0 <= c < 2048 for c in out.audio_codes)
            assert np.isfinite(out.pcm).all()


def test_memory_plan_matches_the_loaded_real_width(real_width: Loaded, tmp_path: Path) -> None:
    from kame.config import KameConfig
    from kame.frontend.oracle_input import OracleTextEmbedding
    from kame.frontend.plan_models import build_plan

    cfg = KameConfig.model_validate({"frontend": {"checkpoint": str(real_width.ckpt), "dtype": "bfloat16"},
                                     "asr": {"kind": "none"}, "cache_dir": str(tmp_path)})
    front = build_plan(cfg).plan.model("frontend")
    lm = real_width.models.lm
    held = sum(t.numel() * t.element_size() for t in [*lm.parameters(), *lm.buffers()])
    emb = lm.text_emb
    if isinstance(emb, OracleTextEmbedding):  # the engine test ran first and installed the oracle input
        held -= emb.oracle_table.numel() * emb.oracle_table.element_size() + emb.tokens.numel() * 8
    oracle = real_width.models.oracle_weight
    rows, dim = oracle.shape
    # the plan: the LM, the oracle table (held once: the engine's is the loaded tensor), one slot's oracle id
    assert front.weight_bytes == held + 2 * rows * dim + 8
    assert front.kv_bytes_per_slot == 2 * 32 * 3000 * 128 * 2 + 2 * 16 * 8 * 64 * 2
