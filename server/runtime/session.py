"""One session, whatever its wire and transport: the pipeline, the tasks, the send queue, the watchdog, the end.

The lifecycle is written here once for every protocol (``/api/chat``,
``/v1/realtime``, ...); the protocol itself is a pure
:class:`~kame.server.runtime.wire.Wire`, and what carries it a
:class:`~kame.server.runtime.transport.Transport` (a websocket, or a WebRTC
call whose audio comes as RTP). Five tasks run per session (plus the
transport's own, e.g. WebRTC's clocked input), none waiting on another's work:

- *receive*: transport -> ``wire.decode`` -> commands; user audio goes
  through the real-time guard (:class:`~kame.server.runtime.pacing.InputPacer`:
  audio far ahead of real time is queued up to the wire's buffer, then
  dropped; a client that floods is closed) -> ``pipeline.feed`` (never
  blocks);
- *feed*: releases audio the pacer queued, at real time;
- *pump*: pipeline events -> ``wire.frame`` / ``wire.event`` -> send queue
  (audio dropped before encoding when the client lags, counted);
- *send*: send queue -> transport, the only task that waits on the client;
- *watch*: idle timeout, maximum duration (warned first), slow client.

The first of them to decide the session is over calls :meth:`SessionRuntime.end`;
``run`` then cancels the rest, sends the wire's last words and the close
frame, leaves the pipeline (which releases the engine slot) and counts the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette import status
from starlette.websockets import WebSocketDisconnect

from kame.audio.media import FRAME_S
from kame.frontend.engine_thread import EngineFailed, EngineFull
from kame.server.runtime.client_limits import ClientLimits
from kame.server.runtime.end import SessionEnd, close_reason, count_end, engine_error_end, internal_error_end, quietly
from kame.server.runtime.pacing import InputPacer
from kame.server.runtime.send import SendQueue
from kame.server.runtime.transport import Transport, as_transport
from kame.server.runtime.watchdog import watch, watch_period
from kame.server.runtime.wire import (
    AudioIn,
    Command,
    EndIn,
    Fault,
    FunctionOutputIn,
    Ignored,
    Outgoing,
    Reply,
    ResetIn,
    SettingsIn,
    Wire,
)
from kame.session.answers import AnswerWritten
from kame.session.commands import (
    AppendAnswer,
    ClearTurn,
    CommandRefused,
    CommitTurn,
    ConversationCommand,
    Delegate,
    DeliverItem,
    SpeakAnswer,
)
from kame.session.events import AsrFailed, AssistantFrame, BackendDown, EngineDown, LlmError, PipelineEvent

if TYPE_CHECKING:
    from starlette.websockets import WebSocket

    from kame.server.config import ServerConfig
    from kame.server.runtime.recording import SessionRecorder
    from kame.server.runtime.resume import ResumeHook
    from kame.server.telemetry.logs import SessionLogger
    from kame.server.telemetry.metrics import ServerMetrics
    from kame.server.telemetry.protocol_metrics import ProtocolMetrics
    from kame.session.pipeline import Pipeline
    from kame.session.settings import SessionSettings

#: Client faults logged at info level before the rest go to debug.
LOGGED_FAULTS = 5
#: Session commands applied as soon as they arrive (a client's answer, a delegation's request): never behind audio
#: the pacer still holds, nor behind a commit waiting for it (an answer goes in the oracle FIFO, not behind the
#: step in progress).
AT_ONCE = (SpeakAnswer, AppendAnswer, DeliverItem, Delegate)

NewPipeline = Callable[["SessionSettings"], "Pipeline"]
NewRecorder = Callable[["SessionSettings"], "SessionRecorder | None"]


class SessionRuntime:
    """Owns one accepted session (its websocket, or its WebRTC call) until it closes."""

    def __init__(
        self,
        ws: WebSocket | Transport,
        wire: Wire,
        *,
        session_id: str,
        new_pipeline: NewPipeline,
        settings: SessionSettings,
        metrics: ServerMetrics,
        protocol_metrics: ProtocolMetrics | None,
        cfg: ServerConfig,
        log: SessionLogger,
        input_buffer_s: float = 0.0,
        new_recorder: NewRecorder | None = None,
    ) -> None:
        self.transport = as_transport(ws)
        self.wire = wire
        self.id = session_id
        self.new_pipeline = new_pipeline
        self.settings = settings
        self.metrics = metrics
        self.pmetrics = protocol_metrics
        self.cfg = cfg
        self.log = log
        self.input_buffer_s = input_buffer_s
        self.new_recorder = new_recorder
        self.recorder: SessionRecorder | None = None
        self.pipeline: Pipeline | None = None
        self.done = asyncio.Event()
        self.ended: SessionEnd | None = None
        self._end_event = asyncio.Event()
        self.send_q = SendQueue(cfg.send_queue_frames, observe_lateness=metrics.frame_lateness.observe)
        now = time.monotonic()
        self._pacer: InputPacer[np.ndarray] = InputPacer(
            frame_s=FRAME_S, burst_s=cfg.input_burst_s, buffer_s=input_buffer_s, now=now
        )
        self._feed_wake = asyncio.Event()
        #: commits and clears waiting for the audio sent before them: (frames fed by then, command)
        self._after_audio: list[tuple[int, ConversationCommand]] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.started = self.last_audio = now
        self.faults = 0
        self.limits = ClientLimits(wire.protocol, wire.max_messages_per_s, wire.max_client_errors)
        self.frames_in = 0
        self.frames_out = 0
        self.frames_dropped = 0
        #: Set for a session whose client can resume it (server/runtime/resume.py); None: today's end.
        self.resume: ResumeHook | None = None
        #: When the connection dropped while the session is held for a resume (None: attached).
        self.away_since: float | None = None
        #: The close code of the client's close frame (1006: none came, the connection dropped).
        self.client_close_code: int | None = None

    @property
    def protocol(self) -> str:
        return self.wire.protocol

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
        """Decide the session is over (first call wins; safe from any task of the loop)."""
        self.end_with(SessionEnd(label, code, close_reason(reason), error, error_code, error_type))

    def notify_draining(self, seconds_left: float) -> None:
        """The server drains (:class:`~kame.server.runtime.manager.DrainAware`): the wire tells the client how long
        the session has left."""
        told = self.resume.draining(self, seconds_left) if self.resume is not None else None
        self._queue(told if told is not None else self.wire.draining(seconds_left))
        self.log.info("server draining: session ends in %.1f s", seconds_left)

    def end_with(self, end: SessionEnd) -> None:
        if self.ended is not None:
            return
        if end.label == "client_closed" and self.resume is not None and self.resume.hold(self):
            return  # held for the client's return (server/runtime/resume.py)
        self.ended = end
        self._end_event.set()

    # ------------------------------------------------------------------ main
    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self.resume is not None:
                self.resume.session_ended()
            self.done.set()

    async def _run(self) -> None:
        pipeline = self.new_pipeline(self.settings)
        pipeline.on_answer_written = self._answer_written
        entered = False
        try:
            async with pipeline:
                entered = True
                self.pipeline = pipeline
                try:
                    await self._serve(pipeline)
                finally:
                    end = self.ended or SessionEnd("internal", status.WS_1011_INTERNAL_ERROR, "internal error")
                    self.ended = end
                    # a draining server does not wait for the ASR to flush the last words
                    pipeline.flush_on_exit = end.label != "draining"
                    await self._goodbye(end)
        except EngineFull:
            if entered:
                raise
            self.metrics.sessions_rejected.labels(reason="full").inc()
            self.ended = SessionEnd("rejected_full", status.WS_1013_TRY_AGAIN_LATER, "server full, retry later")
            await self._goodbye(self.ended)
            return
        except EngineFailed as exc:
            if entered:
                raise
            self.log.error("the engine could not attach this session: %s", exc)
            self.end_with(engine_error_end())
            await self._goodbye(self.ended)  # type: ignore[arg-type]
        except (ValueError, KeyError) as exc:
            if entered:
                raise
            self.end("bad_params", status.WS_1008_POLICY_VIOLATION, "invalid session settings", error=str(exc),
                     error_code="invalid_value", error_type="invalid_request_error")
            await self._goodbye(self.ended)  # type: ignore[arg-type]
        self._record_leftovers(pipeline)
        self._count_end(pipeline)

    async def _serve(self, pipeline: Pipeline) -> None:
        self.log.info("session started", extra={"slot": pipeline.slot_index, "protocol": self.protocol})
        self.metrics.sessions_total.inc()
        if self.pmetrics is not None:
            self.pmetrics.sessions.labels(protocol=self.protocol).inc()
        if self.settings.record:
            self._start_recording()
        try:
            for out in self.wire.opening(self.settings):
                try:
                    await self._write(out)
                except (WebSocketDisconnect, OSError, RuntimeError):
                    self.end("client_closed", None)
            if self.ended is None:
                now = time.monotonic()
                self.started = self.last_audio = self.send_q.last_send = now
                self._pacer = InputPacer(frame_s=FRAME_S, burst_s=self.cfg.input_burst_s, buffer_s=self.input_buffer_s, now=now)
                for name, work in (
                    ("receive", self._receive),
                    ("feed", self._feed_loop),
                    ("pump", self._pump),
                    ("send", self._send),
                    ("watch", self._watch),
                    *self.transport.tasks(),
                ):
                    self._tasks[name] = asyncio.create_task(self._guard(work, name))
                if self.resume is not None:
                    self.resume.started(self)
                await self._end_event.wait()
        except Exception as exc:
            self.log.exception("session failed")
            self.end_with(internal_error_end(exc))
        finally:
            tasks = list(self._tasks.values())
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _guard(self, work: Callable[[], Awaitable[None]], name: str) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.ended is None:
                self.log.exception("session task %s failed", name)
                self.end_with(internal_error_end(exc))

    async def _goodbye(self, end: SessionEnd) -> None:
        """The wire's last words and the close frame, each bounded (the client may be gone or not reading)."""
        if end.code is None:
            return
        for out in self.wire.closing(end):
            await quietly(self._write(out))
        await quietly(self.transport.close(end.code, close_reason(end.reason)))

    def _count_end(self, pipeline: Pipeline) -> None:
        end = self.ended or SessionEnd("internal", status.WS_1011_INTERNAL_ERROR, "internal error")
        if pipeline.dropped_frames:
            self.metrics.frames_dropped.labels(direction="engine").inc(pipeline.dropped_frames)
        duration = count_end(self.metrics, end.label, self.started)
        self._stop_recording(end.label, end.code)
        self.log.info(
            "session ended",
            extra={
                "protocol": self.protocol,
                "reason": end.label,
                "code": end.code,
                "seconds": round(duration, 2),
                "frames_in": self.frames_in,
                "frames_out": self.frames_out,
                "dropped_out": self.frames_dropped,
                "dropped_in_s": round(self._pacer.dropped_s, 2),
                "client_errors": self.faults,
            },
        )

    # ------------------------------------------------------------------ resume (server/runtime/resume.py)
    def say(self, messages: Sequence[Outgoing]) -> None:
        """Queue messages to the client (the resume hook's notices)."""
        self._queue(messages)

    def detach_transport(self) -> Transport:
        """The connection is gone but the session is held: receiving, feeding and sending stop; the pipeline,
        its LLM request, the pump and the slot stay (a slot fed nothing is skipped by the engine's batch).
        Returns the transport let go."""
        self.away_since = time.monotonic()
        for name in ("receive", "feed", "send", *(n for n, _ in self.transport.tasks())):
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
        return self.transport

    def attach_transport(self, transport: Transport, first: Sequence[Outgoing]) -> None:
        """A resumed connection: ``first`` goes out before what waited in the send queue, then the tasks
        that ``detach_transport`` stopped run again, on fresh clocks (idle, pacing)."""
        self.transport = transport
        now = time.monotonic()
        self.away_since = None
        self.last_audio = self.send_q.last_send = now
        self._pacer = InputPacer(frame_s=FRAME_S, burst_s=self.cfg.input_burst_s, buffer_s=self.input_buffer_s, now=now)
        while self._after_audio and self.pipeline is not None:  # the audio they waited for is not coming
            self.pipeline.apply(self._after_audio.pop(0)[1])

        async def send_first_then_queue() -> None:
            for out in first:
                try:
                    await self._write(out)
                except (WebSocketDisconnect, OSError, RuntimeError):
                    self.end("client_closed", None)
                    return
            await self._send()

        for name, work in (("receive", self._receive), ("feed", self._feed_loop), ("send", send_first_then_queue),
                           *transport.tasks()):
            self._tasks[name] = asyncio.create_task(self._guard(work, name))

    # ------------------------------------------------------------------ sending
    def _write(self, out: Outgoing) -> Awaitable[None]:
        return self.transport.send(out)

    def _queue(self, messages: Sequence[Outgoing]) -> None:
        if self.ended is not None:
            return
        for out in messages:
            if not self.send_q.put(out):
                self.end("slow_client", status.WS_1008_POLICY_VIOLATION, "client is not reading")
                return

    async def _send(self) -> None:
        while True:
            out = await self.send_q.get()
            try:
                await self._write(out)
            except (WebSocketDisconnect, OSError, RuntimeError):  # the client vanished mid-send
                self.end("client_closed", None)
                return
            self.send_q.sent(out, time.monotonic())

    # ------------------------------------------------------------------ receiving
    async def _receive(self) -> None:
        while True:
            message = await self.transport.receive()
            if isinstance(message, (AudioIn, EndIn)):  # from the transport itself (RTP audio, a peer gone)
                await self._apply(self.wire.transport_audio(message) if isinstance(message, AudioIn) else message)
                if self.ended is not None:
                    return
                continue
            if message["type"] == "websocket.disconnect":
                self.client_close_code = message.get("code")
                self.end("client_closed", None)
                return
            now = time.monotonic()
            over = self.limits.message(now)
            for command in [over] if over is not None else self.wire.decode(message, now):
                await self._apply(command)
                if self.ended is not None:
                    return

    async def _apply(self, command: Command) -> None:
        if isinstance(command, AudioIn):
            self._audio(command)
        elif isinstance(command, SettingsIn):
            self._update(command)
        elif isinstance(command, ResetIn):
            await self._reset()
        elif isinstance(command, FunctionOutputIn):
            self._function_output(command)
        elif isinstance(command, Reply):
            self._queue(list(command.messages))
        elif isinstance(command, Fault):
            self._fault(command)
        elif isinstance(command, EndIn):
            self.end_with(command.end)
        elif isinstance(command, Ignored):
            self.log.debug("ignored: %s", command.what)
        else:
            self._conversation(command)

    def _conversation(self, command: ConversationCommand) -> None:
        """A commit or a clear of the user's turn applies after the audio the client sent before it (some may
        still wait in the pacer); what comes after one waits behind it, in order; everything else (a client's
        answer first of all) at once."""
        if self.pipeline is None:
            return
        if isinstance(command, AT_ONCE):
            self._to_session(command)
            return
        if self._after_audio or (isinstance(command, (CommitTurn, ClearTurn)) and self._pacer.queued):
            self._after_audio.append((self.frames_in + self._pacer.queued, command))
            return
        self._to_session(command)

    def _to_session(self, command: ConversationCommand) -> None:
        """The session's command: the events it gives at once go to the wire now (before what the pipeline reports
        later); a refusal is the wire's protocol error."""
        if self.pipeline is None:
            return
        try:
            events = self.pipeline.apply(command)
        except CommandRefused as refused:
            fault = self.wire.command_refused(refused, command)
            if fault is None:
                self.log.info("session command refused (%s): %s", refused.code, refused.message)
            else:
                self._fault(fault)
            return
        for event in events or ():
            self._event(event)

    def _answer_written(self, written: AnswerWritten) -> None:
        """What a client's answer or a Responses round wrote to the oracle stream, counted (the own LLM's
        writes are counted from its events)."""
        if written.new_sequence:
            self.metrics.oracle_resets.inc()
            if written.fifo_s is not None and self.pmetrics is not None:
                self.pmetrics.answer_fifo_seconds.labels(protocol=self.protocol).observe(written.fifo_s)
        self.metrics.oracle_tokens.inc(written.tokens)

    def _fault(self, fault: Fault) -> None:
        fault = self.limits.refused(fault)
        self.faults += 1
        self.metrics.protocol_errors.labels(kind=fault.kind).inc()
        if fault.code is not None and self.pmetrics is not None:
            self.pmetrics.client_error(fault.code)
        if fault.end is not None:
            self.log.warning("closing: %s", fault.message)
            self.end_with(fault.end)
            return
        if self.faults <= LOGGED_FAULTS:
            self.log.info("client message refused (%s): %s", fault.code or fault.kind, fault.message)
        self._queue(list(fault.reply))

    def _audio(self, command: AudioIn) -> None:
        now = time.monotonic()
        self.last_audio = now
        if not command.frames:
            return
        pushed = self._pacer.push(command.frames, now)
        for frame in pushed.released:
            self._feed(frame)
        if self._pacer.queued:
            self._feed_wake.set()
        if not pushed.dropped:
            return
        self.metrics.frames_dropped.labels(direction="in").inc(pushed.dropped)
        if self.pmetrics is not None:
            self.pmetrics.audio_dropped_s.labels(protocol=self.protocol).inc(pushed.dropped * FRAME_S)
        if self._pacer.dropped_s > self.cfg.flood_close_s:
            self.log.warning("closing: %.1f s of audio sent ahead of real time dropped", self._pacer.dropped_s)
            self.end("audio_flood", status.WS_1008_POLICY_VIOLATION, "audio faster than real time",
                     error=f"audio sent faster than real time: {self._pacer.dropped_s:.1f} s dropped",
                     error_code="audio_flood", error_type="invalid_request_error")
        elif pushed.overflow_started:
            self.log.warning("client sends audio faster than real time: dropping what is ahead by more than %.1f s",
                             self.input_buffer_s + self.cfg.input_burst_s)
            refusal = self.wire.client_error(
                "input_audio_buffer_overflow",
                f"audio arrived more than {self.input_buffer_s:g} s ahead of real time; the excess was dropped "
                "(send audio at real time)", command.event_id)
            if refusal is not None:
                self._fault(refusal)

    def _feed(self, frame: np.ndarray) -> None:
        if self.pipeline is None:
            return
        self.frames_in += 1
        self.pipeline.feed(frame)
        if self.recorder is not None:
            self.recorder.user_audio(frame)
        while self._after_audio and self._after_audio[0][0] <= self.frames_in:
            self._to_session(self._after_audio.pop(0)[1])

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

    def _update(self, command: SettingsIn) -> None:
        assert self.pipeline is not None
        try:
            self.pipeline.update(command.settings)
        except (ValueError, KeyError) as exc:
            for follow in self.wire.settings_rejected(str(exc), command):
                if isinstance(follow, Fault):
                    self._fault(follow)
                elif isinstance(follow, Reply):
                    self._queue(list(follow.messages))
            if self.resume is not None:  # a Live session starts even with its settings refused: resumable
                self.resume.offer(self)
            return
        old, new = self.settings, command.settings
        self.settings = new
        if new.record != old.record:
            if new.record:
                self._start_recording()
            else:
                self._stop_recording("client", None)
        if new != old:
            self.log.info("settings changed", extra={k: v for k, v in new.for_log().items() if k != "instructions"})
        if command.ignored:
            self.log.debug("settings: ignored %s", ",".join(command.ignored))
        self._queue(self.wire.settings_applied(new, command))
        if self.resume is not None:  # kame's events turned on: the session becomes resumable
            self.resume.offer(self)

    def _function_output(self, command: FunctionOutputIn) -> None:
        assert self.pipeline is not None
        try:
            self.pipeline.deliver_function_output(command.call_id, command.output)
        except KeyError as exc:  # UnknownCallId
            for follow in self.wire.function_output_rejected(str(exc), command):
                if isinstance(follow, Fault):
                    self._fault(follow)
                elif isinstance(follow, Reply):
                    self._queue(list(follow.messages))
            return
        self._queue(self.wire.function_output_accepted(command))

    async def _reset(self) -> None:
        """Fresh model state and transcript, same settings and socket; the slot is kept throughout."""
        assert self.pipeline is not None
        self._queue(self.wire.reset_starting())
        pump = self._tasks.pop("pump", None)
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        try:
            await self.pipeline.reset()
        except EngineFull:
            self.end("reset_failed", status.WS_1013_TRY_AGAIN_LATER, "server full, retry later",
                     error="the session lost its engine slot during the reset", error_code="server_full")
            return
        except EngineFailed as exc:
            self.log.error("reset failed: %s", exc)
            self.end_with(engine_error_end())
            return
        self._tasks["pump"] = asyncio.create_task(self._guard(self._pump, "pump"))
        self.log.info("session reset by the client")
        self._queue(self.wire.reset_done())

    # ------------------------------------------------------------------ output
    async def _pump(self) -> None:
        assert self.pipeline is not None
        pipeline = self.pipeline
        while True:
            event = await pipeline.next_event()
            if isinstance(event, AssistantFrame):
                self._frame(event)
            elif isinstance(event, EngineDown):
                self.log.error("engine failed this session: %s", event.message)
                self.end_with(engine_error_end())
                return
            else:
                self._event(event)

    def _frame(self, frame: AssistantFrame) -> None:
        index = self.frames_out
        self.frames_out += 1
        if index == 0 and self.pipeline is not None and self.pipeline.first_reply_s is not None:
            self.metrics.first_reply_seconds.observe(self.pipeline.first_reply_s)
        if self.recorder is not None:
            self.recorder.assistant_audio(frame.pcm)
            if frame.piece is not None:
                self.recorder.event("assistant.text", {"id": frame.text_id, "piece": frame.piece})
        send_audio = self.send_q.audio_ok()
        if not send_audio:
            self.frames_dropped += 1
            self.metrics.frames_dropped.labels(direction="out").inc()
        for out in self.wire.frame(frame, index, send_audio):
            if isinstance(out, Outgoing):
                self._queue((out,))
            else:
                self._conversation(out)

    def _event(self, event: PipelineEvent) -> None:
        self.metrics.on_event(event)
        if self.recorder is not None:
            self.recorder.event(event.name, event.fields())
        self._queue(self.wire.event(event))
        if event.has_text:
            self.log.debug("%s %s", event.name, event.fields())
        elif isinstance(event, (LlmError, AsrFailed, BackendDown)):
            extra: dict[str, Any] = {k: v for k, v in event.fields().items() if k in ("backend", "error")}
            self.log.warning("%s", event.name, extra=extra)
        elif event.name.startswith(("llm.", "backend.")):
            self.log.info("%s", event.name, extra={k: v for k, v in event.fields().items() if k in ("backend", "ttft_s")})

    async def _watch(self) -> None:
        warned = False
        while True:
            await asyncio.sleep(watch_period(self.cfg))
            if self.away_since is not None:  # held for a resume: the resume window rules, not idleness
                continue
            verdict = watch(self.cfg, now=time.monotonic(), started=self.started, last_audio=self.last_audio,
                            last_send=self.send_q.last_send, send_pending=self.send_q.pending, warned=warned)
            if verdict.end is not None:
                self.end(*verdict.end)
                return
            if verdict.warn_s is not None:
                warned = True
                self._queue(self.wire.expiring(verdict.warn_s))
                self.log.info("session ends in %.1f s (maximum duration)", verdict.warn_s)

    # ------------------------------------------------------------------ recording
    def _start_recording(self) -> None:
        if self.recorder is None and self.new_recorder is not None:
            self.recorder = self.new_recorder(self.settings)

    def _record_leftovers(self, pipeline: Pipeline) -> None:
        """Events the pipeline reported while it closed (the ASR's last final, the oracle's last words): the
        pump has stopped, so nobody sends them, but the recording keeps them."""
        if self.recorder is None:
            return
        for event in pipeline.drain_events():
            if isinstance(event, AssistantFrame):
                self.recorder.assistant_audio(event.pcm)
            elif not isinstance(event, EngineDown):
                self.recorder.event(event.name, event.fields())

    def _stop_recording(self, reason: str, code: int | None) -> None:
        if self.recorder is not None:
            self.recorder.close({"reason": reason, "code": code})
            self.recorder = None
