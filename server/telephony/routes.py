"""OpenAI's call control for SIP calls: ``/v1/realtime/calls/{call_id}/accept|reject|refer|hangup`` and
``/v1/live/sessions/{session_id}/accept|reject|refer|hangup``.

The bodies and answers are OpenAI's (what the ``openai`` SDK's ``client.realtime.calls.*`` and
``client.live.sessions.*`` send): accept takes a Realtime session config (``type: "realtime"``) or the
Live API's ``{"session": {...}}``; reject an optional ``status_code`` (603 when absent; the Live API's is
required, 300-699); refer a ``target_uri`` (``sip:``, ``sips:``, ``tel:``); each answers 200 with no
body. They need the server's key (401), find the call or answer 404 ``call_not_found``. ``/hangup``
ends a ringing SIP call (603) here, and anything else (an answered call, a WebRTC call) as before.
Registered before the WebRTC routes, which answer 404 for these actions when SIP is off.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from kame.server.access.auth import bearer_token, token_ok
from kame.server.access.ephemeral import is_ephemeral
from kame.server.telephony import decisions
from kame.server.telephony.stack import AcceptError, Pending, sip_of

if TYPE_CHECKING:
    from kame.server.state import AppState

router = APIRouter()

REALTIME = "/v1/realtime/calls/{call_id}"
LIVE = "/v1/live/sessions/{call_id}"


async def _control(request: Request, call_id: str, api: str, action: str) -> Response:
    from kame.server.webrtc.signaling import error_response, hang_up

    state: AppState = request.app.state.kame
    service = sip_of(state)
    if action == "hangup" and (service is None or not isinstance(service.find(call_id, api), Pending)):
        return await hang_up(request, call_id, "live" if api == "live" else "realtime")
    token = bearer_token(request.headers.get("authorization"))
    if is_ephemeral(token) or not token_ok(state.cfg.server.auth_token, token):
        return error_response(401, "Missing or wrong API key (call control needs the server's key).", "invalid_api_key")
    if service is None:
        return error_response(404, f"/{action} is for SIP calls, and SIP is off on this server (sip.port).", "not_found")
    try:
        body: Any = json.loads(await request.body() or b"{}")
    except (ValueError, RecursionError):
        return error_response(400, "The body is not valid JSON.", "invalid_json")
    try:
        if action == "accept":
            service.accept(call_id, api, body)
        elif action == "reject":
            status = decisions.reject_status(body, required=api == "live")
            if isinstance(status, str):
                return error_response(400, status, "invalid_value")
            service.reject(call_id, api, status)
        elif action == "refer":
            target = decisions.refer_target(body)
            if target is None:
                return error_response(400, "target_uri must be a nonblank sip:, sips: or tel: URI.", "invalid_value")
            service.refer(call_id, api, target)
        else:
            found = service.find(call_id, api)
            if isinstance(found, Pending):
                service.hangup_pending(found)
    except AcceptError as exc:
        return error_response(exc.status, exc.message, exc.code)
    return Response(status_code=200)


def _add(prefix: str, api: str) -> None:
    for action in ("accept", "reject", "refer", "hangup"):
        async def endpoint(request: Request, call_id: str, _action: str = action) -> Response:
            return await _control(request, call_id, api, _action)

        router.add_api_route(f"{prefix}/{action}", endpoint, methods=["POST"], name=f"sip_{api}_{action}")


_add(REALTIME, "realtime")
_add(LIVE, "live")
