"""Plain HTTP endpoints: ``/health`` (open), ``/ready`` (open), ``/v1/backends`` and ``/metrics`` (token).

``/health`` is liveness: 200 whenever the process serves sessions or is on
its way to (starting, draining), 503 with status ``failed`` once it cannot
any more (the models failed to load, or the engine thread died): the
orchestrator should restart it. ``/ready`` is for load balancers: 200 only
while the models are warmed up, the server is not draining and a session
slot is free. ``/ready?full_ok=1`` is for Kubernetes' readiness probe: 200
while warmed up and not draining, full or not (see :mod:`kame.server.app.readiness`).
"""

from __future__ import annotations

import re
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from kame.server.access.auth import http_token, token_ok
from kame.server.app.readiness import flag, readiness
from kame.server.state import AppState
from kame.server.telemetry.metrics import CONTENT_TYPE

router = APIRouter()

_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.kame
    return state


def require_token(request: Request) -> None:
    state = _state(request)
    if not token_ok(state.cfg.server.auth_token, http_token(request.headers, request.query_params)):
        raise HTTPException(401, "unauthorized", headers={"WWW-Authenticate": "Bearer"})


def status_of(state: AppState) -> str:
    if state.host.failed:
        return "failed"
    if state.sessions.draining:
        return "draining"
    return state.host.state


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state = _state(request)
    host = state.host
    failed = host.failed  # first: it also notices an engine thread that hangs
    backends = host.backends
    body = {
        "status": status_of(state),
        "sessions": {"active": state.sessions.active, "max": host.max_sessions, "free": host.free_slots},
        "device": host.device,
        "engine": host.describe_engine(),
        "models": host.describe_models(),
        "backends": {
            "default": backends.default_name if backends is not None else None,
            "names": backends.names if backends is not None else [],
        },
        "voices": _voices(host),
        "versions": state.versions,
        "uptime_s": round(time.monotonic() - state.started, 1),
    }
    return JSONResponse(body, status_code=503 if failed else 200)


def _voices(host: Any) -> dict[str, Any]:
    """The checkpoint's voices (a PersonaPlex checkpoint's folder; none: it speaks with one voice)."""
    models = getattr(host, "models", None)
    catalog = getattr(models, "voices", None)
    return {
        "names": [] if catalog is None else catalog.names,
        "default": None if catalog is None else catalog.default,
        "persona": getattr(models, "personaplex", None) is not None,
    }


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    state = _state(request)
    host = state.host
    host_ready = host.ready  # first: it also notices an engine thread that hangs
    verdict = readiness(
        draining=state.sessions.draining,
        host_state=host.state,
        host_ready=host_ready,
        free_slots=host.free_slots,
        full_ok=flag(request.query_params.get("full_ok")),
    )
    if verdict.ok:
        return JSONResponse({"ready": True, "free": verdict.free})
    return JSONResponse({"ready": False, "reason": verdict.reason}, status_code=503)


@router.get("/v1/backends")
async def list_backends(request: Request) -> dict[str, Any]:
    require_token(request)
    state = _state(request)
    registry = state.host.backends
    if registry is None:
        return {"default": None, "backends": []}
    health = await state.backend_health()
    out = []
    for item in registry.describe():
        h = health.get(item["name"])
        out.append(
            {
                "name": item["name"],
                "kind": item["kind"],
                "description": _URL.sub("<url>", item.get("description") or ""),
                "model": item.get("model"),
                "default": item["default"],
                "fallback": item.get("fallback"),
                "reachable": None if h is None else h.ok,
                "status": None if h is None else h.status,
                "reason": None if h is None else _URL.sub("<url>", h.reason),
                "latency_s": None if h is None or h.latency_s is None else round(h.latency_s, 3),
                "breaker": item.get("breaker"),
            }
        )
    return {"default": registry.default_name, "backends": out}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    require_token(request)
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


