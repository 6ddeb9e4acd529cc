"""A bounded, thread-safe event queue that both threads and asyncio can read.

Recognition runs on worker threads (or behind a pump thread for a worker
process) while sessions live on the asyncio loop, so events cross threads.
The queue wakes asyncio readers with ``call_soon_threadsafe`` and sync
readers with a condition variable. It never blocks the producer: when it is
full the oldest partial (superseded by newer ones anyway) is dropped.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator

from kame.asr.events import AsrEvent, EventType


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class EventChannel:
    """Single-consumer queue of :class:`AsrEvent` with an end marker."""

    def __init__(self, max_events: int = 1000) -> None:
        self._max = max(1, max_events)
        self._cond = threading.Condition()
        self._items: deque[AsrEvent] = deque()
        self._ended = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.dropped = 0

    # ------------------------------------------------------------------ producer side

    def put(self, event: AsrEvent) -> None:
        with self._cond:
            if self._ended:
                return
            self._items.append(event)
            if len(self._items) > self._max:
                self._drop_one()
            self._notify()

    def end(self) -> None:
        """No more events; readers drain what is left, then stop."""
        with self._cond:
            self._ended = True
            self._notify()

    def _drop_one(self) -> None:
        self.dropped += 1
        for i, ev in enumerate(self._items):
            if ev.type is EventType.PARTIAL:
                del self._items[i]
                return
        self._items.popleft()

    def _notify(self) -> None:
        # Called with the lock held.
        self._cond.notify_all()
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # that loop is closed; nobody is waiting any more
                pass

    # ------------------------------------------------------------------ consumer side

    @property
    def ended(self) -> bool:
        """True once the producer ended and every event was read."""
        with self._cond:
            return self._ended and not self._items

    def get(self, timeout: float | None = None) -> AsrEvent | None:
        """Next event; None when the channel ended or ``timeout`` passed (see :attr:`ended`)."""
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._ended, timeout)
            return self._items.popleft() if self._items else None

    def __iter__(self) -> Iterator[AsrEvent]:
        while (ev := self.get()) is not None:
            yield ev

    async def aget(self) -> AsrEvent | None:
        """Next event without blocking the loop; None once the channel ended."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                if self._ended:
                    return None
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            await fut

    async def __aiter__(self) -> AsyncIterator[AsrEvent]:
        while (ev := await self.aget()) is not None:
            yield ev
