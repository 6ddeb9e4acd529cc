"""Admission of a websocket, the same for both endpoints.

The checks run in one order (docs/protocol.md section 1): origin, token,
draining, readiness, query parameters, capacity. Every refusal happens after
``accept`` so the client gets a close code and a reason it can act on
(browsers hide HTTP status codes of failed websocket handshakes): 1008 for
origin, token or invalid parameters, 1013 for "starting", "failed" (the engine thread died)
and "full", 1001
while draining. Refusals are counted in ``kame_sessions_rejected_total{reason}``
and cost no model work. How a refusal's message is worded on the wire is the
endpoint's business (``send_error``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fastapi import WebSocket
from starlette import status

from kame.server.access.auth import origin_ok, token_ok, websocket_credentials
from kame.server.access.ephemeral import is_ephemeral
from kame.server.access.params import ParamError, ParseWireParams, QueryParams, WireParams, parse_session_params
from kame.server.runtime.end import DRAIN_REASON, close_reason
from kame.server.state import AppState
from kame.server.telemetry.logs import SessionLogger, session_logger

if TYPE_CHECKING:
    from kame.server.access.ephemeral import EphemeralGrant
    from kame.session.settings import SessionSettings

#: The upgrade answer's header naming the session (a resume handle starts with the same id).
ROUTE_HEADER = b"x-kame-session"

SendError = Callable[[WebSocket, str], Awaitable[None]]


@dataclass(frozen=True)
class Admitted:
    """A websocket that passed every check."""

    session_id: str
    log: SessionLogger
    peer: str
    params: QueryParams
    #: The ``ek_`` key's grant when one admitted the session.
    grant: EphemeralGrant | None = None
    #: The wire's own query parameters (``admit``'s ``wire_params``), None where the wire reads none.
    wire_params: WireParams | None = None
    #: A resumed session's settings (server/runtime/resume_route.py): the wire starts with them.
    restored: SessionSettings | None = None
    #: A resumed session's wire state (the store entry's ``wire``): the wire rebuilds itself from it.
    restored_wire: dict[str, Any] | None = None


async def refuse(ws: WebSocket, state: AppState, label: str, code: int, reason: str, *,
                 error: str | None = None, send_error: SendError | None = None, send_reason: bool = False) -> None:
    """Count and close; ``error`` (or, with ``send_reason``, the reason) goes out first through ``send_error``."""
    state.metrics.sessions_rejected.labels(reason=label).inc()
    message = error or (reason if send_reason else None)
    with contextlib.suppress(Exception):  # the client may have gone already
        if message and send_error is not None:
            await send_error(ws, message)
        await ws.close(code=code, reason=close_reason(reason))


async def admit(ws: WebSocket, state: AppState, send_error: SendError, *, send_reason: bool = False,
                ephemeral: bool = False, wire_params: ParseWireParams | None = None,
                authenticated: bool = False) -> Admitted | None:
    """Accept ``ws`` and run the checks; None when it was refused (and closed).

    ``wire_params`` parses the wire's own query parameters, checked with the others. ``authenticated``: the
    endpoint checked its caller itself (``/twilio/media``: Twilio's signature), so no bearer token is asked.

    ``send_reason``: every refusal's reason goes out through ``send_error``
    before the close, not only errors (``/api/chat``: a 0x05 message).
    """
    cfg = state.cfg.server
    host = state.host
    creds = websocket_credentials(ws.headers, ws.query_params, list(ws.scope.get("subprotocols") or []))
    session_id = uuid.uuid4().hex[:12]
    # the session's id on the upgrade's answer: a load balancer learns where a resume goes (deploy/haproxy.cfg)
    await ws.accept(subprotocol=creds.subprotocol, headers=[(ROUTE_HEADER, session_id.encode())])
    log = session_logger(session_id)
    peer = f"{ws.client.host}:{ws.client.port}" if ws.client else "?"

    async def no(label: str, code: int, reason: str, error: str | None = None) -> None:
        await refuse(ws, state, label, code, reason, error=error, send_error=send_error, send_reason=send_reason)

    if not origin_ok(ws.headers.get("origin"), cfg.allowed_origins):
        log.warning("refused: origin not allowed", extra={"peer": peer, "origin": ws.headers.get("origin", "")[:100]})
        await no("origin", status.WS_1008_POLICY_VIOLATION, "origin not allowed")
        return None
    grant = state.ephemeral_keys.lookup(creds.token) if ephemeral and is_ephemeral(creds.token) else None
    if is_ephemeral(creds.token) and ephemeral and grant is None:
        log.warning("refused: unknown or expired ephemeral key", extra={"peer": peer})
        await no("unauthorized", status.WS_1008_POLICY_VIOLATION, "unauthorized",
                 error="the ephemeral key (ek_...) is unknown or has expired")
        return None
    if grant is None and not authenticated and not token_ok(cfg.auth_token, creds.token):
        log.warning("refused: missing or wrong token", extra={"peer": peer})
        await no("unauthorized", status.WS_1008_POLICY_VIOLATION, "unauthorized")
        return None
    if state.sessions.draining:
        await no("draining", status.WS_1001_GOING_AWAY, DRAIN_REASON)
        return None
    if host.failed:
        await no("failed", status.WS_1013_TRY_AGAIN_LATER, "server failed, retry later")
        return None
    if not host.ready:
        await no("starting", status.WS_1013_TRY_AGAIN_LATER, "server starting, retry later")
        return None
    try:
        params = parse_session_params(
            ws.query_params,
            backends=host.backend_names() if host.backends is not None else None,
            mcp_servers=host.tools.mcp_server_names if host.tools is not None else (),
        )
        extra = wire_params(ws.query_params) if wire_params is not None else None
    except ParamError as exc:
        log.info("refused: %s", exc, extra={"peer": peer})
        await no("bad_params", status.WS_1008_POLICY_VIOLATION, "invalid query parameter", error=str(exc))
        return None
    if host.free_slots <= 0:
        log.info("refused: server full", extra={"peer": peer})
        await no("full", status.WS_1013_TRY_AGAIN_LATER, "server full, retry later")
        return None
    if extra is not None:
        params = replace(params, ignored=tuple(k for k in params.ignored if k not in extra.known))
    return Admitted(session_id=session_id, log=log, peer=peer, params=params, grant=grant, wire_params=extra)
