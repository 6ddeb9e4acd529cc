"""The FastAPI application factory: one :class:`AppState` per app, no module-level state.

``create_app(cfg, device=...)`` wires the model host, the session manager
and the metrics together. Its lifespan opens the LLM back-ends and starts
loading the models in a thread (the app answers ``/health`` with
"starting" meanwhile); at shutdown it drains the sessions and stops the
engine. :mod:`kame.server.app.serving` drains *before* uvicorn closes the
listening sockets (:mod:`kame.server.runtime.manager`: sessions are told, run on
for ``server.drain_grace_s``, then get 1001 "server shutting down" rather
than uvicorn's 1012), so a draining server still answers ``/ready`` (503)
and refuses new websockets with 1001 meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from kame.server.access.ephemeral import EphemeralKeys, signing_secret
from kame.server.app.gc_schedule import GarbageCollector
from kame.server.app.http import router as http_router
from kame.server.app.static import install as install_static
from kame.server.app.websockets import WIRES
from kame.server.config import AppConfig
from kame.server.host import ModelHost
from kame.server.runtime.manager import SessionManager
from kame.server.runtime.route import add_wire
from kame.server.state import AppState, BackendHealthCache
from kame.server.telemetry.metrics import ServerMetrics
from kame.server.telemetry.protocol_metrics import ProtocolMetrics
from kame.server.telephony.routes import router as sip_router
from kame.server.telephony.stack import start_sip
from kame.server.webrtc.live import router as live_webrtc_router
from kame.server.webrtc.signaling import router as webrtc_router
from kame.server.wires.twilio.routes import install as install_twilio
from kame.versions import runtime_versions

if TYPE_CHECKING:
    import torch  # a type only: torch loads with the models, in the host's thread

__all__ = ["AppState", "create_app"]


def _secret_of(cfg: AppConfig) -> bytes:
    """The signing secret of this server's ``ek_`` keys (server/access/ephemeral.py)."""
    s = cfg.server
    configured = s.ephemeral_key_secret.get_secret_value() if s.ephemeral_key_secret is not None else None
    token = s.auth_token.get_secret_value() if s.auth_token is not None else None
    return signing_secret(configured, token)


def create_app(
    cfg: AppConfig,
    *,
    device: torch.device | str,
    environ: Mapping[str, str] | None = None,
    on_failure: Callable[[str], None] | None = None,
) -> FastAPI:
    """A server for ``cfg`` on ``device`` (see :func:`kame.server.host.choose_device`)."""
    metrics = ServerMetrics()
    host = ModelHost(cfg, device, metrics, environ=environ, on_failure=on_failure)
    state = AppState(
        cfg=cfg,
        metrics=metrics,
        host=host,
        sessions=SessionManager(metrics),
        versions=runtime_versions(),
        health_cache=BackendHealthCache(),
        protocols=ProtocolMetrics(metrics.registry),
        ephemeral_keys=EphemeralKeys(_secret_of(cfg)),
    )

    def observe_gc(seconds: float, found: int) -> None:
        metrics.gc_seconds.observe(seconds)
        metrics.gc_collected.inc(found)

    collector = GarbageCollector(cfg.server.gc_interval_s, ready=lambda: host.ready, observe=observe_gc)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        host.open_backends()
        host.start_loading()
        gc_task = asyncio.create_task(collector.run()) if collector.interval_s > 0 else None
        sip = start_sip(state)  # phones over SIP (docs/sip.md), when sip.port is set
        try:
            yield
        finally:
            if gc_task is not None:
                gc_task.cancel()
                await asyncio.gather(gc_task, return_exceptions=True)
            await state.drain()
            if sip is not None:  # after the drain: the calls' sessions hung up through it
                await sip.aclose()
            await host.aclose()

    app = FastAPI(title="kame", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.kame = state
    app.include_router(http_router)
    for route in WIRES:  # /api/chat (Moshi), /v1/realtime (OpenAI Realtime): docs/protocol.md
        add_wire(app, route)
    app.include_router(sip_router)  # accept/reject/refer/hangup of SIP calls, before the WebRTC routes' 404s
    app.include_router(webrtc_router)  # /v1/realtime/calls, /v1/realtime/client_secrets (WebRTC)
    app.include_router(live_webrtc_router)  # POST /v1/live/sessions, its hangup and /attach (Live over WebRTC)
    install_twilio(app)  # POST /twilio/voice and the /twilio/media websocket (Twilio Media Streams): docs/telephony.md
    install_static(app, cfg.server.client_dir)  # the browser page (or a client build) at /, docs/browser.md
    return app
