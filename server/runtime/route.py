"""A websocket endpoint for a wire: admission, then one :class:`~kame.server.runtime.session.SessionRuntime`.

Every wire's endpoint is this code: the checks of :mod:`kame.server.access.admission`
(origin, token, draining, readiness, query parameters, capacity; a refusal's
message worded by the wire), the wire and the session settings built by the
wire's ``open``, then the runtime until the socket closes. :func:`add_wire`
registers a :class:`WireRoute` on an app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI, WebSocket

from kame.server.access.admission import Admitted, admit
from kame.server.access.params import ParseWireParams
from kame.server.runtime.recording import SessionRecorder
from kame.server.runtime.session import SessionRuntime
from kame.server.runtime.wire import Outgoing, Wire
from kame.server.state import AppState
from kame.session.settings import SessionSettings

if TYPE_CHECKING:
    from kame.server.runtime.recording import SessionRecorder
    from kame.server.runtime.resume import ResumeHook
    from kame.server.runtime.transport import Transport
    from kame.server.telemetry.logs import SessionLogger


@dataclass(frozen=True)
class WireRoute:
    """How a wire is served.

    ``open(state, admitted, ws)`` builds the session's wire and its settings from what admission found
    (the query string's settings are in ``admitted.params``); ``refusal(message)`` words an admission
    refusal; ``input_buffer_s(state)`` is how much audio ahead of real time waits instead of being
    dropped (0 for clients that pace themselves).
    """

    protocol: str
    path: str
    open: Callable[[AppState, Admitted, WebSocket], tuple[Wire, SessionSettings]]
    refusal: Callable[[str], Outgoing]
    input_buffer_s: Callable[[AppState], float] = lambda state: 0.0
    #: Every refusal's reason goes out through ``refusal`` before the close, not only errors.
    send_reason: bool = False
    #: ``ek_`` keys (:mod:`kame.server.access.ephemeral`) admit a session (``/v1/realtime``).
    ephemeral_keys: bool = False
    #: A request this serves itself instead of a session (``/v1/realtime?call_id=``): True when it did.
    sideband: Callable[[WebSocket], Awaitable[bool]] | None = None
    #: The wire's own query parameters, checked at admission (``Admitted.wire_params``).
    params: ParseWireParams | None = None


async def serve(ws: WebSocket, route: WireRoute) -> None:
    state: AppState = ws.app.state.kame

    async def send_error(sock: WebSocket, error: str) -> None:
        out = route.refusal(error)
        await (sock.send_bytes(out.data) if isinstance(out.data, bytes) else sock.send_text(out.data))

    if route.sideband is not None and await route.sideband(ws):
        return
    if "resume" in ws.query_params:  # a client back with its handle (server/runtime/resume_route.py)
        from kame.server.runtime.resume_route import serve_resume

        await serve_resume(ws, state, route, ws.query_params["resume"])
        return
    admitted = await admit(ws, state, send_error, send_reason=route.send_reason, ephemeral=route.ephemeral_keys,
                           wire_params=route.params)
    if admitted is None:
        return
    wire, settings = route.open(state, admitted, ws)
    admitted.log.info("session accepted", extra={"peer": admitted.peer, "protocol": route.protocol,
                                                 "ignored_params": ",".join(admitted.params.ignored) or "-"})
    await run_session(state, ws, wire, settings, admitted.session_id, admitted.log, input_buffer_s=route.input_buffer_s(state),
                      resume=resume_hook(state, ws, wire, admitted))


def resume_hook(state: AppState, ws: WebSocket, wire: Wire, admitted: Admitted) -> ResumeHook | None:
    """The resume side of a session on a wire that can carry handles (server/runtime/resume.py): the handle
    goes out once the client asks for it (Realtime: kame's events, also when turned on later), else None."""
    from kame.server.access.auth import websocket_credentials
    from kame.server.runtime.resume import ResumeHook, ResumeWire, binding_of, registry_of

    cfg = state.cfg.server
    if cfg.resume_grace_s <= 0 or not isinstance(wire, ResumeWire):
        return None
    creds = websocket_credentials(ws.headers, ws.query_params, list(ws.scope.get("subprotocols") or []))
    grant = admitted.grant
    binding = binding_of(creds.token if grant is None else None, grant.session if grant is not None else None)
    return ResumeHook(registry_of(ws.app.state, cfg, lambda: state.sessions.draining), binding, wire)


async def run_session(state: AppState, transport: WebSocket | Transport, wire: Wire, settings: SessionSettings,
                      session_id: str, log: SessionLogger, *, input_buffer_s: float = 0.0,
                      started: Callable[[SessionRuntime], None] | None = None,
                      resume: ResumeHook | None = None) -> SessionRuntime:
    """One session's runtime on ``transport`` until it ends, registered with the server's sessions
    (``started`` sees it first: a WebRTC call keeps it for hangup and the sideband)."""
    cfg = state.cfg.server
    host = state.host

    def new_recorder(current: SessionSettings) -> SessionRecorder | None:
        if cfg.record_dir is None:
            return None

        return SessionRecorder(cfg.record_dir, session_id, host.sample_rate, {"protocol": wire.protocol, **current.for_log()})

    runtime = SessionRuntime(
        transport,
        wire,
        session_id=session_id,
        new_pipeline=host.new_pipeline,
        settings=settings,
        metrics=state.metrics,
        protocol_metrics=state.protocols,
        cfg=cfg,
        log=log,
        input_buffer_s=input_buffer_s,
        new_recorder=new_recorder,
    )
    runtime.resume = resume
    if started is not None:
        started(runtime)
    state.sessions.add(runtime)
    try:
        await runtime.run()
    finally:
        state.sessions.remove(runtime)
    return runtime


def add_wire(app: FastAPI, route: WireRoute) -> None:
    """Serve ``route`` on ``app``."""

    async def endpoint(ws: WebSocket) -> None:
        await serve(ws, route)

    app.add_api_websocket_route(route.path, endpoint, name=route.protocol)
