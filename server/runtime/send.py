"""The send queue between a session and its client, with audio dropping. No I/O.

Only the send task waits on the network. Everything else queues here
without waiting: once ``audio_limit`` messages wait (audio or not: whatever
waits delays the audio behind it), output frames are refused (the caller
drops the frame before encoding it, counted); droppable messages are refused
beyond ``3 * audio_limit`` waiting messages; and any other message beyond
``max_events`` waiting non-audio messages means the client is not reading at
all (the caller ends the session).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kame.audio.media import FRAME_S
from kame.server.runtime.wire import Outgoing

#: Non-audio messages that may wait for a client before it counts as not reading.
MAX_QUEUED_EVENTS = 1000


class SendQueue:
    """FIFO of :class:`Outgoing` with separate bounds for audio and events, and the lateness clock."""

    def __init__(self, audio_limit: int, *, max_events: int = MAX_QUEUED_EVENTS,
                 observe_lateness: Callable[[float], None] | None = None) -> None:
        self.audio_limit = audio_limit
        self.max_events = max_events
        self.observe_lateness = observe_lateness
        self._q: asyncio.Queue[Outgoing] = asyncio.Queue()
        self.audio_queued = 0
        self.events_queued = 0
        self.dropped_messages = 0
        self.last_send = time.monotonic()
        self._anchor: float | None = None

    def audio_ok(self) -> bool:
        """Whether an output frame's audio may be queued now (else it is dropped before encoding)."""
        return self._q.qsize() < self.audio_limit

    def put(self, out: Outgoing) -> bool:
        """Queue ``out``; False when the client is not reading (too many events waiting)."""
        if out.audio_index is not None:
            self.audio_queued += 1
        elif out.droppable:
            if self._q.qsize() >= 3 * self.audio_limit:
                self.dropped_messages += 1
                return True
            self.events_queued += 1
        else:
            if self.events_queued >= self.max_events:
                return False
            self.events_queued += 1
        self._q.put_nowait(out)
        return True

    @property
    def pending(self) -> bool:
        return not self._q.empty()

    def qsize(self) -> int:
        return self._q.qsize()

    async def get(self) -> Outgoing:
        if self._q.empty():
            self.last_send = time.monotonic()
        out = await self._q.get()
        if out.audio_index is not None:
            self.audio_queued -= 1
        else:
            self.events_queued -= 1
        return out

    def sent(self, out: Outgoing, now: float) -> None:
        """``out`` left: the send clock and, for audio, its lateness against the 80 ms schedule."""
        self.last_send = now
        if out.audio_index is None:
            return
        if self._anchor is None:
            self._anchor = now - out.audio_index * FRAME_S
        if self.observe_lateness is not None:
            self.observe_lateness(max(0.0, now - (self._anchor + out.audio_index * FRAME_S)))
