"""Admission caps: at most N requests at once, at most R request starts per second.

KAME supersedes old LLM requests with newer ones, so a long queue only
delivers stale answers late. A request therefore waits at most a short
bound (``max_wait_s``, meant to cover the moment between cancelling the
stale request and starting the new one) and otherwise fails at once with
:class:`~kame.backend.errors.BackendBusy`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class Busy(Exception):
    """No slot within the wait bound (the registry turns this into BackendBusy)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class ConcurrencyLimiter:
    """A semaphore that refuses to wait longer than ``max_wait_s``."""

    def __init__(self, limit: int, max_wait_s: float) -> None:
        self.limit = limit
        self.max_wait_s = max_wait_s
        self._sem = asyncio.Semaphore(limit)
        self._in_use = 0

    @property
    def in_use(self) -> int:
        return self._in_use

    async def acquire(self) -> None:
        if self._sem.locked() and self.max_wait_s <= 0:
            raise Busy(f"{self.limit} concurrent requests")
        try:
            await asyncio.wait_for(self._sem.acquire(), self.max_wait_s if self.max_wait_s > 0 else None)
        except asyncio.TimeoutError:
            raise Busy(f"{self.limit} concurrent requests") from None
        self._in_use += 1

    def release(self) -> None:
        self._in_use -= 1
        self._sem.release()


class RateLimiter:
    """Token bucket: ``rate`` starts per second, bursts up to ``burst``.

    A request that would have to wait longer than ``max_wait_s`` for its
    token is refused immediately instead of sleeping first and failing later.
    """

    def __init__(
        self, rate: float, burst: int | None, max_wait_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.capacity = float(burst if burst is not None else max(1, math.ceil(rate)))
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._tokens = self.capacity
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def acquire(self) -> None:
        self._refill()
        wait = 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate
        if wait > self.max_wait_s:
            raise Busy(f"{self.rate:g} requests/s")
        self._tokens -= 1  # reserve now (may go negative) so waiters queue up fairly
        if wait > 0:
            try:
                await asyncio.sleep(wait)
            except BaseException:
                self.refund()
                raise

    def refund(self) -> None:
        """Give back a token taken by a request that never reached the server."""
        self._refill()
        self._tokens = min(self.capacity, self._tokens + 1)


class Caps:
    """A rate limiter and a concurrency limiter, either optional, taken in that order."""

    def __init__(
        self,
        *,
        max_concurrent: int | None,
        max_requests_per_s: float | None,
        burst: int | None,
        max_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.concurrency = ConcurrencyLimiter(max_concurrent, max_wait_s) if max_concurrent else None
        self.rate = RateLimiter(max_requests_per_s, burst, max_wait_s, clock) if max_requests_per_s else None

    async def acquire(self) -> None:
        """Take a slot (release with :meth:`release`); raises :class:`Busy`."""
        if self.rate is not None:
            await self.rate.acquire()
        if self.concurrency is not None:
            try:
                await self.concurrency.acquire()
            except BaseException:
                if self.rate is not None:
                    self.rate.refund()
                raise

    def release(self) -> None:
        if self.concurrency is not None:
            self.concurrency.release()

    def snapshot(self) -> dict[str, float | int | None]:
        return {
            "in_flight": self.concurrency.in_use if self.concurrency else None,
            "max_concurrent": self.concurrency.limit if self.concurrency else None,
            "max_requests_per_s": self.rate.rate if self.rate else None,
        }
