"""A trusted server's websocket beside a WebRTC call (OpenAI's sideband): ``/v1/realtime?call_id=`` and
``/v1/live/sessions/{id}/attach``.

The page holds the call (audio, ``oai-events``); the server that created it
watches and steers the same session over a websocket: it gets every server
event the data channel gets (and those a Live session's
``client.data_channel.allowed_server_events`` withholds from the page), and
its client events (``session.update``, a function's output, ...) go to the
same wire and runtime, unfiltered. It needs the server's own key (an ``ek_``
key is the page's, not the server's) and holds no slot; it ends with the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import WebSocket
from starlette import status

from kame.server.access.admission import refuse
from kame.server.access.auth import origin_ok, token_ok, websocket_credentials
from kame.server.access.ephemeral import is_ephemeral
from kame.server.state import AppState
from kame.server.webrtc.signaling import calls_of
from kame.server.wires.realtime.wire import refusal

if TYPE_CHECKING:
    from kame.server.runtime.wire import Outgoing
    from kame.server.webrtc.signaling import CallKind


async def serve_sideband(ws: WebSocket) -> None:
    """``/v1/realtime?call_id=``."""

    await attach_sideband(ws, ws.query_params.get("call_id") or "", "realtime", refusal)


async def attach_sideband(ws: WebSocket, call_id: str, kind: CallKind, refusal: Callable[[str], Outgoing]) -> None:
    """Join ``ws`` to the live call ``call_id`` of this ``kind`` until either ends (``refusal`` words a
    refusal as the wire's ``error`` event, sent before the 1008 close)."""

    state: AppState = ws.app.state.kame
    cfg = state.cfg.server
    creds = websocket_credentials(ws.headers, ws.query_params, list(ws.scope.get("subprotocols") or []))
    await ws.accept(subprotocol=creds.subprotocol)

    async def send_error(sock: WebSocket, error: str) -> None:
        await sock.send_text(str(refusal(error).data))

    what = "call" if kind == "realtime" else "session"
    if not origin_ok(ws.headers.get("origin"), cfg.allowed_origins):
        await refuse(ws, state, "origin", status.WS_1008_POLICY_VIOLATION, "origin not allowed")
        return
    if is_ephemeral(creds.token) or not token_ok(cfg.auth_token, creds.token):
        await refuse(ws, state, "unauthorized", status.WS_1008_POLICY_VIOLATION, "unauthorized",
                     error=f"a {what}'s sideband needs the server's API key", send_error=send_error)
        return
    call = calls_of(state).live.get(call_id[:64])
    if call is None or call.kind != kind:
        await refuse(ws, state, "bad_params", status.WS_1008_POLICY_VIOLATION, f"no such {what}",
                     error=f"no such {what} (it ended, or never existed)", send_error=send_error)
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
