"""Real-time pacing of a client's input audio. No I/O (the caller passes the clock).

Moshi consumes one 80 ms frame per step, and the engine steps every slot
that has a frame: a client that sends audio faster than real time would
make the engine tick faster for everyone, and a client that sends a file in
one go would lose all but the engine's last 2 s. The pacer sits between
the socket and the pipeline: frames within a small burst allowance pass at
once (a real-time client sees no added latency), frames ahead of that wait
in a bounded queue and are released at real time, and frames beyond the
queue are dropped and counted. ``buffer_s=0`` gives a pure guard (drop
beyond the burst) for endpoints without a release timer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from kame.audio.media import FRAME_S

T = TypeVar("T")


@dataclass(frozen=True)
class Pushed(Generic[T]):
    """What one push did: frames to feed now, and how many were dropped."""

    released: list[T]
    dropped: int
    overflow_started: bool  # first drop after a period without drops (report once per episode)


class InputPacer(Generic[T]):
    """Token bucket (one token per ``frame_s``, capacity ``burst_s``) plus a bounded queue."""

    def __init__(self, *, frame_s: float = FRAME_S, burst_s: float = 0.5, buffer_s: float = 10.0, now: float = 0.0) -> None:
        self.frame_s = frame_s
        self.capacity = max(1.0, burst_s / frame_s)
        self.max_queued = max(0, round(buffer_s / frame_s))
        self.tokens = self.capacity
        self.last = now
        self.queue: deque[T] = deque()
        self.dropped_frames = 0
        self._overflowing = False

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) / self.frame_s)
            self.last = now

    def push(self, frames: list[T], now: float) -> Pushed[T]:
        self._refill(now)
        released: list[T] = []
        dropped = 0
        for frame in frames:
            if not self.queue and self.tokens >= 1.0:
                self.tokens -= 1.0
                released.append(frame)
            elif len(self.queue) < self.max_queued:
                self.queue.append(frame)
            else:
                dropped += 1
        started = False
        if dropped:
            self.dropped_frames += dropped
            started = not self._overflowing
            self._overflowing = True
        elif len(self.queue) <= self.max_queued // 2:
            self._overflowing = False
        return Pushed(released, dropped, started)

    def release(self, now: float) -> list[T]:
        """Queued frames whose time has come."""
        self._refill(now)
        out: list[T] = []
        while self.queue and self.tokens >= 1.0:
            self.tokens -= 1.0
            out.append(self.queue.popleft())
        if len(self.queue) <= self.max_queued // 2:
            self._overflowing = False
        return out

    def next_release_in(self, now: float) -> float | None:
        """Seconds until the next queued frame may go; None when nothing waits."""
        if not self.queue:
            return None
        self._refill(now)
        return max(0.0, (1.0 - self.tokens) * self.frame_s)

    @property
    def queued(self) -> int:
        return len(self.queue)

    @property
    def dropped_s(self) -> float:
        return self.dropped_frames * self.frame_s
