"""The server's frame clock for transports whose input has no clock of its own (RTP from WebRTC or SIP).

Such a transport hands the session one input frame every 80 ms of the server's clock, whatever the network
delivered (its jitter buffer fills the gaps): a session then steps at real time even when packets arrive in
bursts. A loop that stalled for more than a second (a loaded host) goes on from now instead of handing the
missed frames over at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kame.audio.media import FRAME_S

#: A stall longer than this restarts the clock from now.
RESYNC_S = 1.0


async def every_frame(tick: Callable[[], None]) -> None:
    """Call ``tick`` once every ``FRAME_S`` of the event loop's clock, until cancelled."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    n = 0
    while True:
        n += 1
        target = start + n * FRAME_S
        now = loop.time()
        if target > now:
            await asyncio.sleep(target - now)
        elif now - target > RESYNC_S:
            start, n = now, 0
        tick()
