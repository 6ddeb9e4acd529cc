"""The set of live sessions, and draining it on shutdown."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kame.server import protocol

if TYPE_CHECKING:
    from kame.server.metrics import ServerMetrics
    from kame.server.session import ChatSession

log = logging.getLogger("kame.server.sessions")

DRAIN_REASON = "server shutting down"


class SessionManager:
    """Tracks sessions for ``/health`` and closes them all (1001) when the server stops."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.sessions: dict[str, ChatSession] = {}
        self.draining = False

    @property
    def active(self) -> int:
        return len(self.sessions)

    def add(self, session: ChatSession) -> None:
        self.sessions[session.id] = session
        self.metrics.sessions_active.set(len(self.sessions))

    def remove(self, session: ChatSession) -> None:
        self.sessions.pop(session.id, None)
        self.metrics.sessions_active.set(len(self.sessions))

    async def drain(self, timeout: float) -> None:
        """Refuse new sessions, close every live one with 1001, wait up to ``timeout`` for them."""
        if not self.draining:
            self.draining = True
            if self.sessions:
                log.info("draining %d session(s)", len(self.sessions))
        live = list(self.sessions.values())
        for session in live:
            session.end("draining", protocol.CLOSE_GOING_AWAY, DRAIN_REASON)
        if not live:
            return
        waits = [asyncio.create_task(s.done.wait()) for s in live]
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("%d session(s) did not close within %.1f s", len(pending), timeout)
