"""The set of live sessions, and the graceful drain on SIGTERM.

The drain, in order (docs/server.md, "Lifecycle"):

1. **Stop admitting at once** (:meth:`SessionManager.begin_draining`, called from the signal
   handler): ``/ready`` answers 503, a new websocket is closed with 1001, but the server keeps
   listening so that load balancers see the 503 and clients get a close code rather than a
   refused connection.
2. **Tell the live sessions**: each gets :meth:`DrainAware.notify_draining` with the seconds
   left (``kame.session.ending`` on ``/v1/realtime`` and the Live API, a 0x05 notice on
   ``/api/chat``); a session admitted in the very instant drain began is told when it registers.
3. **Let them run** for ``server.drain_grace_s``; sessions may end by themselves meanwhile (the
   drain ends early once none is left).
4. **Close the rest** with 1001 "server shutting down" and wait up to ``server.drain_timeout_s``
   for their close handshakes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from starlette import status

from kame.server.runtime.end import DRAIN_REASON

if TYPE_CHECKING:
    from kame.server.telemetry.metrics import ServerMetrics

log = logging.getLogger("kame.server.runtime.manager")


class LiveSession(Protocol):
    """What the manager needs of a session of any endpoint."""

    id: str
    done: asyncio.Event

    def end(self, label: str, code: int | None, reason: str = "", error: str | None = None) -> None: ...


@runtime_checkable
class DrainAware(Protocol):
    """A session that can tell its client the server is draining (the per-endpoint notice)."""

    def notify_draining(self, seconds_left: float) -> None: ...


@dataclass(frozen=True)
class DrainClock:
    """When a drain that began at ``started`` (monotonic) lets sessions run until."""

    started: float
    grace_s: float

    @property
    def deadline(self) -> float:
        return self.started + self.grace_s

    def seconds_left(self, now: float) -> float:
        return max(0.0, self.deadline - now)


class SessionManager:
    """Tracks sessions for ``/health`` and drains them when the server stops."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.sessions: dict[str, LiveSession] = {}
        self.drain: DrainClock | None = None

    # ------------------------------------------------------------------ bookkeeping
    @property
    def draining(self) -> bool:
        return self.drain is not None

    @property
    def active(self) -> int:
        return len(self.sessions)

    def add(self, session: LiveSession) -> None:
        self.sessions[session.id] = session
        self.metrics.sessions_active.set(len(self.sessions))
        if self.drain is not None:  # admitted in the instant the drain began: told at once
            self._notify(session, self.drain.seconds_left(time.monotonic()))

    def remove(self, session: LiveSession) -> None:
        self.sessions.pop(session.id, None)
        self.metrics.sessions_active.set(len(self.sessions))

    # ------------------------------------------------------------------ draining
    def begin_draining(self, grace_s: float) -> bool:
        """Stop admitting now (safe from a signal handler: it only sets state). False if already draining."""
        if self.drain is not None:
            return False
        self.drain = DrainClock(time.monotonic(), grace_s)
        self.metrics.draining.set(1)
        return True

    def _notify(self, session: LiveSession, seconds_left: float) -> None:
        if isinstance(session, DrainAware):
            try:
                session.notify_draining(seconds_left)
            except Exception:
                log.exception("telling session %s about the drain failed", session.id)

    async def drain_sessions(self, grace_s: float, close_timeout_s: float, cut: asyncio.Event | None = None) -> None:
        """The whole drain (see the module docstring); ``cut`` set early ends the grace at once."""
        self.begin_draining(grace_s)
        assert self.drain is not None
        live = list(self.sessions.values())
        left = self.drain.seconds_left(time.monotonic())
        if live:
            log.info("draining: %d session(s) told, %.1f s to finish", len(live), left)
        for session in live:
            self._notify(session, left)
        if live and left > 0:
            await self._wait_for_sessions(left, cut)
        rest = [s for s in self.sessions.values() if not s.done.is_set()]
        for session in rest:
            session.end("draining", status.WS_1001_GOING_AWAY, DRAIN_REASON)
        if rest:
            log.info("draining: closing %d session(s) still open", len(rest))
            done = await self._wait_done(rest, close_timeout_s)
            if done < len(rest):
                log.warning("%d session(s) did not close within %.1f s", len(rest) - done, close_timeout_s)

    async def _wait_for_sessions(self, timeout: float, cut: asyncio.Event | None) -> None:
        """Until every session (also those added meanwhile) has ended, ``timeout`` passed or ``cut`` is set."""
        deadline = time.monotonic() + timeout
        while cut is None or not cut.is_set():
            pending = [s for s in self.sessions.values() if not s.done.is_set()]
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                return
            waits = [asyncio.ensure_future(s.done.wait()) for s in pending]
            if cut is not None:
                waits.append(asyncio.ensure_future(cut.wait()))
            try:
                await asyncio.wait(waits, timeout=min(left, 0.5), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    @staticmethod
    async def _wait_done(sessions: list[LiveSession], timeout: float) -> int:
        waits = [asyncio.ensure_future(s.done.wait()) for s in sessions]
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout)
        finally:
            for w in waits:
                w.cancel()
        return len(done)
