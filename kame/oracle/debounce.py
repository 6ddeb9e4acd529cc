"""When to (re)start the LLM: the published debounce, event-driven, with an injected clock.

Published rules: (re)start when the user's word count has grown by
``min_new_words`` since the last start, or a final transcript arrived; at
most ``max_restarts`` starts in any ``window_s`` seconds; the assistant's own
speech never triggers (this class only takes user events).

Differences from the published 0.5 s poll: each user event is judged at
once, and a trigger the rate limit suppresses is not lost. It stays
*pending*: the decision says ``retry_at`` (when the window frees a slot);
the caller calls :meth:`Debouncer.poll` then (or on its periodic tick) and
the pending start fires with the latest state. A pending trigger is dropped
when a new user turn begins (its answer would be stale).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kame.oracle.config import OracleConfig

Reason = Literal["words", "final", "client"]


@dataclass(frozen=True)
class Trigger:
    """A debounce decision. ``start``: (re)start the LLM now for ``turn_id``."""

    start: bool
    reason: Reason | None = None  #: why it starts, or what is pending
    turn_id: int | None = None
    retry_at: float | None = None  #: when suppressed: call poll() at this time

    @property
    def pending(self) -> bool:
        return not self.start and self.retry_at is not None


_IDLE = Trigger(False)


class Debouncer:
    def __init__(
        self,
        *,
        min_new_words: int = 2,
        max_restarts: int = 5,
        window_s: float = 2.0,
        final_restarts: Literal["always", "if_changed"] = "always",
    ) -> None:
        if min_new_words < 1 or max_restarts < 1 or window_s < 0:
            raise ValueError("min_new_words and max_restarts must be >= 1, window_s >= 0")
        self.min_new_words = min_new_words
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.final_restarts = final_restarts
        self._starts: deque[float] = deque()
        self._turn: int | None = None
        self._baseline = 0  # word count at the last start of this turn
        self._started_text: str | None = None  # text at the last start of this turn
        self._latest: tuple[int, str] = (0, "")  # (word count, text) of the latest event
        self._pending: Reason | None = None

    @classmethod
    def from_config(cls, config: OracleConfig) -> Debouncer:
        return cls(
            min_new_words=config.min_new_words,
            max_restarts=config.max_restarts,
            window_s=config.restart_window_s,
            final_restarts=config.final_restarts,
        )

    @property
    def pending(self) -> bool:
        return self._pending is not None

    @property
    def starts(self) -> int:
        """Starts within the current window (for metrics)."""
        return len(self._starts)

    # ------------------------------------------------------------------ events
    def on_partial(self, now: float, turn_id: int, text: str) -> Trigger:
        """A new partial hypothesis of the user's current utterance."""
        self._enter_turn(turn_id)
        count = len(text.split())
        self._latest = (count, text)
        if count - self._baseline >= self.min_new_words:
            return self._request(now, "words")
        return self._retry_or_idle(now)

    def on_final(self, now: float, turn_id: int, text: str) -> Trigger:
        """The user's utterance is final."""
        self._enter_turn(turn_id)
        count = len(text.split())
        self._latest = (count, text)
        changed = " ".join(text.split()) != self._started_text
        if count > 0 and (self.final_restarts == "always" or changed):
            return self._request(now, "final")
        return self._retry_or_idle(now)

    def poll(self, now: float) -> Trigger:
        """Fire a pending trigger if the rate limit now allows it."""
        if self._pending is None:
            return _IDLE
        return self._request(now, self._pending)

    def next_allowed(self, now: float) -> float:
        """Earliest time a start is allowed (``now`` if allowed now)."""
        self._expire(now)
        if len(self._starts) < self.max_restarts:
            return now
        return self._starts[0] + self.window_s

    # ------------------------------------------------------------------ internals
    def _enter_turn(self, turn_id: int) -> None:
        if turn_id != self._turn:
            self._turn = turn_id
            self._baseline = 0
            self._started_text = None
            self._pending = None

    def _request(self, now: float, reason: Reason) -> Trigger:
        if self._pending == "final":
            reason = "final"  # a pending final keeps its priority
        allowed_at = self.next_allowed(now)
        if allowed_at > now:
            self._pending = reason
            return Trigger(False, reason, self._turn, retry_at=allowed_at)
        self._starts.append(now)
        self._pending = None
        count, text = self._latest
        self._baseline = count
        self._started_text = " ".join(text.split())
        return Trigger(True, reason, self._turn)

    def _retry_or_idle(self, now: float) -> Trigger:
        if self._pending is not None:
            return self._request(now, self._pending)
        return _IDLE

    def _expire(self, now: float) -> None:
        while self._starts and self._starts[0] <= now - self.window_s:
            self._starts.popleft()
