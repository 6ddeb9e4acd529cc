"""The engine's warm-up: what would otherwise happen inside the first session's ticks happens before ready.

moshi compiles its kernels and captures its CUDA graphs on the first calls
(a graph on its second call), each exec mask's too. Silent ticks do what a
session does, for every checkpoint family: the LM, Mimi's encoder and
decoder, the shared Kyutai STT, each exec mask set more than once (ticks of
every slot, then of one, then of every slot), and on PersonaPlex prompt
steps beside slots in conversation. A failure to compile is one log line
naming the cause; the engine then runs eager (see :mod:`kame.frontend.engine`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from kame.frontend.engine import EngineCore, EngineStepError
from kame.frontend.moshi_gate import compiled_graphs
from kame.frontend.prompts import PromptPlan

log = logging.getLogger(__name__)


def warm_up_engine(core: EngineCore, steps: int) -> float:
    """``steps`` silent ticks of every slot, then leave them detached (attach resets a slot); returns seconds."""
    if steps <= 0:
        return 0.0
    t0 = time.monotonic()
    core.log_step_errors = False
    try:
        _ticks(core, steps)
        core.models.encode_wav_voices()  # each wav voice's Mimi pass now, not in a session's attach
    except Exception as exc:
        if not core.mode.compile:
            raise
        core.fall_back_to_eager("warm-up", exc.cause if isinstance(exc, EngineStepError) else exc)
        _ticks(core, steps)
        core.models.encode_wav_voices()
    finally:
        core.log_step_errors = True
    took = time.monotonic() - t0
    log.info(
        "warm-up: %d ticks of %d slots%s in %.2f s (compile %s, %d graphs compiled)",
        steps, core.batch_size, " with the shared STT" if core.stt is not None else "", took,
        "on" if core.mode.compile else "off", compiled_graphs(),
    )
    return took


def conversation_plan(core: EngineCore) -> PromptPlan | None:
    """PersonaPlex: a plan whose prompts end at once (its last forced frame only), so that a warm-up slot hears
    its frames from the first tick; None on other checkpoints."""
    if core.prompts is None:
        return None
    plan = core.models.prompt_plan(None, None)
    assert plan is not None
    return dataclasses.replace(plan, voice_frames=0, embeddings=None, saved_cache=None, first_forced=0,
                               forced=plan.forced[-1:])


def _ticks(core: EngineCore, steps: int) -> None:
    slots = list(range(core.batch_size))
    silence = np.zeros(core.frame_size, np.float32)
    quick = conversation_plan(core)

    def attach(slot: int, plan: PromptPlan | None) -> None:
        core.attach(slot, plan)
        if core.stt is not None:
            core.stt_attach(slot)

    def tick(group: list[int]) -> None:
        core.tick(dict.fromkeys(group, silence))

    for slot in slots:
        attach(slot, quick)
    try:
        for _ in range(max(steps, 3)):  # LM, Mimi encode (and decode past the acoustic delay), shared STT
            tick(slots)
        if len(slots) > 1:  # another exec mask, then the first again: each mask's graph captured
            tick(slots[:1])
            tick(slots)
            tick(slots[1:])
            tick(slots)
        if core.prompts is not None:  # a session's prompts beside a conversation: prompt steps, their writes
            attach(slots[-1], None)
            for _ in range(2):
                tick(slots)
    finally:
        for slot in slots:
            core.detach(slot)
