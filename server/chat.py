"""``/api/chat``: admission of a websocket (origin, token, readiness, parameters, capacity), then its session.

Every refusal happens after ``accept`` so that the client gets a close code
and a reason it can act on (browsers hide HTTP status codes of failed
websocket handshakes): 1008 for origin, token or invalid parameters, 1013
for "starting" and "full", 1001 while draining. Refusals are counted in
``kame_sessions_rejected_total{reason}`` and cost no model work.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING

from fastapi import APIRouter, WebSocket
from kame.server import protocol
from kame.server.auth import origin_ok, token_ok, websocket_credentials
from kame.server.logs import session_logger
from kame.server.params import ParamError, parse_session_params
from kame.server.session import ChatSession
from kame.server.sessions import DRAIN_REASON

if TYPE_CHECKING:
    from kame.server.app import AppState

router = APIRouter()


async def _refuse(ws: WebSocket, state: AppState, label: str, code: int, reason: str, error: str | None = None) -> None:
    state.metrics.sessions_rejected.labels(reason=label).inc()
    with contextlib.suppress(Exception):  # the client may have gone already
        if error:
            await ws.send_bytes(protocol.encode_error(error))
        await ws.close(code=code, reason=protocol.close_reason(reason))


@router.websocket("/api/chat")
async def chat(ws: WebSocket) -> None:
    state: AppState = ws.app.state.kame
    cfg = state.cfg.server
    host = state.host
    creds = websocket_credentials(ws.headers, ws.query_params, list(ws.scope.get("subprotocols") or []))
    await ws.accept(subprotocol=creds.subprotocol)
    session_id = uuid.uuid4().hex[:12]
    log = session_logger(session_id)
    peer = f"{ws.client.host}:{ws.client.port}" if ws.client else "?"
    if not origin_ok(ws.headers.get("origin"), cfg.allowed_origins):
        log.warning("refused: origin not allowed", extra={"peer": peer, "origin": ws.headers.get("origin", "")[:100]})
        await _refuse(ws, state, "origin", protocol.CLOSE_POLICY, "origin not allowed")
        return
    if not token_ok(cfg.auth_token, creds.token):
        log.warning("refused: missing or wrong token", extra={"peer": peer})
        await _refuse(ws, state, "unauthorized", protocol.CLOSE_POLICY, "unauthorized")
        return
    if state.sessions.draining:
        await _refuse(ws, state, "draining", protocol.CLOSE_GOING_AWAY, DRAIN_REASON)
        return
    if not host.ready:
        await _refuse(ws, state, "starting", protocol.CLOSE_TRY_AGAIN_LATER, "server starting, retry later")
        return
    try:
        params = parse_session_params(
            ws.query_params,
            backends=host.backend_names() if host.backends is not None else None,
            oracle_policies=host.oracle_policies(),
        )
    except ParamError as exc:
        log.info("refused: %s", exc, extra={"peer": peer})
        await _refuse(ws, state, "bad_params", protocol.CLOSE_POLICY, "invalid query parameter", error=str(exc))
        return
    if host.free_slots <= 0:
        log.info("refused: server full", extra={"peer": peer})
        await _refuse(ws, state, "full", protocol.CLOSE_TRY_AGAIN_LATER, "server full, retry later")
        return
    recorder = None
    if cfg.record_dir is not None:
        from kame.server.recording import SessionRecorder

        recorder = SessionRecorder(
            cfg.record_dir,
            session_id,
            host.sample_rate,
            {"backend": params.backend, "oracle_policy": params.oracle_policy, "text_temperature": params.temp_text, "text_topk": params.top_k_text},
        )
    log.info("session accepted", extra={"peer": peer, "ignored_params": ",".join(params.ignored) or "-"})
    session = ChatSession(
        ws,
        session_id=session_id,
        host=host,
        metrics=state.metrics,
        cfg=cfg,
        params=params,
        log=log,
        recorder=recorder,
        protocol_metrics=getattr(ws.app.state, "kame_protocols", None),
    )
    state.sessions.add(session)
    try:
        await session.run()
    finally:
        state.sessions.remove(session)
