"""The Twilio endpoints (the I/O around the pure modules beside it): ``/twilio/voice`` and ``/twilio/media``.

``POST`` (or ``GET``) ``/twilio/voice`` is the phone number's voice webhook:
it checks ``X-Twilio-Signature`` (with ``twilio.auth_token``; else the
server's bearer token, if any, as a ``token`` query parameter) and answers
the TwiML of :mod:`.twiml`, whose ``<Parameter>`` elements carry the
webhook URL's query parameters (``?backend=...&instructions=...``: what the
call's session chooses) and the caller's ``From``/``To``/``CallSid``; busy
when no slot is free. ``/twilio/media`` checks the upgrade's signature (403
before the handshake), admits the socket like every other wire, waits
``twilio.start_timeout_s`` for ``start``, then runs the call as a session of
:class:`~.wire.TwilioWire`: the same batch, slots, back-ends, limits and drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import Response
from starlette import status

from kame.server.access.admission import admit
from kame.server.access.auth import http_token, token_ok
from kame.server.access.params import ParamError
from kame.server.runtime.route import run_session
from kame.server.wires.twilio import protocol, signature, twiml
from kame.server.wires.twilio.metrics import TwilioMetrics
from kame.server.wires.twilio.params import call_settings
from kame.server.wires.twilio.wire import PATH, TwilioWire
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB

if TYPE_CHECKING:
    from kame.server.state import AppState
    from kame.server.telemetry.logs import SessionLogger

VOICE_PATH = "/twilio/voice"
#: A webhook's form body larger than this is refused (Twilio's are a few kilobytes).
MAX_WEBHOOK_BYTES = 64 * 1024
#: Query parameters of the webhook URL that are not passed on to the stream.
NOT_PASSED = frozenset({"token"})
XML = "text/xml"
#: Messages read while waiting for ``start`` (Twilio sends one, ``connected``).
MAX_BEFORE_START = 50

log = logging.getLogger("kame.server.twilio")
router = APIRouter()


def _metrics(app: FastAPI) -> TwilioMetrics:
    metrics: TwilioMetrics = app.state.kame_twilio
    return metrics


def install(app: FastAPI) -> None:
    """Serve the Twilio endpoints on ``app`` (after ``app.state.kame`` is set)."""
    state: AppState = app.state.kame
    app.state.kame_twilio = TwilioMetrics(state.metrics.registry)
    app.include_router(router)
    app.add_api_websocket_route(PATH, media, name="twilio")


@router.api_route(VOICE_PATH, methods=["POST", "GET"], include_in_schema=False)
async def voice(request: Request) -> Response:
    state: AppState = request.app.state.kame
    metrics = _metrics(request.app)
    cfg = state.cfg.twilio
    declared = request.headers.get("content-length", "0")
    if not declared.isdigit() or int(declared) > MAX_WEBHOOK_BYTES:
        return Response("request too large", status_code=413)
    body = await request.body()
    if len(body) > MAX_WEBHOOK_BYTES:
        return Response("request too large", status_code=413)
    form = parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True) if request.method == "POST" else []
    peer = request.client.host if request.client else "?"
    if cfg.auth_token is not None:
        url = signature.public_url(cfg.public_url, request.headers, request.url.scheme, request.url.path, request.url.query)
        if not signature.valid(cfg.auth_token.get_secret_value(), request.headers.get("x-twilio-signature"), url, form):
            log.warning("twilio webhook refused: bad X-Twilio-Signature", extra={"peer": peer, "url": _no_query(url)})
            metrics.webhooks.labels(result="bad_signature").inc()
            return Response("invalid signature", status_code=403)
    elif not token_ok(state.cfg.server.auth_token, http_token(request.headers, request.query_params)):
        log.warning("twilio webhook refused: missing or wrong token", extra={"peer": peer})
        metrics.webhooks.labels(result="unauthorized").inc()
        return Response("unauthorized", status_code=401)
    host = state.host
    if state.sessions.draining or not host.ready or host.failed or host.free_slots <= 0:
        log.info("twilio call refused: busy", extra={"peer": peer, "free": host.free_slots, "ready": host.ready})
        metrics.webhooks.labels(result="busy").inc()
        return Response(twiml.reject_busy(), media_type=XML)
    stream_url = signature.public_url(cfg.public_url, request.headers, "wss" if _secure(request) else "ws", PATH)
    fields = dict(form) if request.method == "POST" else dict(request.query_params)
    params = {k: v for k, v in request.query_params.items() if k not in NOT_PASSED and k not in twiml.PASSED_THROUGH}
    params |= {k: fields[k] for k in twiml.PASSED_THROUGH if fields.get(k)}
    cut = [k for k, v in params.items() if len(k) + len(v) > twiml.MAX_PARAMETER_CHARS]
    if cut:
        log.warning("twilio call: parameters cut to Twilio's %d characters (name and value): %s",
                    twiml.MAX_PARAMETER_CHARS, ",".join(cut))
    metrics.webhooks.labels(result="connected").inc()
    log.info("twilio call: connecting its stream", extra={"peer": peer, "call_sid": fields.get("CallSid", "")[:64],
                                                          "stream_url": stream_url, "parameters": ",".join(sorted(params))})
    return Response(twiml.connect_stream(stream_url, params), media_type=XML)


def _no_query(url: str) -> str:
    """A URL for the log: its query string may hold a token."""
    return url.partition("?")[0][:200]


def _secure(request: Request) -> bool:
    proto = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return (proto or request.url.scheme) == "https"


async def _no_message(ws: WebSocket, error: str) -> None:
    """Twilio's protocol has no error message: a refusal is the close alone (admission logs its reason)."""


async def media(ws: WebSocket) -> None:
    state: AppState = ws.app.state.kame
    metrics = _metrics(ws.app)
    cfg = state.cfg.twilio
    peer = f"{ws.client.host}:{ws.client.port}" if ws.client else "?"
    if cfg.auth_token is not None:
        url = signature.public_url(cfg.public_url, ws.headers, ws.url.scheme, ws.url.path, ws.url.query)
        if not signature.valid(cfg.auth_token.get_secret_value(), ws.headers.get("x-twilio-signature"), url):
            log.warning("twilio stream refused: bad X-Twilio-Signature", extra={"peer": peer, "url": _no_query(url)})
            metrics.calls.labels(result="bad_signature").inc()
            state.metrics.sessions_rejected.labels(reason="unauthorized").inc()
            await ws.close(code=status.WS_1008_POLICY_VIOLATION)  # before the handshake: HTTP 403
            return
    admitted = await admit(ws, state, _no_message, authenticated=cfg.auth_token is not None)
    if admitted is None:
        metrics.calls.labels(result="refused").inc()
        return
    start = await _wait_for_start(ws, cfg.start_timeout_s, admitted.log, peer)
    if start is None:
        metrics.calls.labels(result="no_start").inc()
        return
    if isinstance(start, str):
        metrics.calls.labels(result="bad_start").inc()
        await _close(ws, status.WS_1008_POLICY_VIOLATION, start)
        return
    host = state.host
    catalog = getattr(host.models, "voices", None)
    base = SessionSettings(record=state.cfg.server.record_dir is not None)
    # the stream URL's query (Telnyx's may have one; Twilio's has none) under the start's custom parameters
    given = {k: v for k, v in ws.query_params.items() if k != "token"} | start.custom_parameters
    try:
        chosen = call_settings(given, base,
                               backends=host.backend_names() if host.backends is not None else None,
                               mcp_servers=host.tools.mcp_server_names if host.tools is not None else (), voices=catalog)
    except ParamError as exc:
        admitted.log.info("twilio call refused: %s", exc, extra={"peer": peer, "call_sid": start.call_sid})
        metrics.calls.labels(result="bad_params").inc()
        state.metrics.sessions_rejected.labels(reason="bad_params").inc()
        await _close(ws, status.WS_1008_POLICY_VIOLATION, "invalid custom parameter")
        return
    for notice in chosen.notices:
        admitted.log.info("twilio parameter: %s", notice)

    def on_dtmf(digit: str) -> None:
        metrics.dtmf.inc()
        admitted.log.info("twilio dtmf: the caller pressed %s", digit, extra={"call_sid": start.call_sid})

    vocab = host.models.vocab if host.models is not None else MOSHI_VOCAB
    wire = TwilioWire(start, chosen.settings, frame_size=host.frame_size, vocab=vocab, on_dtmf=on_dtmf)
    admitted.log.info("session accepted", extra={
        "peer": peer, "protocol": wire.protocol, "call_sid": start.call_sid, "stream_sid": start.stream_sid,
        "encoding": start.encoding, "parameters": ",".join(sorted(start.custom_parameters)) or "-"})
    metrics.calls.labels(result="answered").inc()
    try:
        await run_session(state, ws, wire, chosen.settings, admitted.session_id, admitted.log,
                          input_buffer_s=state.cfg.server.input_buffer_s)
    finally:
        metrics.clears.inc(wire.clears)
        metrics.marks_played.inc(wire.marks_played)


async def _wait_for_start(ws: WebSocket, timeout_s: float, log: SessionLogger, peer: str) -> protocol.Start | str | None:
    """Read ``connected`` and ``start``: the start, a reason to refuse (a message that is not Twilio's), or None when
    the socket went away or sent no start in time (closed here, logged)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(MAX_BEFORE_START):
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            message = await asyncio.wait_for(ws.receive(), left)
        except (TimeoutError, asyncio.TimeoutError):
            log.warning("twilio stream closed: no start message within %.1f s", timeout_s, extra={"peer": peer})
            await _close(ws, status.WS_1008_POLICY_VIOLATION, "no start message")
            return None
        if message["type"] == "websocket.disconnect":
            log.info("twilio stream closed by the client before its start message", extra={"peer": peer})
            return None
        try:
            msg = protocol.decode(message.get("text") if message.get("text") is not None else message.get("bytes"))
        except protocol.ProtocolError as exc:
            log.warning("twilio stream refused: %s", exc, extra={"peer": peer})
            return f"not a Media Streams message: {exc}"
        if isinstance(msg, protocol.Start):
            return msg
        if isinstance(msg, protocol.Stop):
            log.info("twilio stream stopped before its start message", extra={"peer": peer})
            await _close(ws, status.WS_1000_NORMAL_CLOSURE, "stopped")
            return None
        # connected (and anything sent early, which Twilio does not do) waits for the start
    log.warning("twilio stream refused: %d messages and no start", MAX_BEFORE_START, extra={"peer": peer})
    return f"{MAX_BEFORE_START} messages before a start message"


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):  # the client may have gone already
        await ws.close(code=code, reason=reason)
