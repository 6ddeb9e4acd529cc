"""Full garbage collections on a timer, rather than when CPython's allocation counters say so.

Why: closed connections leave reference cycles behind (exceptions, their tracebacks and frames, in
uvicorn, websockets and asyncio), and those cycles keep alive whatever the frames referenced: a
client's last message, up to ``server.max_message_bytes`` each. CPython starts a full collection only
after tens of thousands of allocations, which under a modest load takes minutes, so the RSS climbs in
between. The models' objects are frozen once loaded (:class:`~kame.server.host.ModelHost`), so a full
collection only walks what sessions created since: cheap enough to run every few seconds.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("kame.server")


class GarbageCollector:
    """Runs ``gc.collect()`` every ``interval_s`` once ``ready()`` (models loaded and frozen)."""

    def __init__(
        self,
        interval_s: float,
        ready: Callable[[], bool],
        observe: Callable[[float, int], None] | None = None,
        collect: Callable[[], int] = gc.collect,
    ) -> None:
        self.interval_s = interval_s
        self.ready = ready
        self.observe = observe
        self.collect = collect
        self.runs = 0

    def run_once(self) -> tuple[float, int]:
        """One full collection; its duration (seconds) and the number of unreachable objects found."""
        t0 = time.perf_counter()
        found = self.collect()
        took = time.perf_counter() - t0
        self.runs += 1
        if self.observe is not None:
            self.observe(took, found)
        if took > 0.05:
            log.warning("garbage collection took %.0f ms (%d objects)", 1000 * took, found)
        return took, found

    async def run(self) -> None:
        """Until cancelled (the app's lifespan owns this task)."""
        while True:
            await asyncio.sleep(self.interval_s)
            if self.ready():
                self.run_once()
