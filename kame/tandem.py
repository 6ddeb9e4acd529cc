"""One session's tandem pipeline: user audio -> engine slot (+ ASR -> LLM -> oracle).

The protocol layers (``/api/chat``, ``/v1/realtime``, the offline runner)
own the socket; a :class:`Tandem` owns everything behind it for one session:
the engine slot, the ASR stream, the transcript and the oracle loop. It
never blocks the caller: audio goes to the engine thread and the ASR worker
through non-blocking calls, LLM requests run in their own tasks, and what
happens is reported as :class:`TandemEvent` through ``emit``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.frontend.engine import SlotOutput
from kame.frontend.engine_thread import AsyncSlot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TandemEvent:
    """Something that happened in a session, for protocol layers and logs.

    Types: ``asr.speech_started``, ``asr.speech_stopped``, ``asr.partial``,
    ``asr.final``, ``asr.error``, ``llm.request_started``, ``llm.first_token``,
    ``llm.cancelled``, ``llm.done``, ``llm.dropped``, ``llm.error``,
    ``backend.down``, ``backend.up``, ``oracle.reset``, ``oracle.text``,
    ``assistant.text`` (a text piece the front-end spoke).
    """

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    t: float = field(default_factory=time.monotonic)


Emit = Callable[[TandemEvent], None]


class Tandem:
    """Per-session pipeline around an attached engine slot."""

    def __init__(self, slot: AsyncSlot, emit: Emit, *, piece_of: Callable[[int], str] | None = None) -> None:
        self.slot = slot
        self.emit = emit
        self.piece_of = piece_of
        self._tasks: list[asyncio.Task[Any]] = []
        self.closed = False

    async def start(self) -> None:
        """Start background work (ASR consumer, oracle loop)."""

    def feed_user_audio(self, pcm: np.ndarray) -> None:
        """24 kHz mono float32 user audio, any length. Never blocks."""
        self.slot.feed(pcm)

    def on_output(self, out: SlotOutput) -> None:
        """Called for every engine output frame of this session (in the event loop)."""
        if out.text_id is not None and out.text_id not in (0, 3) and self.piece_of is not None:
            self.emit(TandemEvent("assistant.text", {"id": out.text_id, "piece": self.piece_of(out.text_id)}))

    def update(self, **settings: Any) -> None:
        """Change per-session settings (backend, oracle_policy, instructions, ...)."""

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self.slot.detach()
