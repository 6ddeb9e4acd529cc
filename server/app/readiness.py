"""Readiness, two ways: for a load balancer (may a *new session* land here?) and for an orchestrator
(is this *pod* serving?).

Why two: a load balancer that health-checks ``/ready`` must stop sending sessions to a full replica,
so ``/ready`` answers 503 when every slot is taken. Kubernetes must not see a full replica as unready:
it would take the pod out of its Service and stall a rolling update until a session ends (a pod is
only "available" while Ready). So ``/ready?full_ok=1`` (the Kubernetes readiness probe) answers 200
while the models are warm and the server is not draining, full or not.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Readiness:
    """The verdict: ``ok`` answers 200; otherwise ``reason`` (``draining``, ``starting``, ``failed``, ``full``)."""

    ok: bool
    reason: str = ""
    free: int = 0


def readiness(*, draining: bool, host_state: str, host_ready: bool, free_slots: int, full_ok: bool) -> Readiness:
    """Draining wins over everything (a draining replica must lose its traffic first), then the model
    state (``host_state``: starting, failed, ...), then capacity unless ``full_ok``."""
    if draining:
        return Readiness(False, "draining")
    if not host_ready:
        return Readiness(False, host_state if host_state != "ok" else "starting")
    free = max(0, free_slots)
    if free <= 0 and not full_ok:
        return Readiness(False, "full")
    return Readiness(True, free=free)


_TRUE = frozenset({"1", "true", "yes", "on"})


def flag(value: str | None) -> bool:
    """A query flag such as ``full_ok=1``; absent or anything else is False."""
    return value is not None and value.strip().lower() in _TRUE
