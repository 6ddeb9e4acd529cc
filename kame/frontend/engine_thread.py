"""The engine thread: the only thread that touches the model and its streaming state.

Sessions talk to it through thread-safe, non-blocking calls: :meth:`feed`
appends PCM to the slot's input buffer, the ``oracle_*`` calls and
:meth:`set_sampling` queue commands that the thread applies before its next
tick, and every output frame is handed to the slot's ``on_output`` callback
(from the engine thread: asyncio users wrap it with
``loop.call_soon_threadsafe``, see :class:`AsyncSlot`).

Batching policy: the thread ticks as soon as every *live* slot (one that
received audio recently) has a full frame, or when the oldest waiting frame
has waited ``max_batch_wait_s``; each tick steps all slots with a frame, so
sessions whose audio arrives at different phases of the 80 ms cadence still
share ticks instead of costing one tick each.

Failures: the thread never dies silently. Every command runs guarded: one
that fails (an attach, a reset, an oracle command) fails *its* slot (the
slot's ``on_error`` is called and the slot is released), never the thread.
A tick that fails fails the slots it stepped. Should the loop itself fail
anyway, :attr:`EngineThread.error` says why, every slot gets ``on_error``,
``on_death`` is called (the server then answers ``/health`` with 503) and
attaching raises :class:`EngineFailed`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.frontend.engine import EngineCore, EngineStepError, SlotOutput
from kame.frontend.prompts import PromptPlan

log = logging.getLogger(__name__)

OutputCallback = Callable[[SlotOutput], None]
ErrorCallback = Callable[[str], None]
#: Receives the shared STT's step of a slot (a :class:`~kame.asr.kyutai_core.SttStep`), in the engine thread.
SttSink = Callable[[Any], None]


@dataclass(frozen=True)
class PromptRequest:
    """A session's voice (a name of the checkpoint's voices; None: the default) and persona (its role text)."""

    voice: str | None = None
    persona: str | None = None


#: ``_loop``'s marker for a tick of the slots in their system prompts only.
PROMPT_TICK: Any = object()


class EngineFull(RuntimeError):
    """Every slot is taken."""


class EngineFailed(RuntimeError):
    """The engine could not give this session a working slot: the command failed, took longer than its
    bound, or the engine thread is dead."""


@dataclass
class TickStats:
    """Handed to ``on_tick`` after every tick (for metrics)."""

    duration_s: float
    slots: int
    waited_s: float  # how long the oldest stepped frame waited before the tick
    prompt_refreshes: int = 0  # PersonaPlex slots that began stepping their prompts again (frontend.refresh_prompts)


@dataclass
class _SlotIO:
    on_output: OutputCallback
    on_error: ErrorCallback
    buffer: list[np.ndarray] = field(default_factory=list)
    buffered: int = 0
    first_ready_t: float | None = None
    last_feed_t: float = 0.0
    dropped_samples: int = 0
    stt_sink: SttSink | None = None
    #: Frames still to step before ``flush_done`` is called (an STT flush at the end of a session).
    flush_left: int = 0
    flush_done: Callable[[], None] | None = None


class EngineThread:
    """Owns an :class:`EngineCore` and steps it in a dedicated thread."""

    def __init__(
        self,
        core: EngineCore,
        *,
        max_batch_wait_s: float | None = None,
        live_window_s: float = 0.5,
        max_buffer_s: float = 2.0,
        on_tick: Callable[[TickStats], None] | None = None,
        on_death: Callable[[str], None] | None = None,
    ) -> None:
        self.core = core
        self.frame_size = core.frame_size
        self.sample_rate = core.models.sample_rate
        self.max_batch_wait_s = core.cfg.batch_wait_s if max_batch_wait_s is None else max_batch_wait_s
        self.live_window_s = live_window_s
        self.max_buffer_samples = int(max_buffer_s * self.sample_rate)
        self.on_tick = on_tick
        self.on_death = on_death
        #: Why the thread died (None while it runs).
        self.error: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._io: dict[int, _SlotIO] = {}
        self._free = list(range(core.batch_size))
        self._thread: threading.Thread | None = None
        self._stop = False
        self.ticks = 0
        #: Ticks that stepped only slots in their system prompts (PersonaPlex).
        self.prompt_ticks = 0
        #: When the tick or the commands now running started (None while the thread waits for work).
        self._busy_since: float | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kame-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def stuck_for(self, now: float | None = None) -> float:
        """How long the tick or command now running has been running (0 while the thread waits for work):
        a thread that hangs in the model never dies, so only this shows it."""
        since = self._busy_since
        if since is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - since)

    def declare_dead(self, reason: str) -> None:
        """Called from outside when the thread hangs (:meth:`stuck_for` beyond the server's bound): the same
        end as a thread that died, so the server turns failed and every live session is told."""
        if self.error is None:
            self._die(reason, exc_info=False)

    @property
    def alive(self) -> bool:
        """Started and not dead (a stopped engine is not alive either)."""
        return self._thread is not None and self.error is None

    @property
    def free_slots(self) -> int:
        with self._lock:
            return len(self._free) if self.error is None else 0

    # ------------------------------------------------------------------ slot API (any thread)
    def attach(
        self, on_output: OutputCallback, on_error: ErrorCallback, on_ready: Callable[[int], None],
        prompt: PromptRequest | None = None,
    ) -> int:
        """Reserve a slot now; the engine thread resets it and then calls ``on_ready(slot)``.

        ``prompt``: the session's voice and persona (PersonaPlex checkpoints: their system prompts are
        built and started by the attach; other checkpoints ignore it)."""
        with self._wake:
            if self.error is not None:
                raise EngineFailed(f"the engine thread is dead ({self.error})")
            if not self._free:
                raise EngineFull("all engine slots are taken")
            slot = self._free.pop(0)
            io = self._io[slot] = _SlotIO(on_output=on_output, on_error=on_error, last_feed_t=time.monotonic())

            def do_attach() -> None:
                self.core.attach(slot, self._plan(prompt))
                on_ready(slot)

            self._commands.put(self._guarded(slot, io, do_attach, "attach"))
            self._wake.notify_all()
        return slot

    def _plan(self, prompt: PromptRequest | None) -> PromptPlan | None:
        """In the engine thread: the slot's prompt frames (loads the voice on its first use)."""
        if self.core.prompts is None:
            return None
        request = prompt or PromptRequest()
        return self.core.models.prompt_plan(request.voice, request.persona)

    def reattach(
        self, slot: int, on_output: OutputCallback, on_error: ErrorCallback, on_ready: Callable[[int], None],
        prompt: PromptRequest | None = None,
    ) -> None:
        """Fresh state for a slot its session keeps (a reset): the slot is never free in between, so no
        other session can take it. Input buffered and frames taken for the old state are dropped.
        Raises :class:`EngineFull` when the slot is no longer held (the engine failed it)."""
        with self._wake:
            if self.error is not None:
                raise EngineFailed(f"the engine thread is dead ({self.error})")
            if slot not in self._io:
                raise EngineFull(f"slot {slot} is not attached")
            io = self._io[slot] = _SlotIO(on_output=on_output, on_error=on_error, last_feed_t=time.monotonic())

            def do_reattach() -> None:
                self.core.detach(slot)
                self.core.attach(slot, self._plan(prompt))
                on_ready(slot)

            self._commands.put(self._guarded(slot, io, do_reattach, "reset"))
            self._wake.notify_all()

    def detach(self, slot: int) -> None:
        """Release the slot at once; the engine thread resets it before anyone steps it again
        (commands run in order, and frames taken for the old session are dropped)."""
        with self._wake:
            if self._io.pop(slot, None) is None:
                return
            self._free.append(slot)
            self._commands.put(lambda: self.core.detach(slot))
            self._wake.notify_all()

    def feed(self, slot: int, pcm: np.ndarray) -> None:
        """Append PCM (float32, any length) to the slot's input; never blocks on the model."""
        data = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if data.size == 0:
            return
        with self._wake:
            io = self._io.get(slot)
            if io is None:
                return
            io.buffer.append(data)
            io.buffered += data.size
            io.last_feed_t = time.monotonic()
            if io.buffered > self.max_buffer_samples:
                self._drop_oldest(io)
            if io.first_ready_t is None and io.buffered >= self.frame_size:
                io.first_ready_t = io.last_feed_t
            self._wake.notify_all()

    def _drop_oldest(self, io: _SlotIO) -> None:
        """Under the lock: drop the oldest whole frames beyond ``max_buffer_s``, and no more. After a tick the
        slot's remainder is one joined piece (``_take_frames``), so dropping whole pieces would throw away up
        to ``max_buffer_s`` of audio at once when the engine falls just behind it (seen on a loaded machine:
        1.92 s of a session's input gone in one go)."""
        excess = io.buffered - self.max_buffer_samples
        drop = min(io.buffered, -(-excess // self.frame_size) * self.frame_size)
        io.buffered -= drop
        io.dropped_samples += drop
        while drop > 0:
            head = io.buffer[0]
            if head.size <= drop:
                io.buffer.pop(0)
                drop -= head.size
            else:
                io.buffer[0] = head[drop:]
                drop = 0

    def dropped_samples(self, slot: int) -> int:
        with self._lock:
            io = self._io.get(slot)
            return io.dropped_samples if io else 0

    def _command(self, slot: int, fn: Callable[[], None], what: str) -> None:
        with self._wake:
            io = self._io.get(slot)
            if io is None:
                return
            self._commands.put(self._guarded(slot, io, fn, what))
            self._wake.notify_all()

    def _guarded(self, slot: int, io: _SlotIO, fn: Callable[[], None], what: str) -> Callable[[], None]:
        """``fn`` for the engine thread: skipped when the slot changed hands since, and when it fails,
        the failure ends that slot's session (``on_error``, slot released), not the thread."""

        def run() -> None:
            with self._lock:
                if self._io.get(slot) is not io:
                    return  # detached (or reset again) since: the command is stale
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - one slot's failure, not the engine's
                log.exception("engine command %s of slot %d failed", what, slot)
                self._fail_slot(slot, io, f"engine {what} failed ({exc.__class__.__name__})")

        return run

    def _oracle(self, slot: int, fn: Callable[[], None], what: str) -> bool:
        """Oracle writes go to the slot's FIFO at once, not through the command queue: an answer must not
        wait for the step in progress (the FIFO has its own lock; the engine thread pops one token per
        step). Writes are ordered as they are made; attach, detach and reset stay commands and are
        awaited before a session writes, so none of its writes can be cleared by them."""
        with self._lock:
            io = self._io.get(slot)
            if io is None:
                return False
            try:
                fn()
                return True
            except Exception as exc:  # noqa: BLE001 - a bad write is that session's problem, not the engine's
                log.exception("oracle %s of slot %d failed", what, slot)
                message = f"engine oracle {what} failed ({exc.__class__.__name__})"
        self._fail_slot(slot, io, message)  # out of the lock: it releases the slot
        return False

    def oracle_reset(self, slot: int, first_ids: list[int], done: Callable[[float], None] | None = None) -> None:
        """A new oracle sequence, in the FIFO when this returns; ``done(t)`` then says when."""
        ids = list(first_ids)
        if self._oracle(slot, lambda: self.core.oracle_reset(slot, ids), "reset") and done is not None:
            done(time.monotonic())

    def oracle_push(self, slot: int, ids: list[int]) -> None:
        ids = list(ids)
        self._oracle(slot, lambda: self.core.oracle_push(slot, ids), "push")

    def oracle_clear(self, slot: int) -> None:
        self._oracle(slot, lambda: self.core.oracle_clear(slot), "clear")

    def set_sampling(self, slot: int, temp_text: float | None, top_k_text: int | None) -> None:
        self._command(slot, lambda: self.core.set_slot_sampling(slot, temp_text, top_k_text), "set_sampling")

    def stt_attach(self, slot: int, sink: SttSink) -> None:
        """Start the engine's shared Kyutai STT on this slot (silence prefix included); its step of every
        frame goes to ``sink``, called in the engine thread."""

        def do() -> None:
            self.core.stt_attach(slot)
            with self._lock:
                io = self._io.get(slot)
                if io is not None:
                    io.stt_sink = sink

        self._command(slot, do, "stt_attach")

    def stt_flush(self, slot: int, frames: int, done: Callable[[], None]) -> None:
        """End of a session with the shared STT: step ``frames`` frames of silence on the slot (its text
        lags the audio by the STT's delay), then call ``done`` (engine thread). An engine command, so it
        starts between two ticks; the front-end's output of those frames is not delivered. ``done`` is
        called at once when the slot is gone."""
        with self._wake:
            io = self._io.get(slot)
            if io is None or frames <= 0:
                done()
                return

            def do_flush() -> None:
                with self._lock:
                    if self._io.get(slot) is not io:
                        stale = True
                    else:
                        stale = False
                        io.on_output = _ignore_output
                        io.flush_left = frames
                        io.flush_done = done
                        silence = np.zeros(frames * self.frame_size, np.float32)
                        io.buffer = [silence]
                        io.buffered = silence.size
                        io.first_ready_t = io.last_feed_t = time.monotonic()
                if stale:
                    done()

            self._commands.put(do_flush)
            self._wake.notify_all()

    # ------------------------------------------------------------------ engine thread
    def _take_frames(self, now: float) -> tuple[dict[int, np.ndarray], float] | None:
        """Under the lock: the frames to step now, or None to keep waiting."""
        ready = [s for s, io in self._io.items() if io.buffered >= self.frame_size]
        if not ready:
            return None
        live_waiting = [
            s
            for s, io in self._io.items()
            if io.buffered < self.frame_size and now - io.last_feed_t < self.live_window_s
        ]
        oldest = min(self._io[s].first_ready_t or now for s in ready)
        waited = now - oldest
        if live_waiting and waited < self.max_batch_wait_s:
            return None
        frames: dict[int, np.ndarray] = {}
        for s in ready:
            io = self._io[s]
            joined = np.concatenate(io.buffer) if len(io.buffer) > 1 else io.buffer[0]
            frames[s] = joined[: self.frame_size]
            rest = joined[self.frame_size :]
            io.buffer = [rest] if rest.size else []
            io.buffered = int(rest.size)
            io.first_ready_t = now if io.buffered >= self.frame_size else None
        return frames, waited

    def _next_deadline(self, now: float) -> float | None:
        waits = [io.first_ready_t for io in self._io.values() if io.first_ready_t is not None]
        if not waits:
            return None
        return max(0.0, min(waits) + self.max_batch_wait_s - now)

    def _drain_commands(self) -> None:
        while True:
            try:
                fn = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception:  # noqa: BLE001 - commands are guarded (_guarded); this is the last resort
                log.exception("engine command failed")

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - the last resort: never die silently (logged, then said)
            self._die(f"{exc.__class__.__name__}: {exc}")

    def _die(self, reason: str, exc_info: bool = True) -> None:
        log.critical("the engine thread died: %s", reason, exc_info=exc_info)
        with self._lock:
            self.error = reason
            live = list(self._io.items())
            self._io.clear()
        if self.on_death is not None:  # first, so that the server says "failed" before sessions end
            try:
                self.on_death(reason)
            except Exception:  # noqa: BLE001
                log.exception("engine on_death callback failed")
        for slot, io in live:
            self._notify_error(slot, io, "the engine stopped")

    def _loop(self) -> None:
        while True:
            with self._wake:
                while True:
                    if self._stop:
                        return
                    if not self._commands.empty():
                        taken = None
                        break
                    now = time.monotonic()
                    taken = self._take_frames(now)
                    if taken is not None:
                        break
                    if self.core.prompts is not None and self.core.prompting_slots():
                        taken = PROMPT_TICK  # no frame is due: the engine's time goes to system prompts
                        break
                    self._wake.wait(self._next_deadline(now))
                stepping = taken[0] if taken is not None and taken is not PROMPT_TICK else {}
                callbacks = {s: self._io[s] for s in stepping if s in self._io}
            self._busy_since = time.monotonic()
            try:
                self._work(taken, callbacks)
            finally:
                self._busy_since = None

    def _work(self, taken: tuple[dict[int, np.ndarray], float] | None, callbacks: dict[int, _SlotIO]) -> None:
        """One turn of the loop: the queued commands, then one tick of the slots whose frames were taken."""
        self._drain_commands()
        if taken is None:
            return
        if taken is PROMPT_TICK:
            self._prompt_tick()
            return
        frames, waited = taken
        # A slot detached since its frames were taken must not be stepped.
        with self._lock:  # a slot detached (and maybe re-attached) since its frames were taken: drop them
            frames = {s: f for s, f in frames.items() if s in callbacks and self._io.get(s) is callbacks[s]}
        if not frames:
            return
        riders: dict[int, _SlotIO] = {}
        if self.core.prompts is not None:  # slots in their system prompts ride along: the batch has room
            with self._lock:
                riders = {s: self._io[s] for s in self.core.prompting_slots() if s not in frames and s in self._io}
        t0 = time.perf_counter()
        refreshes = self.core.prompt_refreshes
        try:
            outputs = self.core.tick({**frames, **dict.fromkeys(riders)})
        except EngineStepError as exc:
            self._fail_slots(exc.slots, {**callbacks, **riders}, str(exc.cause.__class__.__name__))
            return
        except Exception as exc:  # noqa: BLE001 - e.g. a bad frame: those slots fail, the engine goes on
            log.exception("engine tick failed for slots %s", sorted(frames))
            self._fail_slots(sorted(frames), callbacks, exc.__class__.__name__)
            return
        duration = time.perf_counter() - t0
        self.ticks += 1
        for slot, out in outputs.items():
            if slot in riders:
                continue  # a prompt step of a slot that sent no frame: nothing to deliver
            self._deliver(slot, callbacks[slot], out)
        if self.on_tick is not None:
            try:
                self.on_tick(TickStats(duration_s=duration, slots=len(frames), waited_s=waited,
                                       prompt_refreshes=self.core.prompt_refreshes - refreshes))
            except Exception:  # noqa: BLE001
                log.exception("on_tick callback failed")

    def _prompt_tick(self) -> None:
        """One step of every slot still in its system prompts, between frame ticks: prompts run faster than
        real time while the engine has room, and a frame that falls due meanwhile waits one step at most."""
        with self._lock:
            slots = [s for s in self.core.prompting_slots() if s in self._io]
            callbacks = {s: self._io[s] for s in slots}
        if not slots:
            return
        t0 = time.perf_counter()
        try:
            self.core.tick({s: None for s in slots})
        except EngineStepError as exc:
            self._fail_slots(exc.slots, callbacks, str(exc.cause.__class__.__name__))
        except Exception as exc:  # noqa: BLE001
            log.exception("engine prompt tick failed for slots %s", slots)
            self._fail_slots(slots, callbacks, exc.__class__.__name__)
        else:
            self.ticks += 1
            self.prompt_ticks += 1
            if self.on_tick is not None:
                try:
                    self.on_tick(TickStats(duration_s=time.perf_counter() - t0, slots=len(slots), waited_s=0.0))
                except Exception:  # noqa: BLE001
                    log.exception("on_tick callback failed")

    def _deliver(self, slot: int, io: _SlotIO, out: SlotOutput) -> None:
        try:
            if out.stt is not None and io.stt_sink is not None:
                io.stt_sink(out.stt)
            io.on_output(out)
        except Exception:  # noqa: BLE001
            log.exception("output callback of slot %d failed", slot)
        if io.flush_done is not None:
            io.flush_left -= 1
            if io.flush_left <= 0:
                done, io.flush_done = io.flush_done, None
                try:
                    done()
                except Exception:  # noqa: BLE001
                    log.exception("flush callback of slot %d failed", slot)

    @staticmethod
    def _notify_error(slot: int, io: _SlotIO, message: str) -> None:
        try:
            io.on_error(message)
        except Exception:  # noqa: BLE001
            log.exception("error callback of slot %d failed", slot)
        if io.flush_done is not None:
            done, io.flush_done = io.flush_done, None
            try:
                done()
            except Exception:  # noqa: BLE001
                log.exception("flush callback of slot %d failed", slot)

    def _fail_slot(self, slot: int, io: _SlotIO, message: str) -> None:
        """End one slot's session: its ``on_error``, then the slot released (if it is still that session's)."""
        with self._lock:
            current = self._io.get(slot) is io
        if not current:
            return
        self._notify_error(slot, io, message)
        self.detach(slot)

    def _fail_slots(self, slots: list[int], callbacks: dict[int, _SlotIO], reason: str) -> None:
        for slot in slots:
            io = callbacks.get(slot)
            if io is not None:
                self._fail_slot(slot, io, f"engine step failed ({reason})")


def _ignore_output(out: SlotOutput) -> None:
    """Output of a slot whose session no longer reads it (the STT flush at its end)."""


#: How long an attach or a reset may take before the session is failed (the engine is stuck or overloaded).
COMMAND_TIMEOUT_S = 10.0


class AsyncSlot:
    """An engine slot seen from asyncio: outputs arrive on an ``asyncio.Queue``.

    Only :class:`~kame.session.pipeline.Pipeline` uses it outside tests: the
    pipeline is the one owner of a session's slot.
    """

    def __init__(
        self,
        engine: EngineThread,
        max_queued: int = 64,
        *,
        timeout_s: float = COMMAND_TIMEOUT_S,
        sink: Callable[[SlotOutput | Exception], None] | None = None,
    ) -> None:
        """``sink``: receives every output (and the failure) in the event loop instead of :attr:`outputs`."""
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.outputs: asyncio.Queue[SlotOutput | Exception] = asyncio.Queue(max_queued)
        self.slot: int | None = None
        self.dropped_outputs = 0
        self.timeout_s = timeout_s
        self.sink = sink
        #: The voice and persona the slot was attached with (a reset keeps them).
        self.prompt: PromptRequest | None = None
        self._ready: asyncio.Future[int] = self.loop.create_future()

    def _put(self, outputs: asyncio.Queue[SlotOutput | Exception], item: SlotOutput | Exception) -> None:
        if self.sink is not None:
            if outputs is self.outputs:  # not a frame of a state reset since
                self.sink(item)
            return
        try:
            outputs.put_nowait(item)
        except asyncio.QueueFull:  # a consumer that does not read loses frames, not the engine
            if isinstance(item, Exception):  # a failure is never lost: make room for it
                outputs.get_nowait()
                outputs.put_nowait(item)
            self.dropped_outputs += 1

    def _callbacks(self) -> tuple[OutputCallback, ErrorCallback, Callable[[int], None]]:
        """Engine-thread callbacks bound to the current queue and ready future, so that frames of a state
        that was reset since land in the old queue, not the new one."""
        outputs, ready, loop = self.outputs, self._ready, self.loop

        def on_output(out: SlotOutput) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._put, outputs, out)

        def failed(msg: str) -> None:
            if not ready.done():  # the attach (or reset) itself failed
                ready.set_exception(EngineFailed(msg))
            self._put(outputs, EngineFailed(msg))

        def on_error(msg: str) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(failed, msg)

        def ready_now(slot: int) -> None:
            if not ready.done():
                ready.set_result(slot)

        def on_ready(slot: int) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(ready_now, slot)

        return on_output, on_error, on_ready

    async def _wait_ready(self, what: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.timeout_s)
        except asyncio.TimeoutError:
            self.detach()
            raise EngineFailed(f"the engine did not {what} the slot within {self.timeout_s:g} s") from None
        except EngineFailed:
            self.slot = None  # the engine released it already
            raise

    async def attach(self, prompt: PromptRequest | None = None) -> int:
        """Attach a fresh slot. Raises :class:`EngineFull` (no slot free) or :class:`EngineFailed` (the
        attach failed or took longer than ``timeout_s``: the slot is released again)."""
        self.prompt = prompt
        self.slot = self.engine.attach(*self._callbacks(), prompt=prompt)
        slot = self.slot
        await self._wait_ready("attach")
        return slot

    async def reset(self) -> None:
        """Fresh Moshi, Mimi and oracle state on the same slot, which stays this session's throughout.
        Raises :class:`EngineFull` when the engine has meanwhile failed the slot, :class:`EngineFailed`
        when the reset fails or takes longer than ``timeout_s``."""
        if self.slot is None:
            raise EngineFull("not attached")
        self.outputs = asyncio.Queue(self.outputs.maxsize)
        self._ready = self.loop.create_future()
        try:
            self.engine.reattach(self.slot, *self._callbacks(), prompt=self.prompt)
        except (EngineFull, EngineFailed):
            self.slot = None
            raise
        await self._wait_ready("reset")

    def feed(self, pcm: np.ndarray) -> None:
        if self.slot is not None:
            self.engine.feed(self.slot, pcm)

    def detach(self) -> None:
        if self.slot is not None:
            self.engine.detach(self.slot)
            self.slot = None

    def oracle_reset(self, first_ids: list[int], done: Callable[[float], None] | None = None) -> None:
        if self.slot is not None:
            self.engine.oracle_reset(self.slot, first_ids, done)

    def oracle_push(self, ids: list[int]) -> None:
        if self.slot is not None:
            self.engine.oracle_push(self.slot, ids)

    def oracle_clear(self) -> None:
        if self.slot is not None:
            self.engine.oracle_clear(self.slot)

    def set_sampling(self, temp_text: float | None, top_k_text: int | None) -> None:
        if self.slot is not None:
            self.engine.set_sampling(self.slot, temp_text, top_k_text)

    def stt_attach(self, sink: SttSink) -> None:
        if self.slot is not None:
            self.engine.stt_attach(self.slot, sink)

    async def stt_flush(self, frames: int, timeout: float) -> None:
        """Step ``frames`` frames of silence for the shared STT and wait (at most ``timeout``) until they went
        through."""
        if self.slot is None:
            return
        done = asyncio.Event()
        loop = self.loop

        def on_done() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(done.set)

        self.engine.stt_flush(self.slot, frames, on_done)
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except asyncio.TimeoutError:
            pass
