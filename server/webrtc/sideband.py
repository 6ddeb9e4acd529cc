"""``/v1/realtime?call_id=``: a trusted server's websocket beside a WebRTC call (OpenAI's sideband).

The page holds the call (audio, ``oai-events``); the server that created it
watches and steers the same session over a websocket: it gets every server
event the data channel gets, and its client events (``session.update``, a
function's output, ...) go to the same wire and runtime. It needs the server's
own key (an ``ek_`` key is the page's, not the server's) and holds no slot;
it ends with the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import WebSocket
from starlette import status

from kame.server.access.admission import refuse
from kame.server.access.auth import origin_ok, token_ok, websocket_credentials
from kame.server.access.ephemeral import is_ephemeral
from kame.server.wires.realtime.wire import refusal

if TYPE_CHECKING:
    from kame.server.app.factory import AppState


async def serve_sideband(ws: WebSocket) -> None:
    from kame.server.webrtc.signaling import calls_of

    state: AppState = ws.app.state.kame
    cfg = state.cfg.server
    creds = websocket_credentials(ws.headers, ws.query_params, list(ws.scope.get("subprotocols") or []))
    await ws.accept(subprotocol=creds.subprotocol)

    async def send_error(sock: WebSocket, error: str) -> None:
        await sock.send_text(str(refusal(error).data))

    if not origin_ok(ws.headers.get("origin"), cfg.allowed_origins):
        await refuse(ws, state, "origin", status.WS_1008_POLICY_VIOLATION, "origin not allowed")
        return
    if is_ephemeral(creds.token) or not token_ok(cfg.auth_token, creds.token):
        await refuse(ws, state, "unauthorized", status.WS_1008_POLICY_VIOLATION, "unauthorized",
                     error="a call's sideband needs the server's API key", send_error=send_error)
        return
    call = calls_of(state).live.get((ws.query_params.get("call_id") or "")[:64])
    if call is None:
        await refuse(ws, state, "bad_params", status.WS_1008_POLICY_VIOLATION, "no such call",
                     error="no such call (it ended, or never existed)", send_error=send_error)
        return
    transport = call.transport
    transport.attach(ws)
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            transport.from_sideband(message)
    finally:
        transport.detach(ws)
