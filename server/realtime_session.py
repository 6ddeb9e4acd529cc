"""One ``/v1/realtime`` session: its engine slot, its Tandem, its socket, and how it ends.

The same shape as :class:`~kame.server.session.ChatSession` (same limits,
same ending rules, same metrics), with JSON events instead of Moshi's
binary kinds. Five tasks, none waiting on another's work:

- *receive*: websocket -> :func:`decode_client_event` -> PCM16 frames ->
  :class:`InputPacer` -> ``tandem.feed_user_audio``; bad events get an
  ``error`` event and the session goes on (until too many);
- *feed*: releases frames the pacer queued (a client ahead of real time);
- *pump*: engine output -> ``tandem.on_output`` -> :class:`AssistantTurns`
  -> send queue (audio dropped, never events, when the client lags);
- *send*: send queue -> websocket, the only task that waits on the client;
- *watch*: idle timeout, maximum duration (warned first), slow client.

Tandem events (ASR, LLM, oracle) become user-turn and ``kame.*`` events in
:meth:`_on_event`. The first task that decides the session is over calls
:meth:`end`; ``run`` then cancels the rest and closes everything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kame.server import protocol
from kame.server import realtime_events as ev
from kame.server.pacing import InputPacer
from kame.server.realtime_audio import Pcm16In
from kame.server.realtime_decode import (
    AppendAudio,
    SessionReset,
    SessionUpdate,
    decode_client_event,
)
from kame.server.realtime_events import ClientError, Event, EventEncoder, Ids
from kame.server.realtime_settings import (
    RealtimeSettings,
    ServerInfo,
    parse_session_update,
    session_object,
)
from kame.server.realtime_turns import AssistantTurns, Conversation, UserTurns
from kame.server.session_end import close_quietly, count_end, quietly, release_pipeline
from kame.server.watchdog import watch, watch_period
from starlette.websockets import WebSocketDisconnect

if TYPE_CHECKING:
    import numpy as np
    from kame.server.config import ServerConfig
    from kame.server.host import ModelHost
    from kame.server.logs import SessionLogger
    from kame.server.metrics import ServerMetrics
    from kame.server.realtime_metrics import ProtocolMetrics
    from kame.server.recording import SessionRecorder
    from starlette.websockets import WebSocket

    from kame.frontend.engine_thread import AsyncSlot
    from kame.tandem import Tandem, TandemEvent

FRAME_S = 0.08
PROTOCOL = "realtime"
#: Errors caused by a client's events before it is closed (1008).
MAX_CLIENT_ERRORS = 50
#: Messages per second (any kind) beyond which a client is closed (1008).
MAX_MESSAGES_PER_S = 1000
#: Non-audio events that may wait for a client before it counts as not reading.
MAX_QUEUED_EVENTS = 1000
#: How long ``kame.session.reset`` waits for a slot to come back.
RESET_ATTACH_TIMEOUT_S = 2.0
_TEXT_EVENTS = frozenset({"asr.partial", "asr.final", "oracle.text", "assistant.text", "llm.done", "oracle.reset"})


@dataclass(frozen=True)
class RealtimeEnd:
    """Why a session ended and how the socket is closed (``error``: an error event sent first)."""

    label: str
    code: int | None
    reason: str = ""
    error: str | None = None
    error_code: str = "server_error"
    error_type: str = "server_error"


RecorderFactory = Callable[[RealtimeSettings], "SessionRecorder | None"]


class RealtimeSession:
    """Owns one accepted ``/v1/realtime`` websocket until it closes."""

    def __init__(
        self,
        ws: WebSocket,
        *,
        session_id: str,
        host: ModelHost,
        metrics: ServerMetrics,
        protocol_metrics: ProtocolMetrics,
        cfg: ServerConfig,
        info: ServerInfo,
        settings: RealtimeSettings,
        log: SessionLogger,
        new_recorder: RecorderFactory | None = None,
    ) -> None:
        self.ws = ws
        self.id = session_id
        self.host = host
        self.metrics = metrics
        self.pmetrics = protocol_metrics
        self.cfg = cfg
        self.info = info
        self.settings = settings
        self.log = log
        self.new_recorder = new_recorder
        self.recorder: SessionRecorder | None = None  # started once the slot is attached
        self.slot: AsyncSlot | None = None
        self.tandem: Tandem | None = None
        self.done = asyncio.Event()
        self.ended: RealtimeEnd | None = None
        self._end_event = asyncio.Event()
        self.ids = Ids(session_id[:8])
        self.encoder = EventEncoder(self.ids)
        self._new_conversation()
        self._send_q: asyncio.Queue[tuple[str, int | None]] = asyncio.Queue()
        self._events_queued = 0
        self._pcm_in = Pcm16In(host.frame_size)
        now = time.monotonic()
        self._pacer: InputPacer[np.ndarray] = InputPacer(
            frame_s=FRAME_S, burst_s=cfg.input_burst_s, buffer_s=cfg.input_buffer_s, now=now
        )
        self._feed_wake = asyncio.Event()
        self._piece: str | None = None
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self.started = self.last_audio = self._last_send = now
        self._anchor: float | None = None
        self._rate_window = now
        self._rate_count = 0
        self.client_errors = 0
        self.frames_in = 0
        self.frames_out = 0
        self.frames_dropped = 0

    def _new_conversation(self) -> None:
        self.conversation = Conversation()
        self.assistant = AssistantTurns(self.ids, self.conversation)
        self.assistant.silence_audio = self.settings.silence_audio
        self.users = UserTurns(self.ids, self.conversation)

    # ------------------------------------------------------------------ ending
    def end(
        self,
        label: str,
        code: int | None,
        reason: str = "",
        error: str | None = None,
        *,
        error_code: str = "server_error",
        error_type: str = "server_error",
    ) -> None:
        """Decide the session is over (first call wins)."""
        if self.ended is not None:
            return
        self.ended = RealtimeEnd(label, code, protocol.close_reason(reason), error, error_code, error_type)
        self._end_event.set()

    # ------------------------------------------------------------------ main
    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.done.set()

    async def _attach(self, timeout: float = 0.0) -> AsyncSlot | None:
        """A freshly attached slot, or None when the engine is full (retrying up to ``timeout``)."""
        from kame.frontend.engine_thread import EngineFull

        deadline = time.monotonic() + timeout
        while True:
            slot = self.host.new_slot()
            try:
                await slot.attach()
                return slot
            except EngineFull:
                if time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(0.05)

    async def _reset_slot(self) -> bool:
        """Fresh engine state on the slot this session keeps; only if the engine failed the slot meanwhile
        is another one taken (which may be refused when the server is full)."""
        from kame.frontend.engine_thread import EngineFull

        if self.slot is not None:
            try:
                await self.slot.reset()
                return True
            except EngineFull:
                pass
        self.slot = await self._attach(RESET_ATTACH_TIMEOUT_S)
        return self.slot is not None

    async def _start_tandem(self) -> None:
        assert self.slot is not None
        self.tandem = self.host.new_tandem(self.slot, self._on_event)
        changes = self.settings.tandem_changes(RealtimeSettings(), self.info)
        if changes:
            self.tandem.update(**changes)
        await self.tandem.start()

    async def _run(self) -> None:
        self.slot = await self._attach()
        if self.slot is None:
            self.metrics.sessions_rejected.labels(reason="full").inc()
            self.ended = RealtimeEnd("rejected_full", protocol.CLOSE_TRY_AGAIN_LATER, "server full, retry later")
            await close_quietly(self.ws, protocol.CLOSE_TRY_AGAIN_LATER, "server full, retry later")
            return
        self.log.info("session started", extra={"slot": self.slot.slot, "protocol": PROTOCOL})
        if self.settings.record:
            self._start_recording()
        self.metrics.sessions_total.inc()
        self.pmetrics.sessions.labels(protocol=PROTOCOL).inc()
        try:
            try:
                await self._start_tandem()
            except (ValueError, KeyError) as exc:
                self.end("bad_params", protocol.CLOSE_POLICY, "invalid session settings", error=str(exc),
                         error_code="invalid_value", error_type="invalid_request_error")
            if self.ended is None:
                await self.ws.send_text(self.encoder.encode({"type": "session.created", "session": self._session()}))
                now = time.monotonic()
                self.started = self.last_audio = self._last_send = now
                self._pacer.last = now
                for name, work in (
                    ("receive", self._receive),
                    ("feed", self._feed_loop),
                    ("pump", self._pump),
                    ("send", self._send),
                    ("watch", self._watch),
                ):
                    self._tasks[name] = asyncio.create_task(self._guard(work, name))
                await self._end_event.wait()
        except Exception as exc:
            self.log.exception("session failed")
            self.end("internal", protocol.CLOSE_INTERNAL_ERROR, "internal error",
                     error=f"internal error ({exc.__class__.__name__})", error_code="internal_error")
        finally:
            tasks = list(self._tasks.values())
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._finish()

    async def _guard(self, work: Callable[[], Awaitable[None]], name: str) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.ended is None:
                self.log.exception("session task %s failed", name)
                self.end("internal", protocol.CLOSE_INTERNAL_ERROR, "internal error",
                         error=f"internal error ({exc.__class__.__name__})", error_code="internal_error")

    async def _finish(self) -> None:
        end = self.ended or RealtimeEnd("internal", protocol.CLOSE_INTERNAL_ERROR, "internal error")
        if end.code is not None:
            if end.label != "slow_client":
                for event in self.assistant.close("incomplete"):
                    await quietly(self.ws.send_text(self.encoder.encode(event)))
            if end.error:
                error = ev.error_event(end.error_code, end.error, error_type=end.error_type)
                await quietly(self.ws.send_text(self.encoder.encode(error)))
            await close_quietly(self.ws, end.code, end.reason)
        await release_pipeline(self.tandem, self.slot, self.metrics, self.log)
        duration = count_end(self.metrics, end.label, self.started)
        self._stop_recording(end.label, end.code)
        self.log.info(
            "session ended",
            extra={
                "protocol": PROTOCOL,
                "reason": end.label,
                "code": end.code,
                "seconds": round(duration, 2),
                "frames_in": self.frames_in,
                "frames_out": self.frames_out,
                "dropped_out": self.frames_dropped,
                "dropped_in_s": round(self._pacer.dropped_s, 2),
                "client_errors": self.client_errors,
            },
        )

    def _session(self) -> dict[str, Any]:
        return session_object(self.settings, self.info)

    # ------------------------------------------------------------------ sending
    def _queue(self, event: Event, frame_index: int | None = None) -> None:
        """Queue an event (audio frames carry their index, for the lateness metric)."""
        if self.ended is not None:
            return
        if frame_index is None:
            if self._events_queued >= MAX_QUEUED_EVENTS:
                self.end("slow_client", protocol.CLOSE_POLICY, "client is not reading")
                return
            self._events_queued += 1
        self._send_q.put_nowait((self.encoder.encode(event), frame_index))

    async def _send(self) -> None:
        while True:
            if self._send_q.empty():
                self._last_send = time.monotonic()
            text, index = await self._send_q.get()
            if index is None:
                self._events_queued -= 1
            try:
                await self.ws.send_text(text)
            except (WebSocketDisconnect, OSError, RuntimeError):  # the client vanished mid-send
                self.end("client_closed", None)
                return
            now = time.monotonic()
            self._last_send = now
            if index is not None:
                if self._anchor is None:
                    self._anchor = now - index * FRAME_S
                self.metrics.frame_lateness.observe(max(0.0, now - (self._anchor + index * FRAME_S)))

    # ------------------------------------------------------------------ receiving
    async def _receive(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                self.end("client_closed", None)
                return
            if not self._count_message():
                return
            text = message.get("text")
            payload: str | bytes | None = text if text is not None else message.get("bytes")
            try:
                command = decode_client_event(payload)
                if isinstance(command, AppendAudio):
                    self._append(command)
                elif isinstance(command, SessionUpdate):
                    self._update(command)
                elif isinstance(command, SessionReset):
                    await self._reset(command)
            except ClientError as exc:
                self._client_error(exc)
            if self.ended is not None:
                return

    def _count_message(self) -> bool:
        now = time.monotonic()
        if now - self._rate_window >= 1.0:
            self._rate_window = now
            self._rate_count = 0
        self._rate_count += 1
        if self._rate_count > MAX_MESSAGES_PER_S:
            self.metrics.protocol_errors.labels(kind="realtime_rate").inc()
            self.log.warning("closing: more than %d messages in one second", MAX_MESSAGES_PER_S)
            self.end("protocol", protocol.CLOSE_POLICY, "too many messages",
                     error=f"more than {MAX_MESSAGES_PER_S} messages in one second",
                     error_code="rate_limited", error_type="invalid_request_error")
            return False
        return True

    def _client_error(self, exc: ClientError) -> None:
        self.client_errors += 1
        self.pmetrics.client_error(exc.code)
        self.metrics.protocol_errors.labels(kind="realtime").inc()
        if self.client_errors <= 5:
            self.log.info("client event error %s: %s", exc.code, exc.message)
        if self.client_errors >= MAX_CLIENT_ERRORS:
            self.end("protocol", protocol.CLOSE_POLICY, "too many invalid events",
                     error=f"{self.client_errors} invalid client events; last: {exc.message}",
                     error_code="too_many_errors", error_type="invalid_request_error")
            return
        self._queue(exc.to_event())

    def _append(self, command: AppendAudio) -> None:
        if not command.pcm16:
            return
        now = time.monotonic()
        self.last_audio = now
        frames = self._pcm_in.push(command.pcm16)
        if not frames:
            return
        pushed = self._pacer.push(frames, now)
        for frame in pushed.released:
            self._feed(frame)
        if self._pacer.queued:
            self._feed_wake.set()
        if pushed.dropped:
            self.metrics.frames_dropped.labels(direction="in").inc(pushed.dropped)
            self.pmetrics.audio_dropped_s.labels(protocol=PROTOCOL).inc(pushed.dropped * FRAME_S)
            if self._pacer.dropped_s > self.cfg.flood_close_s:
                self.log.warning("closing: %.1f s of audio sent ahead of real time dropped", self._pacer.dropped_s)
                self.end("audio_flood", protocol.CLOSE_POLICY, "audio faster than real time",
                         error=f"audio sent faster than real time: {self._pacer.dropped_s:.1f} s dropped",
                         error_code="audio_flood", error_type="invalid_request_error")
            elif pushed.overflow_started:
                raise ClientError(
                    "input_audio_buffer_overflow",
                    f"audio arrived more than {self.cfg.input_buffer_s:g} s ahead of real time; the excess was dropped "
                    "(send audio at real time)",
                    event_id=command.event_id,
                )

    def _feed(self, frame: np.ndarray) -> None:
        if self.tandem is None:  # between two pipelines during kame.session.reset
            return
        self.frames_in += 1
        self.tandem.feed_user_audio(frame)
        if self.recorder is not None:
            self.recorder.user_audio(frame)

    async def _feed_loop(self) -> None:
        while True:
            delay = self._pacer.next_release_in(time.monotonic())
            if delay is None:
                self._feed_wake.clear()
                await self._feed_wake.wait()
                continue
            await asyncio.sleep(delay)
            for frame in self._pacer.release(time.monotonic()):
                self._feed(frame)

    def _update(self, command: SessionUpdate) -> None:
        assert self.tandem is not None
        try:
            new = parse_session_update(command.session, self.settings, self.info)
        except ClientError as exc:
            exc.event_id = command.event_id
            raise
        changes = new.tandem_changes(self.settings, self.info)
        try:
            if changes:
                self.tandem.update(**changes)
        except (ValueError, KeyError) as exc:
            raise ClientError("invalid_value", ev.client_safe(str(exc)), param="session.kame", event_id=command.event_id) from None
        old = self.settings
        self.settings = new
        self.assistant.silence_audio = new.silence_audio
        if new.record != old.record:
            if new.record:
                self._start_recording()
            else:
                self._stop_recording("client", None)
        if changes:
            self.log.info("settings changed", extra={k: v for k, v in changes.items() if k != "instructions"})
        if new.ignored:
            self.log.debug("session.update: ignored %s", ",".join(new.ignored))
        self._queue({"type": "session.updated", "session": self._session()})

    async def _reset(self, command: SessionReset) -> None:
        """``kame.session.reset``: fresh Moshi state and LLM transcript, same settings and socket."""
        for event in self.assistant.close("incomplete"):
            self._queue(event)
        pump = self._tasks.pop("pump", None)
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        if self.tandem is not None:
            tandem, self.tandem = self.tandem, None
            await tandem.aclose(flush_asr=False, release_slot=False)
        if not await self._reset_slot():
            self.end("reset_failed", protocol.CLOSE_TRY_AGAIN_LATER, "server full, retry later",
                     error="the session lost its engine slot during the reset", error_code="server_full")
            return
        self._new_conversation()
        await self._start_tandem()
        self._tasks["pump"] = asyncio.create_task(self._guard(self._pump, "pump"))
        self.log.info("session reset by the client")
        self._queue({"type": "kame.session.reset", "reason": "client"})

    # ------------------------------------------------------------------ output
    async def _pump(self) -> None:
        assert self.slot is not None and self.tandem is not None
        slot, tandem = self.slot, self.tandem
        limit = self.cfg.send_queue_frames
        while True:
            item = await slot.outputs.get()
            if isinstance(item, Exception):
                self.log.error("engine failed this session: %s", item)
                self.end("engine_error", protocol.CLOSE_INTERNAL_ERROR, "engine error",
                         error="engine error, please reconnect", error_code="engine_error")
                return
            self._piece = None
            tandem.on_output(item)  # emits assistant.text -> self._piece
            text, self._piece = self._piece, None
            index = self.frames_out
            self.frames_out += 1
            if self.recorder is not None:
                self.recorder.assistant_audio(item.pcm)
            speaking = self.assistant.speaking(item.pcm, text)
            delta: str | None = None
            if self._send_q.qsize() >= limit:
                self.frames_dropped += 1
                self.metrics.frames_dropped.labels(direction="out").inc()
            else:
                delta = ev.pcm16_base64(item.pcm)
            for event in self.assistant.frame(delta, speaking=speaking, text=text):
                audio = event["type"] in ("response.output_audio.delta", "kame.output_audio.delta")
                self._queue(event, index if audio else None)

    async def _watch(self) -> None:
        warned = False
        while True:
            await asyncio.sleep(watch_period(self.cfg))
            verdict = watch(self.cfg, now=time.monotonic(), started=self.started, last_audio=self.last_audio,
                            last_send=self._last_send, send_pending=not self._send_q.empty(), warned=warned)
            if verdict.end is not None:
                self.end(*verdict.end)
                return
            if verdict.warn_s is not None:
                warned = True
                self._queue({"type": "kame.session.ending", "reason": "max_duration", "seconds_left": round(verdict.warn_s, 1)})
                self.log.info("session ends in %.1f s (maximum duration)", verdict.warn_s)

    # ------------------------------------------------------------------ tandem events
    def _on_event(self, event: TandemEvent) -> None:
        self.metrics.on_event(event)
        if self.recorder is not None:
            self.recorder.event(event.type, dict(event.data))
        t, d = event.type, event.data
        if t == "assistant.text":
            self._piece = (self._piece or "") + str(d.get("piece", ""))
            return
        for out in self._map_event(t, d):
            self._queue(out)
        if t in _TEXT_EVENTS:
            self.log.debug("%s %s", t, d)
        elif t in ("llm.error", "asr.error", "backend.down"):
            self.log.warning("%s", t, extra={k: v for k, v in d.items() if k in ("backend", "kind", "error")})
        elif t.startswith(("llm.", "backend.")):
            self.log.info("%s", t, extra={k: v for k, v in d.items() if k in ("backend", "ttft_s")})

    def _map_event(self, t: str, d: dict[str, Any]) -> list[Event]:
        utt = int(d.get("utterance") or 0)
        audio_s = float(d.get("audio_s") or 0.0)
        if t == "asr.speech_started":
            return self.users.speech_started(utt, audio_s)
        if t == "asr.partial":
            latency = d.get("latency_s")
            return self.users.partial(
                utt, audio_s, str(d.get("text", "")), str(d.get("stable", "")),
                float(latency) if isinstance(latency, (int, float)) else None,
            )
        if t == "asr.speech_stopped":
            return self.users.speech_stopped(utt, audio_s) + self.assistant.close("completed")
        if t == "asr.final":
            return self.users.final(utt, audio_s, str(d.get("text", "")))
        if t == "asr.error":
            message = ev.client_safe(str(d.get("message") or "speech recognition failed"))
            return self.users.failed(message) + [{"type": "kame.asr.error", "message": message}]
        mapped = ev.kame_event(t, d)
        return [mapped] if mapped is not None else []

    # ------------------------------------------------------------------ recording
    def _start_recording(self) -> None:
        if self.recorder is None and self.new_recorder is not None:
            self.recorder = self.new_recorder(self.settings)

    def _stop_recording(self, reason: str, code: int | None) -> None:
        if self.recorder is not None:
            self.recorder.close({"reason": reason, "code": code})
            self.recorder = None
