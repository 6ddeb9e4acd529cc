"""Per-slot oracle token queue: one token per step, in order, never skipped.

A new answer is a *reset*: the queue is cleared and refilled with the start
id followed by the answer's first complete word, so no idle token ever falls
inside a sequence. Later words are appended. A token leaves the queue only
when its slot really steps (the engine calls :meth:`pop` once per executed
step), so tokens that arrive "late" are delayed, never lost.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class OracleFifo:
    start_id: int
    idle_id: int
    capacity: int = 256
    dropped: int = 0
    resets: int = 0
    _queue: deque[int] = field(default_factory=deque)
    #: Writers (the event loop) and the reader (the engine thread, one pop per step) may run at once.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self._queue)

    def reset(self, first_ids: Iterable[int]) -> None:
        """Start a new sequence: start id + the first complete word's tokens."""
        ids = list(first_ids)
        if not ids:
            raise ValueError("an oracle reset needs the first word's tokens (the start id never goes alone)")
        with self._lock:
            self._queue.clear()
            self.resets += 1
            self._extend([self.start_id, *ids])

    def push(self, ids: Iterable[int]) -> None:
        """Append the next tokens of the current sequence."""
        ids = list(ids)
        with self._lock:
            self._extend(ids)

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()

    def pop(self) -> int:
        """The token for this step: the next queued one, else the idle id."""
        with self._lock:
            return self._queue.popleft() if self._queue else self.idle_id

    def _extend(self, ids: Iterable[int]) -> None:
        for tok in ids:
            if len(self._queue) >= self.capacity:
                self.dropped += 1
            else:
                self._queue.append(int(tok))
