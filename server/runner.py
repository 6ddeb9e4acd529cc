"""Running the app under uvicorn, with a shutdown that drains sessions first.

uvicorn's own shutdown closes open websockets with 1012 at once. The server
here stops accepting connections, closes every session with 1001 "server
shutting down" (after which the clients answer the close handshake), and
only then lets uvicorn finish. Worst case on SIGTERM: drain_timeout_s (<= 5)
+ uvicorn's graceful timeout (2 s) + engine stop (1 s) < 8 s.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping

import uvicorn
from kame.server.app import AppState, create_app

from kame.config import KameConfig

log = logging.getLogger("kame.server")

GRACEFUL_TIMEOUT_S = 2


class KameServer(uvicorn.Server):
    """uvicorn.Server whose shutdown drains the sessions before closing connections."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.kame = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting; uvicorn closes them again, harmlessly
        try:
            await self.kame.drain()
        except Exception:
            log.exception("draining sessions failed")
        await super().shutdown(sockets=sockets)


def run_server(cfg: KameConfig, device: str, *, environ: Mapping[str, str] | None = None) -> int:
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
