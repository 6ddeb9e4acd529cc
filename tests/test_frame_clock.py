"""The frame clock of RTP transports (server/runtime/frame_clock.py): a frame every 80 ms, and no burst of
missed frames after the event loop stalled."""

from __future__ import annotations

import asyncio
import time

from kame.server.runtime.frame_clock import RESYNC_S, every_frame


def test_a_stalled_loop_goes_on_from_now_instead_of_catching_up() -> None:
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 2:
            time.sleep(RESYNC_S + 0.3)  # the event loop blocked: 16 frames' time missed

    async def main() -> None:
        task = asyncio.create_task(every_frame(tick))
        await asyncio.sleep(2.0)
        task.cancel()

    asyncio.run(main())
    stalled_until = ticks[1] + RESYNC_S + 0.3
    burst = [t for t in ticks[2:] if t - stalled_until < 0.05]
    assert len(burst) <= 2, f"{len(burst)} frames handed over at once after the stall"
    assert len(ticks) >= 5  # and it kept ticking afterwards
