"""How a session ends: the typed reason, and last words to a client that may be gone.

Why one place: a session's end must not wait on a vanished or non-reading
client (each send and the close get ``timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette import status

if TYPE_CHECKING:
    from kame.server.telemetry.metrics import ServerMetrics

#: The close reason of every session a draining server ends or refuses (the manager ends live ones,
#: admission refuses new ones: both import it from here).
DRAIN_REASON = "server shutting down"


@dataclass(frozen=True)
class SessionEnd:
    """Why a session ended and how the socket is closed.

    ``label``: the metrics label (client_closed, idle, max_duration, protocol, bad_audio, audio_flood,
    slow_client, engine_error, draining, ...); ``code``: the close code, None when the client is gone
    already; ``error``: a message the wire sends before the close frame; ``error_code`` and
    ``error_type``: how a wire with typed errors (``/v1/realtime``) classifies it.
    """

    label: str
    code: int | None
    reason: str = ""
    error: str | None = None
    error_code: str = "server_error"
    error_type: str = "server_error"


ENGINE_ERROR = "engine error, please reconnect"


def engine_error_end() -> SessionEnd:
    """The engine failed this session (a step, a command, an attach or reset beyond its bound, a dead thread)."""
    return SessionEnd("engine_error", status.WS_1011_INTERNAL_ERROR, "engine error", ENGINE_ERROR, "engine_error")


def internal_error_end(exc: BaseException) -> SessionEnd:
    return SessionEnd("internal", status.WS_1011_INTERNAL_ERROR, "internal error",
                      f"internal error ({exc.__class__.__name__})", "internal_error")


async def quietly(send: Awaitable[None], timeout: float = 1.0) -> None:
    """Await a send to the client for at most ``timeout``, ignoring failure: the client may be gone or
    not reading."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(send, timeout)


def count_end(metrics: ServerMetrics, label: str, started: float) -> float:
    """Count the ended session by reason and observe its length; returns the length in seconds."""
    duration = time.monotonic() - started
    metrics.sessions_ended.labels(reason=label).inc()
    metrics.session_seconds.observe(duration)
    return duration


def close_reason(text: str, limit: int = 120) -> str:
    """A close reason that fits the 123-byte limit of a close frame."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", errors="ignore") + "..."
