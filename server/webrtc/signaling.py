"""OpenAI's WebRTC signaling for ``/v1/realtime``: calls, hangup, client secrets; CORS for browser pages.

- ``POST /v1/realtime/calls`` (``Accept: application/sdp``): the browser flow
  posts the raw offer (``Content-Type: application/sdp``) with an ephemeral
  key; the server-side flow (the ``openai`` SDK's ``calls.create``) posts
  multipart ``sdp`` (application/sdp) and ``session`` (JSON) parts with the
  real key. The answer is ``201``, ``application/sdp``, ``Location:
  /v1/realtime/calls/{call_id}``. The call's session starts at once, through
  the same admission rules (draining, readiness, a free slot) and the same
  :class:`~kame.server.runtime.session.SessionRuntime` as a websocket, on a
  :class:`~kame.server.webrtc.transport.WebRtcTransport`.
- ``POST /v1/realtime/calls/{call_id}/hangup`` ends it (``accept``/``reject``/
  ``refer`` are SIP-only: 404).
- ``POST /v1/realtime/client_secrets`` mints an ``ek_`` key
  (:mod:`kame.server.access.ephemeral`), with the server's token when auth is on.

Refusals are JSON ``{"error": {...}}`` with one sentence, as OpenAI's: 400 bad
offer or session, 401 key, 403 origin, 503 starting/failed/draining/full.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kame.server.access.auth import bearer_token, origin_ok, token_ok
from kame.server.access.ephemeral import EphemeralGrant, EphemeralKeyError, is_ephemeral, ttl_seconds
from kame.server.offers import realtime_info
from kame.server.runtime.route import run_session
from kame.server.state import AppState
from kame.server.telemetry.logs import session_logger
from kame.server.webrtc.ice import rtc_configuration, with_public_address
from kame.server.webrtc.metrics import WebRtcMetrics
from kame.server.webrtc.sdp import OfferError, check_offer
from kame.server.webrtc.transport import WebRtcTransport, install_decoders, use_mono_opus, use_pass_through_jitter
from kame.server.wires.realtime.events import ClientError
from kame.server.wires.realtime.rtp import RealtimeRtpWire
from kame.server.wires.realtime.settings import parse_session_update, session_object
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB

if TYPE_CHECKING:
    from kame.server.runtime.session import SessionRuntime
    from kame.server.runtime.wire import Wire

log = logging.getLogger("kame.server.webrtc")
router = APIRouter()

CALLS_PATH = "/v1/realtime/calls"
SECRETS_PATH = "/v1/realtime/client_secrets"
ALLOW_HEADERS = "authorization, content-type, openai-beta, openai-organization, openai-project, x-stainless-lang"


#: The API a call belongs to: ``/v1/realtime/calls`` or ``/v1/live/sessions`` (each hangs up only its own).
CallKind = Literal["realtime", "live"]


@dataclass
class Call:
    """A live call: its session, its transport, and the key that opened it (it may hang it up)."""

    id: str
    runtime: SessionRuntime | None
    transport: WebRtcTransport
    key: str | None
    task: asyncio.Task[Any] | None = None
    kind: CallKind = "realtime"


class Calls:
    """The server's live calls and the WebRTC metrics (one per app, on ``AppState.calls``)."""

    def __init__(self, metrics: WebRtcMetrics) -> None:
        self.metrics = metrics
        self.live: dict[str, Call] = {}


def calls_of(state: AppState) -> Calls:
    if state.calls is None:
        state.calls = Calls(WebRtcMetrics(state.metrics.registry))
    calls: Calls = state.calls
    return calls


# --------------------------------------------------------------------------- answers


def cors_headers(request: Request, state: AppState) -> dict[str, str] | None:
    """CORS headers for this request's origin; None when a browser page of a foreign origin asks."""
    origin = request.headers.get("origin")
    if origin is None:
        return {}
    if not origin_ok(origin, state.cfg.server.allowed_origins):
        return None
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin", "Access-Control-Expose-Headers": "Location"}


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None,
           etype: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": etype, "code": code, "param": None}},
                        status_code=status, headers=headers or {})


def refuse_call(state: AppState, reason: str, status: int, message: str, code: str,
            headers: dict[str, str] | None = None) -> JSONResponse:
    calls_of(state).metrics.calls.labels(result=reason).inc()
    state.metrics.sessions_rejected.labels(reason=reason).inc()
    return error_response(status, message, code, headers)


def call_cors(request: Request, state: AppState) -> dict[str, str] | JSONResponse:
    """A call's CORS headers, or its refusal (counted) when a page of a foreign origin creates it."""
    cors = cors_headers(request, state)
    if cors is None:
        return refuse_call(state, "origin", 403, "This origin is not allowed to use this server.", "origin_not_allowed")
    return cors


def preflight(request: Request) -> Response:
    state: AppState = request.app.state.kame
    cors = cors_headers(request, state)
    if cors is None:
        return error_response(403, "This origin is not allowed to use this server.", "origin_not_allowed")
    asked = request.headers.get("access-control-request-headers")
    headers = {**cors, "Access-Control-Allow-Methods": "POST, OPTIONS",
               "Access-Control-Allow-Headers": asked or ALLOW_HEADERS, "Access-Control-Max-Age": "600"}
    return Response(status_code=204, headers=headers)


@router.options(CALLS_PATH)
async def calls_preflight(request: Request) -> Response:
    return preflight(request)


@router.options(CALLS_PATH + "/{call_id}/hangup")
async def hangup_preflight(request: Request, call_id: str) -> Response:
    return preflight(request)


@router.options(SECRETS_PATH)
async def secrets_preflight(request: Request) -> Response:
    return preflight(request)


# --------------------------------------------------------------------------- client secrets


@router.post(SECRETS_PATH)
async def create_client_secret(request: Request) -> Response:
    state: AppState = request.app.state.kame
    cors = cors_headers(request, state)
    if cors is None:
        return error_response(403, "This origin is not allowed to use this server.", "origin_not_allowed")
    token = bearer_token(request.headers.get("authorization"))
    if is_ephemeral(token) or not token_ok(state.cfg.server.auth_token, token):
        return error_response(401, "Minting a client secret needs the server's API key.", "invalid_api_key", cors)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        return error_response(400, "The body is not valid JSON.", "invalid_json", cors)
    if not isinstance(body, dict):
        return error_response(400, "The body must be a JSON object.", "invalid_json", cors)
    try:
        ttl = ttl_seconds(body.get("expires_after"))
    except EphemeralKeyError as exc:
        return error_response(400, str(exc), "invalid_value", cors)
    session = body.get("session") or {"type": "realtime"}
    settings, info, problem = _session_settings(state, session, None, uuid.uuid4().hex[:12])
    if problem is not None:
        return error_response(400, problem, "invalid_value", cors)

    try:
        key, grant = state.ephemeral_keys.mint(settings, session if isinstance(session, dict) else {}, ttl)
    except EphemeralKeyError as exc:  # a session config too large to carry
        return error_response(400, str(exc), "invalid_value", cors)
    obj = session_object(settings, grant.narrow(info))
    return JSONResponse({"value": key, "expires_at": int(grant.expires_at), "session": obj}, headers=cors)


def _session_settings(state: AppState, session: Any, grant: EphemeralGrant | None, session_id: str) -> tuple[Any, Any, str | None]:
    """(settings, info, None), or (None, None, the one-sentence reason) for a ``session`` config."""

    model = "kame"
    if isinstance(session, dict) and isinstance(session.get("model"), str):
        model = session["model"][:64]
    info = realtime_info(state, session_id, model)
    base = SessionSettings()
    if grant is not None:
        info = grant.narrow(info)
        base = grant.settings
    if session is None:
        return base, info, None
    if isinstance(session, dict) and session.get("type") == "transcription":
        return None, None, "Transcription sessions are not supported: session.type must be \"realtime\"."
    try:
        settings, _ignored = parse_session_update(session, base, info)
    except ClientError as exc:
        return None, None, exc.message.rstrip(".") + "."
    return settings, info, None


# --------------------------------------------------------------------------- calls


async def _read_offer(request: Request) -> tuple[str, Any]:
    """(sdp, session config or None) from either flow; :class:`OfferError` when neither."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        try:
            form = await request.form()
        except Exception:  # noqa: BLE001 - starlette's parser errors are many
            raise OfferError("The multipart body could not be parsed.") from None
        sdp_part = form.get("sdp")
        session_part = form.get("session")
        sdp = await _part_text(sdp_part)
        session: Any = None
        if session_part is not None:
            text = await _part_text(session_part)
            try:
                session = json.loads(text or "")
            except ValueError:
                raise OfferError("The multipart \"session\" part is not valid JSON.") from None
            if not isinstance(session, dict):
                raise OfferError("The multipart \"session\" part must be a JSON object.")
        if sdp is None:
            raise OfferError("The multipart body has no \"sdp\" part.")
        return sdp, session
    if ctype in ("application/sdp", "text/plain", ""):
        body = await request.body()
        try:
            return body.decode("utf-8"), None
        except UnicodeDecodeError:
            raise OfferError("The SDP offer is not UTF-8 text.") from None
    raise OfferError("Send the SDP offer as application/sdp, or as multipart/form-data with an \"sdp\" part.")


async def _part_text(part: Any) -> str | None:
    if part is None:
        return None
    if isinstance(part, str):
        return part
    data = await part.read()
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)


@router.post(CALLS_PATH)
async def create_call(request: Request) -> Response:
    start = call_request(request)
    if isinstance(start, JSONResponse):
        return start
    state, cors, token = start.state, start.cors, start.token
    cfg = state.cfg.server
    grant = None
    if is_ephemeral(token):
        grant = state.ephemeral_keys.lookup(token)
        if grant is None:
            return refuse_call(state, "unauthorized", 401, "The ephemeral key is unknown or has expired.", "invalid_api_key", cors)
    elif not token_ok(cfg.auth_token, token):
        return refuse_call(state, "unauthorized", 401, "Missing or wrong API key.", "invalid_api_key", cors)
    try:
        sdp, session = await checked_offer(start, lambda: _read_offer(request))
        session_id = uuid.uuid4().hex[:12]
        settings, info, problem = _session_settings(state, session, grant, session_id)
        if problem is not None:
            return refuse_call(state, "bad_params", 400, problem, "invalid_value", cors)
        settings = replace(settings, record=settings.record and cfg.record_dir is not None)
        transport, answer = await answer_call(start, sdp, f"rtc_{session_id}")
    except CallRefused as refused:
        return refused.response

    host = state.host
    vocab = host.models.vocab if host.models is not None else MOSHI_VOCAB
    wire = RealtimeRtpWire(info, settings, host.frame_size, vocab)
    call = launch_call(state, transport, wire, settings, session_id, key=token if grant is not None else None)
    headers = {**cors, "Location": f"{CALLS_PATH}/{call.id}"}
    return Response(answer, status_code=201, media_type="application/sdp", headers=headers)


@dataclass(frozen=True)
class CallRequest:
    """What every call-creating POST reads first: the server's state, the CORS headers its answers carry,
    and the bearer token (None when absent)."""

    state: AppState
    cors: dict[str, str]
    token: str | None


def call_request(request: Request) -> CallRequest | JSONResponse:
    """The :class:`CallRequest` of ``request``, or its refusal when its page's origin is not allowed."""
    state: AppState = request.app.state.kame
    cors = call_cors(request, state)
    if isinstance(cors, JSONResponse):
        return cors
    return CallRequest(state, cors, bearer_token(request.headers.get("authorization")))


class CallRefused(Exception):
    """A call-creating request refused on the way to its answer; ``response`` is the refusal (counted)."""

    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


async def checked_offer(start: CallRequest, read: Callable[[], Awaitable[tuple[str, Any]]]) -> tuple[str, Any]:
    """The request's (SDP offer, session) as ``read`` finds them, once the offer and the server's admission
    allow the call; raises :class:`CallRefused` (400 bad offer, or :func:`offer_refusal`'s) otherwise."""
    try:
        sdp, session = await read()
    except OfferError as exc:
        raise CallRefused(refuse_call(start.state, "bad_offer", 400, str(exc), "invalid_offer", start.cors)) from None
    refused = offer_refusal(start.state, sdp, start.cors)
    if refused is not None:
        raise CallRefused(refused)
    return sdp, session


async def answer_call(start: CallRequest, sdp: str, call_id: str) -> tuple[WebRtcTransport, str]:
    """:func:`answer_offer`, its :class:`OfferError` as the call's 400 refusal (:class:`CallRefused`)."""
    try:
        return await answer_offer(start.state, sdp, call_id)
    except OfferError as exc:
        raise CallRefused(refuse_call(start.state, "bad_offer", 400, str(exc), "invalid_offer", start.cors)) from None


def offer_refusal(state: AppState, sdp: str, cors: dict[str, str]) -> JSONResponse | None:
    """The refusal of an offer kame cannot answer (:func:`check_offer`) or of a call the server cannot take
    now (:func:`admission_refusal`), in that order, or None."""
    try:
        check_offer(sdp)
    except OfferError as exc:
        return refuse_call(state, "bad_offer", 400, str(exc), "invalid_offer", cors)
    return admission_refusal(state, cors)


def admission_refusal(state: AppState, cors: dict[str, str]) -> JSONResponse | None:
    """The refusal of a call the server cannot take now (draining, failed, starting, full), or None: the
    same rules, in the same order, as a websocket's admission."""
    host = state.host
    if state.sessions.draining:
        return refuse_call(state, "draining", 503, "The server is shutting down; retry on another.", "server_draining", cors)
    if host.failed:
        return refuse_call(state, "failed", 503, "The server failed; retry later.", "server_failed", cors)
    if not host.ready:
        return refuse_call(state, "starting", 503, "The server is starting; retry in a few seconds.", "server_starting", cors)
    if host.free_slots <= 0:
        return refuse_call(state, "full", 503, "The server is full; retry later.", "server_full", {**cors, "Retry-After": "1"})
    return None


async def answer_offer(state: AppState, sdp: str, call_id: str) -> tuple[WebRtcTransport, str]:
    """A peer connection answering ``sdp``, its transport named ``call_id`` (:class:`OfferError` when aiortc
    cannot answer)."""
    # deferred: aiortc loads with the first WebRTC call (a server without calls never imports it)
    from aiortc import RTCPeerConnection, RTCSessionDescription

    install_decoders()
    cfg = state.cfg.server
    pc = RTCPeerConnection(rtc_configuration(cfg))
    transport = WebRtcTransport(pc, call_id=call_id, connect_timeout_s=cfg.webrtc_connect_timeout_s,
                                metrics=calls_of(state).metrics, input_delay_s=cfg.webrtc_input_delay_s)
    try:
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except Exception as exc:  # noqa: BLE001 - aiortc raises ValueError, KeyError, IndexError... on bad SDP
            raise OfferError(f"The SDP offer could not be parsed ({exc.__class__.__name__}).") from None
        audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise OfferError("The SDP offer has no audio media section; add an audio track or transceiver.")
        pc.addTrack(transport.output_track)
        jitters = [use_pass_through_jitter(t.receiver) for t in audio]
        answer = await pc.createAnswer()
        await pc.setLocalDescription(answer)
        local = pc.localDescription.sdp
        if cfg.webrtc_public_address:
            local = with_public_address(local, cfg.webrtc_public_address)
        if "m=audio 0 " in local:
            raise OfferError("The SDP offer's audio has no codec in common with kame (Opus, PCMU or PCMA).")
        for t, jitter in zip(audio, jitters, strict=True):
            if not transport.use_native_opus(t.sender, jitter, local):
                use_mono_opus(t.sender, local)
    except OfferError:
        await pc.close()
        raise
    except Exception as exc:  # noqa: BLE001
        await pc.close()
        log.warning("answering an offer failed: %s", exc.__class__.__name__)
        raise OfferError(f"The SDP offer could not be answered ({exc.__class__.__name__}).") from None
    return transport, local


def launch_call(state: AppState, transport: WebRtcTransport, wire: Wire, settings: SessionSettings, session_id: str,
                *, key: str | None = None, kind: CallKind = "realtime") -> Call:
    """Register the answered call and run its session (``wire`` on ``transport``) in a task of its own:
    the HTTP answer goes back at once, the session lives until the call ends."""
    calls = calls_of(state)
    calls.metrics.calls.labels(result="answered").inc()
    call = Call(transport.call_id, None, transport, key, kind=kind)
    calls.live[call.id] = call
    call.task = asyncio.create_task(_run_call(state, call, wire, settings, session_id), name=f"kame-call-{call.id}")
    return call


async def _run_call(state: AppState, call: Call, wire: Wire, settings: SessionSettings, session_id: str) -> None:
    slog = session_logger(session_id)
    slog.info("session accepted", extra={"peer": "webrtc", "protocol": wire.protocol, "call": call.id})

    def started(runtime: SessionRuntime) -> None:
        call.runtime = runtime

    try:
        await run_session(state, call.transport, wire, settings, session_id, slog,
                          input_buffer_s=state.cfg.server.input_buffer_s, started=started)
    except Exception:
        slog.exception("call %s failed", call.id)
    finally:
        await call.transport.shutdown()
        calls_of(state).live.pop(call.id, None)


@router.post(CALLS_PATH + "/{call_id}/hangup")
async def hangup(request: Request, call_id: str) -> Response:
    return await hang_up(request, call_id, "realtime")


async def hang_up(request: Request, call_id: str, kind: CallKind) -> Response:
    """End the call ``call_id`` of this ``kind`` (the server's key, or the ``ek_`` key that opened it)."""
    state: AppState = request.app.state.kame
    cors = cors_headers(request, state)
    if cors is None:
        return error_response(403, "This origin is not allowed to use this server.", "origin_not_allowed")
    call = calls_of(state).live.get(call_id[:64])
    if call is not None and call.kind != kind:
        call = None
    token = bearer_token(request.headers.get("authorization"))
    own_key = call is not None and call.key is not None and token == call.key
    if not own_key and (is_ephemeral(token) or not token_ok(state.cfg.server.auth_token, token)):
        return error_response(401, "Missing or wrong API key.", "invalid_api_key", cors)
    what = "call" if kind == "realtime" else "session"
    if call is None:
        return error_response(404, f"No such {what} (it ended, or never existed).", f"{what}_not_found", cors)
    if call.runtime is not None:
        call.runtime.end("hangup", None, "hung up")
    else:
        await call.transport.shutdown()
    deadline = time.monotonic() + 3.0
    while call.id in calls_of(state).live and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return Response(status_code=200, headers=cors)


@router.post(CALLS_PATH + "/{call_id}/{action}")
async def sip_only(request: Request, call_id: str, action: str) -> Response:
    return error_response(404, f"/{action[:16]} is for SIP calls; a WebRTC call is answered by its offer and ended by /hangup.",
                  "not_found")
