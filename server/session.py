"""One ``/api/chat`` session: its engine slot, its Tandem, its socket, and how it ends.

Four tasks run per session, none of which waits on another's work:

- *receive*: websocket -> protocol check -> Opus decode -> 1920-sample
  frames -> real-time guard (:class:`~kame.server.pacing.InputPacer`:
  audio more than ``server.input_burst_s`` ahead of real time is dropped,
  a client that floods is closed) -> ``tandem.feed_user_audio`` (never
  blocks);
- *pump*: engine output frames -> ``tandem.on_output`` (which emits the
  text) -> Opus encode -> send queue;
- *send*: send queue -> websocket (the only task that may wait on the
  network; a slow client makes the queue fill, and beyond
  ``server.send_queue_frames`` frames are dropped before encoding, counted);
- *watch*: idle timeout, maximum duration (with a 0x05 notice first) and
  a client that accepts nothing for ``slow_client_timeout_s``.

Right after the handshake the session sends one 0x04 server-info message
(:mod:`kame.server.server_info`). The first task to decide the session is
over calls :meth:`end`; ``run`` then cancels the rest, sends the reason (or
the error) as a 0x05 text message and the close frame,
and closes the Tandem (which detaches and so resets the slot for reuse).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from kame.server import protocol
from kame.server.codec import AudioDecodeError, OpusIn, OpusOut
from kame.server.logs import SessionLogger
from kame.server.pacing import InputPacer
from kame.server.server_info import session_server_info
from kame.server.session_end import close_quietly, count_end, quietly, release_pipeline
from kame.server.watchdog import watch, watch_period
from starlette.websockets import WebSocketDisconnect

if TYPE_CHECKING:
    from kame.server.config import ServerConfig
    from kame.server.host import ModelHost
    from kame.server.metrics import ServerMetrics
    from kame.server.params import SessionParams
    from kame.server.recording import SessionRecorder
    from starlette.websockets import WebSocket

    from kame.frontend.engine import SlotOutput
    from kame.frontend.engine_thread import AsyncSlot
    from kame.tandem import Tandem, TandemEvent

FRAME_S = 0.08
#: Event types whose data holds user or assistant text: logged at debug level only.
_TEXT_EVENTS = frozenset({"asr.partial", "asr.final", "oracle.text", "assistant.text", "llm.done", "oracle.reset"})


@dataclass(frozen=True)
class SessionEnd:
    """Why a session ended and how the socket is closed."""

    label: str  # metrics label: client_closed, idle, max_duration, protocol, bad_audio, engine_error, ...
    code: int | None  # close code to send; None when the client is gone already
    reason: str = ""
    error: str | None = None  # sent as the 0x05 message before the close frame (else the reason is)


class ChatSession:
    """Owns one accepted websocket until it closes."""

    def __init__(
        self,
        ws: WebSocket,
        *,
        session_id: str,
        host: ModelHost,
        metrics: ServerMetrics,
        cfg: ServerConfig,
        params: SessionParams,
        log: SessionLogger,
        recorder: SessionRecorder | None = None,
        protocol_metrics: Any = None,
    ) -> None:
        self.ws = ws
        self.id = session_id
        self.host = host
        self.metrics = metrics
        self.cfg = cfg
        self.params = params
        self.log = log
        self.recorder = recorder
        self.pmetrics = protocol_metrics  # kame.server.realtime_metrics.ProtocolMetrics (per-protocol counters) or None
        self.slot: AsyncSlot | None = None
        self.tandem: Tandem | None = None
        self.done = asyncio.Event()
        self.ended: SessionEnd | None = None
        self._end_event = asyncio.Event()
        self._send_q: asyncio.Queue[tuple[bytes, int | None]] = asyncio.Queue()
        self._opus_in = OpusIn(host.sample_rate, host.frame_size)
        self._opus_out = OpusOut(host.sample_rate)
        self.started = time.monotonic()
        self.last_audio = self.started
        self._last_send = self.started
        self._anchor: float | None = None
        self.frames_in = 0
        self.frames_in_dropped = 0
        self._pacer: InputPacer[np.ndarray] = InputPacer(
            frame_s=FRAME_S, burst_s=cfg.input_burst_s, buffer_s=0.0, now=self.started
        )
        self.frames_out = 0
        self._queued_audio = 0  # audio frames waiting in the send queue
        self.frames_dropped = 0
        self.texts_out = 0

    # ------------------------------------------------------------------ ending
    def end(self, label: str, code: int | None, reason: str = "", error: str | None = None) -> None:
        """Decide the session is over (first call wins; safe from any task of the loop)."""
        if self.ended is not None:
            return
        self.ended = SessionEnd(label, code, protocol.close_reason(reason), error)
        self._end_event.set()

    def notify_draining(self, seconds_left: float) -> None:
        """The server drains: tell the client (a 0x05 notice) how long the session has left."""
        self._send_q.put_nowait((protocol.encode_notice(protocol.draining_notice(seconds_left)), None))

    # ------------------------------------------------------------------ main
    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.done.set()

    async def _run(self) -> None:
        from kame.frontend.engine_thread import EngineFull

        self.slot = self.host.new_slot()
        try:
            slot_index = await self.slot.attach()
        except EngineFull:
            self.metrics.sessions_rejected.labels(reason="full").inc()
            await quietly(self.ws.send_bytes(protocol.encode_notice("server full, retry later")))
            await close_quietly(self.ws, protocol.CLOSE_TRY_AGAIN_LATER, "server full, retry later")
            self.ended = SessionEnd("rejected_full", protocol.CLOSE_TRY_AGAIN_LATER, "server full, retry later")
            return
        self.log.info("session started", extra={"slot": slot_index})
        self.metrics.sessions_total.inc()
        if self.pmetrics is not None:
            self.pmetrics.sessions.labels(protocol="chat").inc()
        tasks: list[asyncio.Task[Any]] = []
        try:
            self.tandem = self.host.new_tandem(self.slot, self._on_event)
            try:
                settings = self.params.tandem_settings()
                if settings:
                    self.tandem.update(**settings)
            except (ValueError, KeyError) as exc:
                self.end("bad_params", protocol.CLOSE_POLICY, "invalid session settings", error=str(exc))
            if self.params.temp_text is not None or self.params.top_k_text is not None:
                self.slot.set_sampling(self.params.temp_text, self.params.top_k_text)
            if self.ended is None:
                await self.tandem.start()
                try:
                    await self.ws.send_bytes(protocol.encode_handshake())
                    await self.ws.send_bytes(protocol.encode_server_info(session_server_info(self.host, self.params)))
                except (WebSocketDisconnect, OSError, RuntimeError):
                    self.end("client_closed", None)
                now = time.monotonic()
                self.started = self.last_audio = self._last_send = now
                self._pacer = InputPacer(frame_s=FRAME_S, burst_s=self.cfg.input_burst_s, buffer_s=0.0, now=now)
            if self.ended is None:
                tasks = [
                    asyncio.create_task(self._guard(self._receive(), "receive")),
                    asyncio.create_task(self._guard(self._pump(), "pump")),
                    asyncio.create_task(self._guard(self._send(), "send")),
                    asyncio.create_task(self._guard(self._watch(), "watch")),
                ]
                await self._end_event.wait()
        except Exception as exc:
            self.log.exception("session failed")
            self.end("internal", protocol.CLOSE_INTERNAL_ERROR, "internal error", error=f"internal error ({exc.__class__.__name__})")
        finally:
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._finish()

    async def _guard(self, coro: Any, name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.ended is None:
                self.log.exception("session task %s failed", name)
                self.end(
                    "internal", protocol.CLOSE_INTERNAL_ERROR, "internal error", error=f"internal error ({exc.__class__.__name__})"
                )

    async def _finish(self) -> None:
        end = self.ended or SessionEnd("internal", protocol.CLOSE_INTERNAL_ERROR, "internal error")
        if end.code is not None:
            await quietly(self.ws.send_bytes(protocol.encode_notice(protocol.close_notice(end.reason, end.error))))
            await close_quietly(self.ws, end.code, end.reason)
        # a draining server does not wait for the ASR to flush the last words
        await release_pipeline(self.tandem, self.slot, self.metrics, self.log, flush_asr=end.label != "draining")
        duration = count_end(self.metrics, end.label, self.started)
        if self.recorder is not None:
            self.recorder.close({"reason": end.label, "code": end.code})
        self.log.info(
            "session ended",
            extra={
                "reason": end.label,
                "code": end.code,
                "seconds": round(duration, 2),
                "frames_in": self.frames_in,
                "frames_out": self.frames_out,
                "dropped_in": self.frames_in_dropped,
                "dropped_out": self.frames_dropped,
            },
        )

    # ------------------------------------------------------------------ tasks
    async def _receive(self) -> None:
        assert self.tandem is not None
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                self.end("client_closed", None)
                return
            data = message.get("bytes")
            payload: bytes | str | None = data if data is not None else message.get("text")
            try:
                parsed = protocol.decode_client_message(payload)
            except protocol.ProtocolError as exc:
                self.metrics.protocol_errors.labels(kind=exc.kind).inc()
                self.log.warning("protocol error: %s", exc)
                self.end("protocol", exc.close_code, "protocol error", error=f"protocol error: {exc}")
                return
            if isinstance(parsed, protocol.ClientAudio):
                self.last_audio = time.monotonic()
                try:
                    frames = self._opus_in.decode(parsed.payload)
                except AudioDecodeError as exc:
                    self.metrics.protocol_errors.labels(kind="bad_audio").inc()
                    self.log.warning("bad audio: %s", exc)
                    self.end("bad_audio", protocol.CLOSE_INVALID_PAYLOAD, "corrupt audio", error=str(exc))
                    return
                if not frames:
                    continue
                pushed = self._pacer.push(frames, time.monotonic())
                for frame in pushed.released:
                    self.frames_in += 1
                    self.tandem.feed_user_audio(frame)
                    if self.recorder is not None:
                        self.recorder.user_audio(frame)
                if pushed.dropped and self._input_flood(pushed.dropped, pushed.overflow_started):
                    return
            elif isinstance(parsed, protocol.ClientControl):
                self.log.debug("control message %s ignored", parsed.action)

    def _input_flood(self, dropped: int, started: bool) -> bool:
        """Count audio dropped for arriving ahead of real time; True when the session is closed for it."""
        self.frames_in_dropped += dropped
        self.metrics.frames_dropped.labels(direction="in").inc(dropped)
        if self.pmetrics is not None:
            self.pmetrics.audio_dropped_s.labels(protocol="chat").inc(dropped * FRAME_S)
        if started:
            self.log.warning("client sends audio faster than real time: dropping what is ahead by more than %.1f s", self.cfg.input_burst_s)
        if self._pacer.dropped_s > self.cfg.flood_close_s:
            self.end(
                "audio_flood",
                protocol.CLOSE_POLICY,
                "audio faster than real time",
                error=f"audio sent faster than real time: {self._pacer.dropped_s:.1f} s dropped",
            )
            return True
        return False

    async def _pump(self) -> None:
        assert self.slot is not None and self.tandem is not None
        limit = self.cfg.send_queue_frames
        while True:
            item = await self.slot.outputs.get()
            if isinstance(item, Exception):
                self.log.error("engine failed this session: %s", item)
                self.end("engine_error", protocol.CLOSE_INTERNAL_ERROR, "engine error", error="engine error, please reconnect")
                return
            self.tandem.on_output(item)
            self._queue_audio(item, limit)

    def _queue_audio(self, out: SlotOutput, limit: int) -> None:
        index = self.frames_out
        self.frames_out += 1
        if self._queued_audio >= limit:
            self.frames_dropped += 1
            self.metrics.frames_dropped.labels(direction="out").inc()
            return
        if self.recorder is not None:
            self.recorder.assistant_audio(out.pcm)
        ogg = self._opus_out.encode(out.pcm)
        if ogg:
            self._queued_audio += 1
            self._send_q.put_nowait((protocol.encode_audio(ogg), index))

    async def _send(self) -> None:
        while True:
            if self._send_q.empty():
                self._last_send = time.monotonic()
            data, index = await self._send_q.get()
            try:
                await self.ws.send_bytes(data)
            except (WebSocketDisconnect, OSError, RuntimeError):  # the client vanished mid-send
                self.end("client_closed", None)
                return
            now = time.monotonic()
            self._last_send = now
            if index is not None:
                self._queued_audio -= 1
                if self._anchor is None:
                    self._anchor = now - index * FRAME_S
                self.metrics.frame_lateness.observe(max(0.0, now - (self._anchor + index * FRAME_S)))

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
                notice = protocol.expiring_notice(verdict.warn_s, self.cfg.max_duration_s)
                self._send_q.put_nowait((protocol.encode_notice(notice), None))
                self.log.info("session ends in %.1f s (maximum duration)", verdict.warn_s)

    # ------------------------------------------------------------------ tandem events
    def _on_event(self, event: TandemEvent) -> None:
        self.metrics.on_event(event)
        if self.recorder is not None:
            self.recorder.event(event.type, dict(event.data))
        if event.type == "assistant.text":
            msg = protocol.text_message(event.data.get("id"), str(event.data.get("piece", "")))
            if msg is not None and self._send_q.qsize() < 3 * self.cfg.send_queue_frames:
                self.texts_out += 1
                self._send_q.put_nowait((msg, None))
        if event.type in _TEXT_EVENTS:
            self.log.debug("%s %s", event.type, event.data)
        elif event.type in ("llm.error", "asr.error", "backend.down"):
            self.log.warning("%s", event.type, extra={k: v for k, v in event.data.items() if k in ("backend", "kind", "error")})
        elif event.type.startswith(("llm.", "backend.")):
            self.log.info("%s", event.type, extra={k: v for k, v in event.data.items() if k in ("backend", "ttft_s")})
