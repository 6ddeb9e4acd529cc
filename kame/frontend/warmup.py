"""The engine's warm-up: what would otherwise happen inside the first session's ticks happens before ready.

moshi compiles its kernels and captures its CUDA graphs on the first calls;
a shared Kyutai STT does the same on its first step. Silent ticks of every
slot, with the shared STT attached, do all of it while the server still
answers "starting". A failure to compile (no compiler, no Python headers, a
Triton error) is one log line naming the cause; the engine then runs eager,
so it never keeps the server from serving.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from kame.frontend.engine import EngineCore, EngineStepError
from kame.frontend.moshi_gate import compiled_graphs, first_line

log = logging.getLogger(__name__)


def warm_up_engine(core: EngineCore, steps: int) -> float:
    """``steps`` silent ticks of every slot, then leave them detached (attach resets a slot); returns seconds."""
    if steps <= 0:
        return 0.0
    t0 = time.monotonic()
    core.log_step_errors = False
    try:
        _ticks(core, steps)
    except EngineStepError as exc:
        if not core.mode.compile:
            raise
        log.warning("torch.compile failed at warm-up, running eager: %s", first_line(exc.cause))
        core.disable_compile()
        _ticks(core, steps)
    finally:
        core.log_step_errors = True
    took = time.monotonic() - t0
    log.info(
        "warm-up: %d ticks of %d slots%s in %.2f s (compile %s, %d graphs compiled)",
        steps, core.batch_size, " with the shared STT" if core.stt is not None else "", took,
        "on" if core.mode.compile else "off", compiled_graphs(),
    )
    return took


def _ticks(core: EngineCore, steps: int) -> None:
    slots = list(range(core.batch_size))
    silence = np.zeros(core.frame_size, np.float32)
    for slot in slots:
        core.attach(slot)
        if core.stt is not None:
            core.stt_attach(slot)
    try:
        for _ in range(steps):
            core.tick(dict.fromkeys(slots, silence))
    finally:
        for slot in slots:
            core.detach(slot)
