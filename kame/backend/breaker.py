"""Circuit breaker: stop sending requests to a back-end that keeps failing.

closed -> (``failure_threshold`` consecutive failures) -> open -> (cooldown
elapsed) -> half-open: one probe request goes through; success closes the
breaker and resets the cooldown, failure re-opens it with the cooldown
multiplied by ``backoff_factor`` (up to ``max_cooldown_s``). While open, the
registry skips the back-end (and uses its fallback, if any) without waiting
for a timeout on every utterance.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

BreakerStateName = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class BreakerState:
    """What health endpoints show."""

    state: BreakerStateName
    consecutive_failures: int
    cooldown_s: float
    retry_in_s: float  # 0 unless open
    times_opened: int


@dataclass(frozen=True)
class Ticket:
    """Permission for one request; ``probe`` marks the single half-open trial."""

    probe: bool


class CircuitBreaker:
    """Per back-end; single event loop, no locking needed."""

    def __init__(
        self,
        *,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
        backoff_factor: float = 2.0,
        max_cooldown_s: float = 60.0,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerStateName], None] | None = None,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.base_cooldown_s = cooldown_s
        self.backoff_factor = backoff_factor
        self.max_cooldown_s = max(max_cooldown_s, cooldown_s)
        self.enabled = enabled
        self._clock = clock
        self._on_change = on_change
        self._failures = 0
        self._open_until: float | None = None  # set while open or half-open
        self._cooldown_s = cooldown_s
        self._probe_in_flight = False
        self._times_opened = 0
        self._last_state: BreakerStateName = "closed"

    @property
    def state(self) -> BreakerStateName:
        if self._open_until is None:
            return "closed"
        return "open" if self._clock() < self._open_until else "half_open"

    def snapshot(self) -> BreakerState:
        state = self.state
        retry = max(0.0, self._open_until - self._clock()) if state == "open" and self._open_until else 0.0
        return BreakerState(state, self._failures, self._cooldown_s, retry, self._times_opened)

    def try_acquire(self) -> Ticket | None:
        """A ticket to send a request, or None while the breaker is open (or its probe is out)."""
        if not self.enabled:
            return Ticket(probe=False)
        state = self.state
        self._notify(state)
        if state == "closed":
            return Ticket(probe=False)
        if state == "half_open" and not self._probe_in_flight:
            self._probe_in_flight = True
            return Ticket(probe=True)
        return None

    def retry_in_s(self) -> float:
        return self.snapshot().retry_in_s

    def success(self, ticket: Ticket) -> None:
        if not self.enabled:
            return
        if ticket.probe:
            self._probe_in_flight = False
            self._open_until = None
            self._cooldown_s = self.base_cooldown_s
            self._failures = 0
        elif self._open_until is None:
            self._failures = 0
        self._notify(self.state)

    def failure(self, ticket: Ticket) -> None:
        if not self.enabled:
            return
        if ticket.probe:
            self._probe_in_flight = False
            self._cooldown_s = min(self._cooldown_s * self.backoff_factor, self.max_cooldown_s)
            self._open(self._cooldown_s)
        elif self._open_until is None:
            self._failures += 1
            if self._failures >= self.failure_threshold:
                self._open(self._cooldown_s)
        self._notify(self.state)

    def neutral(self, ticket: Ticket) -> None:
        """The request ended without telling anything (cancelled before its first token)."""
        if ticket.probe:
            self._probe_in_flight = False

    def _open(self, cooldown: float) -> None:
        self._open_until = self._clock() + cooldown
        self._times_opened += 1

    def _notify(self, state: BreakerStateName) -> None:
        if state != self._last_state:
            self._last_state = state
            if self._on_change is not None:
                self._on_change(state)
