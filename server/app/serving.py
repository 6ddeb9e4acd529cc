"""Running the app under uvicorn, with a graceful drain on SIGTERM.

uvicorn's own shutdown stops listening and closes open websockets with 1012 at once. Here a
SIGTERM (or SIGINT) first marks the server draining, in the signal handler itself: from then on
``/ready`` answers 503 and a new websocket gets 1001, while the server **keeps listening** (a
load balancer sees the 503, a client gets a close code it retries elsewhere, not a refused
connection). The live sessions are told and run on for ``server.drain_grace_s``; those still
open are closed with 1001 "server shutting down" and get ``server.drain_timeout_s`` for the close
handshake (:mod:`kame.server.runtime.manager`); only then does uvicorn close the sockets and finish.
A second signal during the grace ends it at once.

Worst case after SIGTERM: drain_grace_s + drain_timeout_s + uvicorn's graceful timeout (2 s) +
engine stop (~1 s): with the defaults (2 + 3) under 8 s, inside Docker's 10 s grace period.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping
from types import FrameType

import uvicorn

from kame.server.app.factory import AppState, create_app
from kame.server.config import AppConfig

log = logging.getLogger("kame.server")

GRACEFUL_TIMEOUT_S = 2


def shutdown_budget_s(drain_grace_s: float, drain_timeout_s: float) -> float:
    """The longest a shutdown takes after SIGTERM (what a container's grace period must exceed)."""
    return drain_grace_s + drain_timeout_s + GRACEFUL_TIMEOUT_S + 1.0


class KameServer(uvicorn.Server):
    """uvicorn.Server whose shutdown drains the sessions while still listening."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.kame = state
        self._cut: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.kame.begin_draining():
            log.info("signal %d: draining (no new sessions; live ones get %.1f s)", sig,
                     self.kame.cfg.server.drain_grace_s)
        elif self._cut is not None and self._loop is not None and not self._cut.is_set():
            log.info("signal %d again: ending the drain now", sig)
            self._loop.call_soon_threadsafe(self._cut.set)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._cut = asyncio.Event()
        try:
            await self.kame.drain(self._cut)  # the sockets stay open meanwhile
        except Exception:
            log.exception("draining sessions failed")
        await super().shutdown(sockets=sockets)


def run_server(cfg: AppConfig, device: str, *, environ: Mapping[str, str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 1 if the models could not be loaded, else 0."""
    failures: list[str] = []
    holder: dict[str, KameServer] = {}

    def on_failure(message: str) -> None:
        failures.append(message)
        server = holder.get("server")
        if server is not None:
            server.should_exit = True

    app = create_app(cfg, device=device, environ=environ, on_failure=on_failure)
    s = cfg.server
    config = uvicorn.Config(
        app,
        host=s.host,
        port=s.port,
        log_config=None,
        lifespan="on",
        ws_max_size=s.max_message_bytes,
        ws_max_queue=16,
        ws_per_message_deflate=False,  # Opus does not compress; deflate would only cost CPU
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        timeout_graceful_shutdown=GRACEFUL_TIMEOUT_S,
        server_header=False,
        ssl_certfile=str(s.ssl_certfile) if s.ssl_certfile else None,
        ssl_keyfile=str(s.ssl_keyfile) if s.ssl_keyfile else None,
    )
    server = KameServer(config, app.state.kame)
    holder["server"] = server
    if failures:  # failed before the server object existed (very fast failure)
        server.should_exit = True
    scheme = "https" if s.ssl_certfile else "http"
    log.info("listening on %s://%s:%d (websocket /api/chat)", scheme, s.host, s.port)
    server.run()
    return 1 if failures else 0
