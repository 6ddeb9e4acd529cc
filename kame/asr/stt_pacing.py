"""When a separate Kyutai STT engine steps its batch: once per frame period, sooner only to catch up.

Sessions' frames arrive at their own phases. Stepping on every arrival
would step the whole batched model once per session per frame period (8
sessions: 100 steps a second instead of 12.5), each step costing nearly a
full batch. So a frame waits for the period's step, which takes every slot
that has a frame by then; only a slot with a backlog (two frames or more
ready: after a stall, or its silence prefix and end-of-stream flush, which
are ready at once) makes the next step come at once, so it catches up.
"""

from __future__ import annotations

from collections.abc import Iterable

from kame.audio.media import FRAME_S


def wait_before_step(now: float, last_step: float | None, ready: Iterable[int], period: float = FRAME_S) -> float | None:
    """Seconds to wait before the next step (0: step now); None when no slot has a frame.

    ``ready``: frames each slot could be stepped with now; ``last_step``: when
    the previous step started (None: never).
    """
    counts = list(ready)
    if not counts or max(counts) <= 0:
        return None
    if last_step is None or max(counts) >= 2:
        return 0.0
    return max(0.0, last_step + period - now)
