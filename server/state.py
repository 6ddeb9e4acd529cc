"""What one server instance owns (:class:`AppState`, on ``app.state.kame``), typed for every module that serves it.

Its own module, with no import of the app's routes, so that the routes, the WebRTC endpoints, the
admission and the session route import it at their top (the app factory, which builds it, imports
them): no import circle, no import inside a function for a type. Nothing here loads a model.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from kame.server.access.ephemeral import EphemeralKeys
from kame.server.config import AppConfig
from kame.server.host import ModelHost
from kame.server.runtime.manager import SessionManager
from kame.server.telemetry.metrics import ServerMetrics
from kame.server.telemetry.protocol_metrics import ProtocolMetrics

#: Seconds a check of the back-ends' reachability is reused (``GET /v1/backends``, ``/health``).
BACKEND_CHECK_TTL_S = 10.0


class BackendHealthCache:
    """Reachability checks at most every ``ttl_s`` (a check can take seconds)."""

    def __init__(self, ttl_s: float = BACKEND_CHECK_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._at = -1e9
        self._value: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def get(self, state: AppState) -> dict[str, Any]:
        registry = state.host.backends
        if registry is None:
            return {}
        async with self._lock:
            if time.monotonic() - self._at > self.ttl_s:
                self._value = await registry.check_all()
                self._at = time.monotonic()
            return self._value


@dataclass
class AppState:
    """Everything one server instance owns (lives on ``app.state.kame``)."""

    cfg: AppConfig
    metrics: ServerMetrics
    host: ModelHost
    sessions: SessionManager
    versions: dict[str, str]
    health_cache: BackendHealthCache
    protocols: ProtocolMetrics
    started: float = field(default_factory=time.monotonic)
    #: ``ek_`` keys minted by ``/v1/realtime/client_secrets``.
    ephemeral_keys: EphemeralKeys = field(default_factory=EphemeralKeys)
    #: Live WebRTC calls (``/v1/realtime/calls``), by call id; created with the first call.
    calls: Any = None

    async def backend_health(self) -> dict[str, Any]:
        return await self.health_cache.get(self)

    def begin_draining(self) -> bool:
        """Stop admitting (from the signal handler); False when already draining."""
        return self.sessions.begin_draining(self.cfg.server.drain_grace_s)

    async def drain(self, cut: asyncio.Event | None = None) -> None:
        """Tell the live sessions, give them ``server.drain_grace_s`` (or until ``cut``), close the rest."""
        s = self.cfg.server
        await self.sessions.drain_sessions(s.drain_grace_s, s.drain_timeout_s, cut)
