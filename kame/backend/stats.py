"""Counters and an observer hook, so the server can export metrics without this package knowing how.

The registry calls every observer with a :class:`BackendEvent`; the built-in
:class:`StatsCollector` is one such observer and keeps per-back-end totals
for ``/v1/backends`` and tests. Observers must be quick and must not raise
(exceptions are logged and swallowed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

EventKind = Literal[
    "request", "first_token", "done", "error", "cancelled", "busy", "fallback", "breaker", "tools_refused"
]


@dataclass(frozen=True)
class BackendEvent:
    """Something that happened to one request (or to a breaker).

    - ``request``: a request is being sent to ``backend``.
    - ``first_token``: its first chunk arrived after ``ttft_s``.
    - ``done``: it finished normally (``duration_s``, ``chunks``).
    - ``error``: it failed with ``error`` (a :attr:`BackendError.kind`).
    - ``cancelled``: the consumer stopped it (normal in KAME: superseded).
    - ``busy``: refused by a cap (``error`` says which: "busy" or "circuit_open").
    - ``fallback``: ``backend`` is used instead of ``requested``.
    - ``breaker``: the breaker of ``backend`` moved to ``breaker_state``.
    - ``tools_refused``: the server of ``backend`` refused function tools (``error``: its reason);
      sent once per back-end and process, its requests go without tools from then on.
    """

    kind: EventKind
    backend: str
    requested: str | None = None
    ttft_s: float | None = None
    duration_s: float | None = None
    chunks: int | None = None
    error: str | None = None
    breaker_state: str | None = None


Observer = Callable[[BackendEvent], None]


@dataclass
class BackendStats:
    """Totals for one back-end."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    busy: int = 0
    fallbacks_used: int = 0  # requests this back-end served as someone's fallback
    errors: Counter[str] = field(default_factory=Counter)
    ttft_count: int = 0
    ttft_sum_s: float = 0.0
    ttft_last_s: float | None = None
    ttft_max_s: float | None = None

    @property
    def ttft_mean_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "busy": self.busy,
            "fallbacks_used": self.fallbacks_used,
            "errors": dict(self.errors),
            "ttft_mean_s": self.ttft_mean_s,
            "ttft_last_s": self.ttft_last_s,
            "ttft_max_s": self.ttft_max_s,
        }


class StatsCollector:
    """An observer that sums events per back-end."""

    def __init__(self) -> None:
        self._by_backend: dict[str, BackendStats] = {}

    def get(self, backend: str) -> BackendStats:
        stats = self._by_backend.get(backend)
        if stats is None:
            stats = self._by_backend[backend] = BackendStats()
        return stats

    def all(self) -> dict[str, BackendStats]:
        return dict(self._by_backend)

    def __call__(self, event: BackendEvent) -> None:
        s = self.get(event.backend)
        if event.kind == "request":
            s.requests += 1
        elif event.kind == "first_token" and event.ttft_s is not None:
            s.ttft_count += 1
            s.ttft_sum_s += event.ttft_s
            s.ttft_last_s = event.ttft_s
            s.ttft_max_s = event.ttft_s if s.ttft_max_s is None else max(s.ttft_max_s, event.ttft_s)
        elif event.kind == "done":
            s.completed += 1
        elif event.kind == "cancelled":
            s.cancelled += 1
        elif event.kind == "error":
            s.errors[event.error or "error"] += 1
        elif event.kind == "busy":
            s.busy += 1
        elif event.kind == "fallback":
            s.fallbacks_used += 1
