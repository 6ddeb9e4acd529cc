"""One session's tandem pipeline: user audio -> engine slot, and ASR -> LLM -> oracle.

The protocol layers (``/api/chat``, ``/v1/realtime``, the offline runner)
own the socket; a :class:`Tandem` owns everything behind it for one session:
the engine slot, the ASR stream, the transcript and the oracle loop. It
never blocks the caller: audio goes to the engine thread and the ASR worker
through non-blocking calls, LLM requests run in their own tasks, and what
happens is reported as :class:`TandemEvent` through ``emit``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.asr.events import AsrEvent, EventType
from kame.frontend.engine import SlotOutput
from kame.frontend.engine_thread import AsyncSlot
from kame.oracle.config import OracleConfig
from kame.oracle.loop import OracleLoop, SessionOracleSettings

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
SETTINGS = ("backend", "oracle_policy", "barge_in", "instructions", "oracle_delay_s", "text_temperature", "text_topk")


@dataclass(frozen=True)
class TandemEvent:
    """Something that happened in a session, for protocol layers, metrics and logs.

    Types: ``asr.speech_started``, ``asr.speech_stopped``, ``asr.partial``
    (``text``, ``latency_s``), ``asr.final`` (``text``), ``asr.error``,
    ``llm.request_started``, ``llm.first_token`` (``backend``, ``ttft_s``),
    ``llm.cancelled``, ``llm.done``, ``llm.dropped``, ``llm.error``
    (``backend``, ``error``), ``backend.down``, ``backend.up``,
    ``oracle.reset`` / ``oracle.text`` (``text``, ``tokens``),
    ``oracle.cleared``, ``assistant.text`` (``id``, ``piece``).
    """

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    t: float = field(default_factory=time.monotonic)


Emit = Callable[[TandemEvent], None]


class _FeedClock:
    """When (wall clock) each sample count was fed, to measure ASR latency."""

    def __init__(self, keep: int = 512) -> None:
        self.samples: list[int] = []
        self.times: list[float] = []
        self.keep = keep
        self.total = 0

    def fed(self, n: int) -> None:
        self.total += n
        self.samples.append(self.total)
        self.times.append(time.time())
        if len(self.samples) > self.keep:
            del self.samples[: self.keep // 2]
            del self.times[: self.keep // 2]

    def wall_at(self, audio_s: float) -> float | None:
        i = bisect.bisect_left(self.samples, int(audio_s * SAMPLE_RATE))
        return self.times[i] if i < len(self.times) else None


class Tandem:
    """Per-session pipeline around an attached engine slot."""

    def __init__(
        self,
        slot: AsyncSlot,
        emit: Emit,
        *,
        piece_of: Callable[[int], str] | None = None,
        asr_stream: Any = None,
        oracle: OracleLoop | None = None,
    ) -> None:
        self.slot = slot
        self.emit = emit
        self.piece_of = piece_of
        self.asr = asr_stream
        self.oracle = oracle
        self._tasks: list[asyncio.Task[Any]] = []
        self._clock = _FeedClock()
        self.closed = False

    @property
    def shared_stt(self) -> bool:
        """The ASR is the engine's own Kyutai STT, fed from the engine's outputs."""
        return bool(getattr(self.asr, "shared_engine", False))

    async def start(self) -> None:
        """Start background work (the ASR event consumer)."""
        if self.shared_stt:
            self.slot.stt_attach()
        if self.asr is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._asr_events(), name="kame-asr-events"))

    # ------------------------------------------------------------------ audio in / out
    def feed_user_audio(self, pcm: np.ndarray) -> None:
        """24 kHz mono float32 user audio, any length. Never blocks."""
        self.slot.feed(pcm)
        if self.asr is not None and not self.asr.done:
            self.asr.feed(pcm)
            self._clock.fed(int(np.asarray(pcm).size))

    def on_output(self, out: SlotOutput) -> None:
        """Called for every engine output frame of this session (in the event loop)."""
        if self.oracle is not None:
            self.oracle.on_assistant_token(out.text_id)
        if out.stt is not None and self.shared_stt:
            self.asr.on_step(out.stt.text_id, out.stt.end_prob)
        if out.text_id is not None and out.text_id not in (0, 3) and self.piece_of is not None:
            self.emit(TandemEvent("assistant.text", {"id": out.text_id, "piece": self.piece_of(out.text_id)}))

    # ------------------------------------------------------------------ ASR
    async def _asr_events(self) -> None:
        assert self.asr is not None
        async for ev in self.asr.events():
            try:
                self._on_asr(ev)
            except Exception:  # noqa: BLE001 - a bug here must not stop the session
                log.exception("handling ASR event %s failed", ev.type)

    def _on_asr(self, ev: AsrEvent) -> None:
        data: dict[str, Any] = {"audio_s": ev.audio_s, "utterance": ev.utterance}
        if ev.type is EventType.PARTIAL:
            fed_at = self._clock.wall_at(ev.audio_s)
            data.update(text=ev.text, stable=ev.stable, latency_s=None if fed_at is None else max(0.0, time.time() - fed_at))
            self.emit(TandemEvent("asr.partial", data))
            if self.oracle is not None:
                self.oracle.on_user_partial(ev.text)
        elif ev.type is EventType.FINAL:
            data.update(text=ev.text)
            self.emit(TandemEvent("asr.final", data))
            if self.oracle is not None:
                self.oracle.on_user_final(ev.text)
        elif ev.type is EventType.SPEECH_STARTED:
            self.emit(TandemEvent("asr.speech_started", data))
        elif ev.type is EventType.SPEECH_STOPPED:
            self.emit(TandemEvent("asr.speech_stopped", data))
        elif ev.type is EventType.ERROR:
            data.update(message=ev.text)
            self.emit(TandemEvent("asr.error", data))

    # ------------------------------------------------------------------ settings
    def update(self, **settings: Any) -> None:
        """Change per-session settings; raises ValueError/UnknownBackend on a bad value."""
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            raise ValueError(f"unknown session setting(s): {', '.join(sorted(unknown))}")
        if "text_temperature" in settings or "text_topk" in settings:
            self.slot.set_sampling(settings.get("text_temperature"), settings.get("text_topk"))
        if self.oracle is None:
            return
        mapping = {"oracle_policy": "policy"}
        changes = {mapping.get(k, k): v for k, v in settings.items() if k not in ("text_temperature", "text_topk")}
        if changes:
            self.oracle.update(**changes)

    # ------------------------------------------------------------------ end
    async def aclose(self, flush_asr: bool = True, release_slot: bool = True) -> None:
        """Stop ASR, oracle and their tasks; ``release_slot=False`` keeps the engine slot attached (for a
        reset that re-uses it)."""
        if self.closed:
            return
        self.closed = True
        if self.asr is not None and self.shared_stt and flush_asr:
            await self._flush_shared_stt()
        if self.asr is not None:
            with contextlib.suppress(Exception):
                await self.asr.aclose(flush=flush_asr, timeout=5.0)
        for task in self._tasks:
            if not task.done():
                try:
                    await asyncio.wait_for(task, 2.0)
                except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                    task.cancel()
        if self.oracle is not None:
            await self.oracle.aclose()
        if release_slot:
            self.slot.detach()


    async def _flush_shared_stt(self, timeout: float = 3.0) -> None:
        """Text lags audio by the STT's delay: step that much silence so the last words come out."""
        n = int(self.asr.flush_frames)
        self.slot.feed(np.zeros(n * 1920, np.float32))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        got = 0
        while got < n and loop.time() < deadline:
            try:
                item = await asyncio.wait_for(self.slot.outputs.get(), max(0.01, deadline - loop.time()))
            except asyncio.TimeoutError:
                break
            if isinstance(item, Exception):
                break
            got += 1
            if item.stt is not None:
                self.asr.on_step(item.stt.text_id, item.stt.end_prob)


class TandemFactory:
    """Builds the Tandem of each new session from the server's shared parts."""

    def __init__(
        self,
        *,
        oracle_config: OracleConfig,
        registry: Any = None,
        recognizer: Any = None,
        encode: Callable[[str], Sequence[int]],
        piece_of: Callable[[int], str] | None,
    ) -> None:
        self.oracle_config = oracle_config
        self.registry = registry
        self.recognizer = recognizer
        self.encode = encode
        self.piece_of = piece_of

    def new(self, slot: AsyncSlot, emit: Emit, **settings: Any) -> Tandem:
        """A Tandem for an attached slot; ``settings`` as in :meth:`Tandem.update`."""

        def oracle_emit(kind: str, data: dict[str, Any]) -> None:
            emit(TandemEvent(kind, data))

        oracle = None
        if self.registry is not None and self.registry.names:
            oracle = OracleLoop(
                config=self.oracle_config,
                registry=self.registry,
                sink=slot,
                encode=self.encode,
                piece_of=self.piece_of,
                emit=oracle_emit,
                settings=SessionOracleSettings(
                    policy=self.oracle_config.policy,
                    barge_in=self.oracle_config.barge_in,
                    instructions=self.oracle_config.instructions,
                    oracle_delay_s=self.oracle_config.oracle_delay_s,
                ),
            )
        asr_stream = self.recognizer.open_stream() if self.recognizer is not None else None
        tandem = Tandem(slot, emit, piece_of=self.piece_of, asr_stream=asr_stream, oracle=oracle)
        if settings:
            tandem.update(**{k: v for k, v in settings.items() if v is not None})
        return tandem
