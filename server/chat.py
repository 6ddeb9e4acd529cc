"""``/api/chat``: admission of a websocket (:mod:`kame.server.admission`), then its
:class:`~kame.server.session.ChatSession`. Every refusal sends its reason (or
error) as a 0x05 text message before the close frame."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, WebSocket

from kame.server import protocol
from kame.server.admission import admit
from kame.server.session import ChatSession

if TYPE_CHECKING:
    from kame.server.app import AppState

router = APIRouter()


async def _send_error(ws: WebSocket, error: str) -> None:
    await ws.send_bytes(protocol.encode_error(error))


@router.websocket("/api/chat")
async def chat(ws: WebSocket) -> None:
    state: AppState = ws.app.state.kame
    cfg = state.cfg.server
    host = state.host
    admitted = await admit(ws, state, _send_error, send_reason=True)
    if admitted is None:
        return
    session_id, log, peer, params = admitted.session_id, admitted.log, admitted.peer, admitted.params
    recorder = None
    if cfg.record_dir is not None:
        from kame.server.recording import SessionRecorder

        recorder = SessionRecorder(
            cfg.record_dir,
            session_id,
            host.sample_rate,
            {"backend": params.backend, "oracle_policy": params.oracle_policy,
             "text_temperature": params.temp_text, "text_topk": params.top_k_text},
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
