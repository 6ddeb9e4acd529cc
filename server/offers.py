"""What a session of this server offers on each wire, websocket or WebRTC call alike.

The websocket routes (:mod:`kame.server.app.websockets`) and the WebRTC
endpoints (:mod:`kame.server.webrtc`) both build their wires from these, so
neither imports the other (``tests/test_layers.py`` keeps it so).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from kame.server.state import AppState
from kame.server.wires.live import wire as live
from kame.server.wires.realtime import wire as realtime


def realtime_info(state: AppState, session_id: str, model: str) -> realtime.ServerInfo:
    """What a ``/v1/realtime`` session of this server may choose (websocket or WebRTC call)."""
    host = state.host
    registry = host.backends
    return realtime.server_info(
        session_id, model, backends=host.backend_names(),
        default_backend=registry.default_name if registry is not None and registry.names else None, cfg=state.cfg,
        tools_backends=[n for n in host.backend_names() if registry is not None and registry.tools_allowed(n)],
        mcp_servers=host.tools.mcp_server_names if host.tools is not None else [],
        **voice_info(state),
    )


def voice_info(state: AppState) -> dict[str, Any]:
    """The checkpoint's voices, its default voice and whether it takes a persona (PersonaPlex)."""
    models = state.host.models
    voices = getattr(models, "voices", None)
    return {
        "voices": [] if voices is None else voices.names,
        "default_voice": None if voices is None else voices.default,
        "personas": getattr(models, "personaplex", None) is not None,
    }


def live_info(state: AppState, session_id: str, **extra: Any) -> live.LiveServerInfo:
    """What a Live session of this server offers (websocket or WebRTC: ``extra`` sets ``webrtc``, ``client``)."""
    info = live.server_info(session_id, f"kame:{state.cfg.frontend.checkpoint}"[:128], state.cfg, time.time())
    voices = voice_info(state)
    return replace(info, voices=tuple(voices["voices"]), default_voice=voices["default_voice"],
                   personas=voices["personas"], **extra)


def live_wire_args(state: AppState) -> dict[str, Any]:
    """The keyword arguments of a Live wire on this server (its frame size, the back-ends Responses delegation
    offers); who answers is the session's (its pipeline runs the answer source)."""
    offer = state.host.responses_offer()
    return {"frame_size": state.host.frame_size, "responses": None if offer is None else offer.catalog}
