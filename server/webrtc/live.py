"""OpenAI's Live API over WebRTC: ``POST /v1/live/sessions``, its hangup and its sideband ``/attach``.

- ``POST /v1/live/sessions`` (the ``openai`` SDK's ``client.live.create``):
  JSON ``{session, transport: {type: "webrtc", sdp}}`` with the server's key
  (Live has no ephemeral keys). The session config is validated as
  ``session.start``'s would be (plus what only WebRTC has: ``client``, and no
  ``audio.format``), the offer answered as a Realtime call's
  (:func:`~kame.server.webrtc.signaling.answer_offer`), and the answer is
  ``200`` ``{session: {id}, transport: {type: "webrtc", sdp}}``. The session
  starts at once, through the same admission rules and slots as a websocket;
  ``session.started`` arrives on ``oai-events``
  (:class:`~kame.server.wires.live.rtp.LiveRtpWire`).
- ``POST /v1/live/sessions/{id}/hangup`` ends it (``accept``/``reject``/
  ``refer`` are SIP-only: 404).
- ``/v1/live/sessions/{id}/attach`` (websocket, the SDK's
  ``live.sideband.connect``): the trusted server's view of the same session
  (:func:`~kame.server.webrtc.sideband.attach_sideband`).

Refusals are JSON ``{"error": {...}}`` with one sentence, as on ``/v1/realtime/calls``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from kame.server.access.auth import token_ok
from kame.server.access.ephemeral import is_ephemeral
from kame.server.offers import live_info, live_wire_args
from kame.server.webrtc.sdp import OfferError
from kame.server.webrtc.sideband import attach_sideband
from kame.server.webrtc.signaling import (
    CallRefused,
    answer_call,
    call_request,
    checked_offer,
    error_response,
    hang_up,
    launch_call,
    preflight,
    refuse_call,
)
from kame.server.wires.live.channel import parse_permissions
from kame.server.wires.live.config import parse_start
from kame.server.wires.live.events import LiveError
from kame.server.wires.live.rtp import LiveRtpWire
from kame.server.wires.live.wire import KameLiveSettings, live_settings, refusal
from kame.session.settings import SessionSettings

router = APIRouter()

SESSIONS_PATH = "/v1/live/sessions"


@router.options(SESSIONS_PATH)
async def sessions_preflight(request: Request) -> Response:
    return preflight(request)


@router.options(SESSIONS_PATH + "/{session_id}/hangup")
async def hangup_preflight(request: Request, session_id: str) -> Response:
    return preflight(request)


def _sentence(message: str) -> str:
    """A wire error's message as the one sentence of an HTTP refusal."""
    message = message.strip().rstrip(".")
    return (message[:1].upper() + message[1:]).replace(". ", "; ") + "."


def _read_body(raw: bytes) -> tuple[dict[str, Any], str]:
    """(session, sdp) from the create request's JSON; :class:`OfferError` with the reason when it is not one."""
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise OfferError("The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise OfferError("The body must be a JSON object with \"session\" and \"transport\".")
    session, transport = body.get("session"), body.get("transport")
    if not isinstance(session, dict):
        raise OfferError("The body needs a \"session\" object (at least its model).")
    if not isinstance(transport, dict) or transport.get("type") != "webrtc":
        raise OfferError("The body needs transport {\"type\": \"webrtc\", \"sdp\": ...}; other transports connect "
                         "to the websocket at /v1/live/sessions.")
    sdp = transport.get("sdp")
    if not isinstance(sdp, str):
        raise OfferError("The transport needs \"sdp\": the browser's SDP offer as a string.")
    return session, sdp


@router.post(SESSIONS_PATH)
async def create_session(request: Request) -> Response:
    start = call_request(request)
    if isinstance(start, JSONResponse):
        return start
    state, cors, token = start.state, start.cors, start.token
    if is_ephemeral(token) or not token_ok(state.cfg.server.auth_token, token):
        return refuse_call(state, "unauthorized", 401, "Missing or wrong API key (a Live session needs the server's key).",
                           "invalid_api_key", cors)

    async def read() -> tuple[str, dict[str, Any]]:
        session, sdp = _read_body(await request.body())
        return sdp, session

    try:
        sdp, session = await checked_offer(start, read)
        session_id = uuid.uuid4().hex[:12]
        try:
            permissions = parse_permissions(session.get("client"))
            client = permissions.as_config() if session.get("client") is not None else None
            info = live_info(state, session_id, webrtc=True, client=client)
            settings = live_settings(SessionSettings(), KameLiveSettings())
            wire = LiveRtpWire(info, settings, permissions=permissions, **live_wire_args(state))
            parse_start(session, wire.live.info)  # refused here, with its reason, rather than on the channel
        except LiveError as exc:
            return refuse_call(state, "bad_params", 400, _sentence(exc.message), exc.code, cors)
        transport, answer = await answer_call(start, sdp, f"live_{session_id}")
    except CallRefused as refused:
        return refused.response
    if not permissions.unrestricted:
        transport.channel_allows = permissions.allows_message
    # The create request is the session.start: the wire takes it first, as a trusted client's.
    transport.inject({"type": "websocket.receive", "text": json.dumps({"type": "session.start", "session": session})})
    call = launch_call(state, transport, wire, settings, session_id, kind="live")
    return JSONResponse({"session": {"id": call.id}, "transport": {"type": "webrtc", "sdp": answer}}, headers=cors)


@router.post(SESSIONS_PATH + "/{session_id}/hangup")
async def hangup(request: Request, session_id: str) -> Response:
    return await hang_up(request, session_id, "live")


@router.post(SESSIONS_PATH + "/{session_id}/{action}")
async def sip_only(request: Request, session_id: str, action: str) -> JSONResponse:
    return error_response(404, f"/{action[:16]} is not available here: kame's Live sessions are WebRTC or websocket "
                          "(no SIP, forks or stored content); a WebRTC session ends with /hangup.", "not_found")


@router.websocket(SESSIONS_PATH + "/{session_id}/attach")
async def attach(ws: WebSocket, session_id: str) -> None:
    await attach_sideband(ws, session_id, "live", refusal)
