"""A websocket with ``?resume=HANDLE``: the held session re-attached, or one handed over by a draining replica.

The checks of a new session that still apply (origin, credentials) run first; then the handle: held on
this replica -> the same session (voice, slot, items) continues on this connection; else, with a store,
the entry a draining replica left -> a new session with that id, settings and conversation (voice fresh);
else refused with a close code and a sentence (1008), the session the handle names untouched.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from fastapi import WebSocket

from kame.server.access.admission import ROUTE_HEADER
from kame.server.access.auth import origin_ok, token_ok, websocket_credentials
from kame.server.access.ephemeral import is_ephemeral, settings_from_json
from kame.server.access.params import QueryParams
from kame.server.runtime.end import close_reason
from kame.server.runtime.resume import (
    DRAINING,
    FULL,
    MAX_HANDLE_CHARS,
    UNAUTHORIZED,
    UNKNOWN,
    WRONG_ENDPOINT,
    Refusal,
    ResumeHook,
    ResumeRegistry,
    ResumeWire,
    binding_of,
    registry_of,
    route_of,
)
from kame.server.runtime.store import Snapshot, claim
from kame.server.runtime.transport import WebSocketTransport
from kame.server.telemetry.logs import session_logger

if TYPE_CHECKING:
    from kame.server.access.admission import Admitted
    from kame.server.access.ephemeral import EphemeralGrant
    from kame.server.runtime.route import WireRoute
    from kame.server.state import AppState


async def serve_resume(ws: WebSocket, state: AppState, route: WireRoute, handle: str) -> None:
    cfg = state.cfg.server
    creds = websocket_credentials(ws.headers, ws.query_params, list(ws.scope.get("subprotocols") or []))
    route_id = route_of(handle) if len(handle) <= MAX_HANDLE_CHARS else None
    await ws.accept(subprotocol=creds.subprotocol,
                    headers=[(ROUTE_HEADER, route_id.encode())] if route_id is not None else None)
    log = session_logger("resume")

    async def refuse(refusal: Refusal) -> None:
        state.metrics.sessions_rejected.labels(reason=refusal.label).inc()
        log.info("resume refused: %s", refusal.label)
        with contextlib.suppress(Exception):
            out = route.refusal(refusal.message)
            await (ws.send_bytes(out.data) if isinstance(out.data, bytes) else ws.send_text(out.data))
            await ws.close(code=refusal.code, reason=close_reason(refusal.message))

    if not origin_ok(ws.headers.get("origin"), cfg.allowed_origins):
        await refuse(Refusal("origin", 1008, "origin not allowed"))
        return
    grant = state.ephemeral_keys.lookup(creds.token) if route.ephemeral_keys and is_ephemeral(creds.token) else None
    if is_ephemeral(creds.token) and grant is None:
        await refuse(Refusal("unauthorized", 1008, "the ephemeral key (ek_...) is unknown or has expired: mint a "
                             "new one with the same session config to resume"))
        return
    if grant is None and not token_ok(cfg.auth_token, creds.token):
        await refuse(Refusal("unauthorized", 1008, "unauthorized"))
        return
    if route_id is None:
        await refuse(UNKNOWN)
        return
    binding = binding_of(creds.token if grant is None else None, grant.session if grant is not None else None)
    registry = registry_of(ws.app.state, cfg, lambda: state.sessions.draining)
    if state.sessions.draining:  # its state is (or goes) to the store: it resumes elsewhere, or not at all
        await refuse(DRAINING)
        return
    hook, refusal = registry.check(handle, binding)
    if refusal is not None:
        await refuse(refusal)
        return
    if hook is not None:
        assert hook.runtime is not None
        if hook.runtime.protocol != route.protocol:  # a handle of another endpoint's session: not this wire's
            await refuse(WRONG_ENDPOINT)
            return
        await hook.resume(WebSocketTransport(ws), hook.runtime.wire.opening(hook.runtime.settings))
        return
    if registry.store is None:
        await refuse(UNKNOWN)
        return
    if state.host.free_slots <= 0:
        await refuse(FULL)
        return
    try:
        snapshot, why = await claim(registry.store, handle, binding)
    except Exception as exc:  # noqa: BLE001 - the store unreachable: a clear refusal, the server goes on
        log.warning("the resume store failed: %s", exc.__class__.__name__)
        await refuse(Refusal("resume_store", 1013, "the resume store is unreachable, retry later"))
        return
    if snapshot is None:
        await refuse(UNAUTHORIZED if why == "unauthorized" else UNKNOWN)
        return
    await _restore(ws, state, route, snapshot, binding, grant, registry)


async def _restore(ws: WebSocket, state: AppState, route: WireRoute, snapshot: Snapshot, binding: str,
                   grant: EphemeralGrant | None, registry: ResumeRegistry) -> None:
    from kame.server.access.admission import Admitted
    from kame.server.runtime.route import run_session

    log = session_logger(snapshot.session_id)
    settings = settings_from_json(snapshot.settings)
    admitted: Admitted = Admitted(session_id=snapshot.session_id, log=log,
                                  peer=f"{ws.client.host}:{ws.client.port}" if ws.client else "?",
                                  params=QueryParams(settings=settings), grant=grant, restored=settings, restored_wire=snapshot.wire,
                                  wire_params=route.params(ws.query_params) if route.params is not None else None)
    wire, settings = route.open(state, admitted, ws)
    if not isinstance(wire, ResumeWire):
        return
    hook = ResumeHook(registry, binding, wire, restored=snapshot)
    log.info("session resumed from another replica", extra={"protocol": route.protocol, "turns": len(snapshot.turns)})
    await run_session(state, ws, wire, settings, snapshot.session_id, log,
                      input_buffer_s=route.input_buffer_s(state), resume=hook)
