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

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, WebSocket

from kame.server.admission import admit
from kame.server.realtime_events import EventEncoder, Ids, error_event
from kame.server.realtime_metrics import ProtocolMetrics
from kame.server.realtime_session import RealtimeSession
from kame.server.realtime_settings import RealtimeSettings, ServerInfo, settings_dict

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
    metrics: ProtocolMetrics = app.state.kame_protocols
    return metrics


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


async def _send_error(ws: WebSocket, error: str) -> None:
    await ws.send_text(EventEncoder(Ids()).encode(error_event("invalid_value", error)))


@router.websocket(PATH)
async def realtime(ws: WebSocket) -> None:
    state: AppState = ws.app.state.kame
    cfg = state.cfg.server
    host = state.host
    admitted = await admit(ws, state, _send_error)
    if admitted is None:
        return
    session_id, log, peer, params = admitted.session_id, admitted.log, admitted.peer, admitted.params
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
    state.sessions.add(session)
    try:
        await session.run()
    finally:
        state.sessions.remove(session)
