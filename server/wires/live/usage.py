"""Usage reports and how a Live session ends. No I/O.

``session.usage.updated`` reports the cumulative duration in whole seconds
(``session_usage.py``) every ``interval_s``; ``session.closed`` carries the
final figure. Why a session ended maps onto the contract's reasons:

- the client's ``session.close`` -> ``close_requested``;
- the maximum duration -> ``expired``;
- everything else kame ends (idle, drain, engine error, abuse, ...) ->
  ``connection_lost``, preceded by an ``info`` whose code (``kame.<label>``)
  and message say what happened, since the contract has no reason for it.

A client that went away gets nothing (there is no one to tell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kame.server.wires.live.events import (
    CloseReason,
    Info,
    LiveEvent,
    SessionClosed,
    UsageUpdated,
)

#: kame's end labels that are not ``connection_lost``.
REASONS: dict[str, CloseReason] = {"close_requested": "close_requested", "max_duration": "expired"}
#: Labels after which nothing can be sent.
SILENT = frozenset({"client_closed", "slow_client"})


def whole_seconds(seconds: float) -> float:
    return float(max(0, math.floor(seconds + 1e-9)))


@dataclass
class UsageClock:
    """When to send the next ``session.usage.updated``."""

    started: float
    interval_s: float = 5.0
    _next: float | None = None

    def due(self, now: float) -> UsageUpdated | None:
        if self.interval_s <= 0:
            return None
        if self._next is None:
            self._next = self.started + self.interval_s
        if now < self._next:
            return None
        while self._next <= now:
            self._next += self.interval_s
        return UsageUpdated(whole_seconds(now - self.started))

    def seconds(self, now: float) -> float:
        return whole_seconds(now - self.started)


def close_reason(label: str) -> CloseReason:
    return REASONS.get(label, "connection_lost")


def closing_events(label: str, message: str, session: dict[str, object], usage_seconds: float,
                   client_event_id: str | None = None) -> list[LiveEvent]:
    """The last events of a session that ended for ``label`` (none when the client is gone)."""
    if label in SILENT:
        return []
    reason = close_reason(label)
    out: list[LiveEvent] = []
    if reason == "connection_lost":
        out.append(Info(f"kame.{label}", message or label))
    out.append(SessionClosed(reason, session, usage_seconds,
                             client_event_id=client_event_id if reason == "close_requested" else None))
    return out
