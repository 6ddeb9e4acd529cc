"""``/v1/realtime``: admission of a websocket, then its :class:`RealtimeSession`.

The same checks in the same order as ``/api/chat`` (origin, token,
draining, readiness, query parameters, capacity: docs/protocol.md section
1), each refusal after ``accept`` with a close code and counted, none
costing model work; a refusal with a message also sends it as an ``error``
event first. OpenAI's SDKs build the URL from ``base_url``
(``http://host:port/v1`` -> ``ws://host:port/v1/realtime?model=...``).

:func:`install` adds the route and the per-protocol metrics to an app.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, WebSocket
from kame.server import protocol
from kame.server.auth import origin_ok, token_ok, websocket_credentials
from kame.server.logs import session_logger
from kame.server.params import ParamError, parse_session_params
from kame.server.realtime_events import EventEncoder, Ids, error_event
from kame.server.realtime_metrics import ProtocolMetrics
from kame.server.realtime_session import RealtimeSession
from kame.server.realtime_settings import RealtimeSettings, ServerInfo, settings_dict
from kame.server.sessions import DRAIN_REASON

if TYPE_CHECKING:
    from kame.server.app import AppState
    from kame.server.recording import SessionRecorder

router = APIRouter()
PATH = "/v1/realtime"


def install(app: FastAPI) -> None:
    """Serve ``/v1/realtime`` on ``app`` (after ``app.state.kame`` is set)."""
    state: AppState = app.state.kame
    app.state.kame_protocols = ProtocolMetrics(state.metrics.registry)
    app.include_router(router)


def protocol_metrics(app: Any) -> ProtocolMetrics:
    return app.state.kame_protocols  # type: ignore[no-any-return]


async def _refuse(ws: WebSocket, state: AppState, label: str, code: int, reason: str, error: str | None = None) -> None:
    state.metrics.sessions_rejected.labels(reason=label).inc()
    with contextlib.suppress(Exception):  # the client may have gone already
        if error:
            event = error_event("invalid_value", error)
            await ws.send_text(EventEncoder(Ids()).encode(event))
        await ws.close(code=code, reason=protocol.close_reason(reason))


def server_info(state: AppState, session_id: str, model: str) -> ServerInfo:
    host = state.host
    cfg = state.cfg
    registry = host.backends
    return ServerInfo(
        session_id=session_id,
        model=model,
        backends=tuple(host.backend_names()),
        default_backend=registry.default_name if registry is not None and registry.names else None,
        oracle_policies=tuple(host.oracle_policies()),
        default_oracle_policy=cfg.oracle.policy,
        default_barge_in=cfg.oracle.barge_in,
        default_oracle_delay_s=cfg.oracle.oracle_delay_s,
        default_instructions=cfg.oracle.instructions,
        asr_kind=cfg.asr.kind,
        record_available=cfg.server.record_dir is not None,
        idle_timeout_s=cfg.server.idle_timeout_s,
        max_duration_s=cfg.server.max_duration_s,
        input_buffer_s=cfg.server.input_buffer_s,
    )


@router.websocket(PATH)
async def realtime(ws: WebSocket) -> None:
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
    model = (ws.query_params.get("model") or "kame")[:64]
    info = server_info(state, session_id, model)
    settings = RealtimeSettings(
        backend=params.backend,
        oracle_policy=params.oracle_policy,
        text_temperature=params.temp_text,
        text_topk=params.top_k_text,
        record=cfg.record_dir is not None,
    )

    def new_recorder(current: RealtimeSettings) -> SessionRecorder | None:
        if cfg.record_dir is None:
            return None
        from kame.server.recording import SessionRecorder

        meta = {"protocol": "realtime", **settings_dict(current)}
        return SessionRecorder(cfg.record_dir, session_id, host.sample_rate, meta)

    log.info("session accepted", extra={"peer": peer, "protocol": "realtime", "ignored_params": ",".join(params.ignored) or "-"})
    session = RealtimeSession(
        ws,
        session_id=session_id,
        host=host,
        metrics=state.metrics,
        protocol_metrics=protocol_metrics(ws.app),
        cfg=cfg,
        info=info,
        settings=settings,
        log=log,
        new_recorder=new_recorder,
    )
    state.sessions.add(session)  # type: ignore[arg-type]  # duck-typed: id, end(), done
    try:
        await session.run()
    finally:
        state.sessions.remove(session)  # type: ignore[arg-type]
