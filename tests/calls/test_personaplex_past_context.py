"""PersonaPlex past its context: what a slot conditions on once its prompts have left the window.

A session's voice prompt and persona are stepped at its start (P frames), so they sit in the first P
positions of the LM's ring KV cache. Measured on the tiny PersonaPlex checkpoint (context 100 frames):
every attention layer holds them until the conversation is ``context - P`` frames old... then they go,
one a frame, and from ``context`` frames on the slot attends only to the last ``context`` frames of the
conversation: the user's audio and its own speech, made in the prompted voice. kame keeps moshi's
sliding window (docs/personaplex.md, "Long calls"): the prompts' influence goes on through those frames,
which this test shows (two prompts still give different speech 3 contexts later on the same input),
and the persona also reaches the LLM, whose system message is never dropped (tests/test_oracle_window.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from kame.frontend.config import FrontendConfig
from kame.frontend.engine import EngineCore
from kame.frontend.models import load_frontend

CONTEXT = 100


def _ring_offsets(lm: Any, slot: int) -> list[int]:
    """Positions written so far in each attention layer's ring KV cache, for ``slot``."""
    out = []
    for module in lm.transformer.modules():
        state = getattr(module, "_streaming_state", None)
        cache = getattr(state, "kv_cache", None)
        if cache is not None:
            assert cache.capacity == CONTEXT
            out.append(int(cache.end_offset[slot]))
    assert out, "no ring KV cache found"
    return out


def prompt_entries_in_window(written: int, prompt_frames: int) -> int:
    """Of positions ``0 .. written - 1``, the ring keeps the last ``CONTEXT``: how many are prompt positions."""
    return max(0, prompt_frames - max(0, written - CONTEXT))


def test_prompts_leave_the_window_and_their_influence_stays(tiny_personaplex_ckpt: Path) -> None:
    cfg = FrontendConfig(checkpoint=str(tiny_personaplex_ckpt), dtype="float32", batch_size=2)
    cfg.sampling.use_sampling = False
    models = load_frontend(cfg, torch.device("cpu"))
    core = EngineCore(models, cfg)
    plans = {0: models.prompt_plan("NATF2", "Be kind and talk about the sea."),
             1: models.prompt_plan("VARM1", "Be brisk and talk about trains.")}
    for slot, plan in plans.items():
        core.attach(slot, plan)
    while core.prompting(0) or core.prompting(1):
        core.prompt_tick()
    total = {s: p.total for s, p in plans.items() if p is not None}
    rng = np.random.default_rng(5)
    user = [(0.2 * rng.standard_normal(1920)).astype(np.float32) for _ in range(4 * CONTEXT)]
    seen: dict[int, list[int]] = {0: [], 1: []}
    rows: dict[int, list[tuple[Any, ...]]] = {0: [], 1: []}
    for frame in user:
        out = core.tick({0: frame, 1: frame})  # the same caller on both slots
        for slot in (0, 1):
            written = _ring_offsets(models.lm, slot)
            assert len(set(written)) == 1  # every layer slides alike
            seen[slot].append(prompt_entries_in_window(written[0], total[slot] - 1))
            rows[slot].append((out[slot].text_id, out[slot].audio_codes))
    for slot in (0, 1):
        p = total[slot] - 1  # prompt positions: moshi steps 0 .. total - 2 take no user audio
        assert seen[slot][0] == p  # at the start the whole prompt is attended to ...
        first_evicted = next(i for i, n in enumerate(seen[slot]) if n < p)
        first_gone = next(i for i, n in enumerate(seen[slot]) if n == 0)
        assert abs(first_evicted - (CONTEXT - p)) <= 2  # ... until the window is full: one goes a frame ...
        assert abs(first_gone - CONTEXT) <= 2  # ... and after CONTEXT frames of conversation none is left
        assert all(n == 0 for n in seen[slot][first_gone:])  # never again
    # The prompts still shape the speech 3 contexts later, through the frames in the window (their own voice).
    late = slice(3 * CONTEXT, 4 * CONTEXT)
    differ = sum(1 for a, b in zip(rows[0][late], rows[1][late]) if a != b)
    assert differ > CONTEXT // 2, differ
