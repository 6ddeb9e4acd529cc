"""What both JSON-event clients (Realtime, Live) keep once connected: the events in order, the
assistant's audio, the close, and a way to wait for an event.

The two protocols name their events differently but are read the same way: every non-audio event
is appended with its arrival time, and a waiter scans from an index so a test or a bench can wait
for "the next X after what I sent". The receive loops (one per protocol) fill this in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kame.client.stats import AudioSessionBase

Event = dict[str, Any]


class EventSession(AudioSessionBase):
    """:class:`AudioSessionBase` plus the event log; subclasses call :meth:`_init_events` in ``__init__``
    and, in their receive loop, append to :attr:`events` / :attr:`pcm_chunks` and set ``_changed``."""

    events: list[tuple[float, Event]]
    pcm_chunks: list[np.ndarray]
    close_code: int | None
    close_reason: str

    def _init_events(self) -> None:
        self.events = []  # every event but audio, in order, with its arrival time
        self.pcm_chunks = []
        self.closed = asyncio.Event()
        self.close_code = None
        self.close_reason = ""
        self._changed = asyncio.Event()

    def of_type(self, *types: str) -> list[Event]:
        return [e for _, e in self.events if e.get("type") in types]

    @property
    def errors(self) -> list[Event]:
        return self.of_type("error")

    def received_pcm(self) -> np.ndarray:
        """The assistant's audio, at 24 kHz."""
        return np.concatenate(self.pcm_chunks) if self.pcm_chunks else np.zeros(0, np.float32)

    async def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 10.0, *, start: int = 0) -> Event | None:
        """The first event (from index ``start`` of :attr:`events`) matching ``predicate``; None on timeout/close."""
        deadline = time.monotonic() + timeout
        i = start
        while True:
            while i < len(self.events):
                event = self.events[i][1]
                i += 1
                if predicate(event):
                    return event
            left = deadline - time.monotonic()
            if left <= 0 or self.closed.is_set():
                return None
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def wait_for_type(self, etype: str, timeout: float = 10.0, *, start: int = 0) -> Event | None:
        return await self.wait_for(lambda e: e.get("type") == etype, timeout, start=start)

    async def wait_closed(self, timeout: float = 10.0) -> tuple[int | None, str]:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closed.wait(), timeout)
        return self.close_code, self.close_reason
