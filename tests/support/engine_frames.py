"""Input frames and engines for the engine's tests (tests/test_engine.py, tests/calls/test_past_context.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kame.frontend.config import FrontendConfig, SamplingConfig
from kame.frontend.engine import EngineCore
from kame.frontend.models import load_frontend

N_STEPS = 16


def frames(n: int = N_STEPS, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(1920) / 24000
    return [(0.1 * np.sin(2 * np.pi * (200 + 40 * i) * t) + 0.02 * rng.standard_normal(1920)).astype(np.float32) for i in range(n)]


def make_core(ckpt: Path, batch: int, greedy: bool = False) -> EngineCore:
    cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=batch, sampling=SamplingConfig(use_sampling=not greedy))
    return EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
