"""The end of a session, shared by both websocket endpoints: last words to a client that may be gone,
the engine slot and pipeline released, the end counted.

Why one place: a session's end must not wait on a vanished or non-reading client (each send and the
close get ``timeout``), and must release its engine slot whatever else fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from kame.server import protocol
from starlette.websockets import WebSocket

if TYPE_CHECKING:
    from kame.server.metrics import ServerMetrics

    from kame.frontend.engine_thread import AsyncSlot
    from kame.tandem import Tandem


async def quietly(send: Awaitable[None], timeout: float = 1.0) -> None:
    """Await a send to the client for at most ``timeout``, ignoring failure: the client may be gone or
    not reading."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(send, timeout)


async def close_quietly(ws: WebSocket, code: int, reason: str, timeout: float = 1.0) -> None:
    """Send the close frame (``reason`` trimmed to what fits in it), as :func:`quietly`."""
    await quietly(ws.close(code=code, reason=protocol.close_reason(reason)), timeout)


async def release_pipeline(
    tandem: Tandem | None,
    slot: AsyncSlot | None,
    metrics: ServerMetrics,
    log: logging.Logger | logging.LoggerAdapter,
    *,
    flush_asr: bool = True,
) -> None:
    """Close the session's ASR, oracle and LLM tasks, then free its engine slot (even if closing failed)."""
    if tandem is not None:
        try:
            await tandem.aclose(flush_asr=flush_asr)
        except Exception:
            log.exception("closing the tandem failed")
    if slot is not None:
        slot.detach()  # a no-op when the Tandem detached it already
        if slot.dropped_outputs:
            metrics.frames_dropped.labels(direction="engine").inc(slot.dropped_outputs)


def count_end(metrics: ServerMetrics, label: str, started: float) -> float:
    """Count the ended session by reason and observe its length; returns the length in seconds."""
    duration = time.monotonic() - started
    metrics.sessions_ended.labels(reason=label).inc()
    metrics.session_seconds.observe(duration)
    return duration
