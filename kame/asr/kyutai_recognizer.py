"""``asr.kind: kyutai``: Kyutai STT for many sessions on one batched model.

One :class:`KyutaiRecognizer` per server loads the STT model once. Each
session's :class:`~kame.asr.stream.AsrStream` only queues audio; one engine
thread takes 80 ms from every open stream that has it, steps them all as one
batch and emits each stream's events (see :mod:`kame.asr.kyutai_turns`).
The silence prefix the checkpoint asks for is fed when a stream opens, and a
closing stream is flushed with the model's delay of silence, so its last
words are not lost. The thread steps the batch once per frame period (see
:mod:`kame.asr.stt_pacing`), every call inside moshi's gate
(:mod:`kame.frontend.moshi_gate`), and the model is warmed up (compiled,
graphs captured) before the server is ready. For offline use (``kame transcribe``)
:meth:`KyutaiRecognizer.new_transcriber` runs a batch-1 model in the caller's
thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kame.asr.config import AsrConfig
from kame.asr.events import Emission
from kame.asr.kyutai_core import EOT_MODEL, SttCore
from kame.asr.kyutai_turns import SttTurns
from kame.asr.recognizer import AsrUnavailableError, Recognizer
from kame.asr.stream import AsrStream, EventCallback
from kame.asr.stt_pacing import wait_before_step
from kame.asr.transcriber import Transcriber, TranscriberStats
from kame.audio.media import FRAME_RATE, FRAME_SIZE
from kame.errors import UserError
from kame.frontend.moshi_gate import MoshiMode, first_line

log = logging.getLogger(__name__)

FRAME = FRAME_SIZE
#: The default: Kyutai's 1B en/fr STT in the repo whose config carries the end-of-turn heads.
DEFAULT_MODEL = EOT_MODEL
FLUSH_EXTRA_FRAMES = 4
POLL_S = 0.02  #: how often the engine thread looks for frames while it waits


def _device(cfg: AsrConfig) -> torch.device:
    from kame.frontend.loading import resolve_device

    return resolve_device(cfg.device)


def _turns(core: SttCore, cfg: AsrConfig) -> SttTurns:
    silence = max(2, round(cfg.turn.end_silence_s * FRAME_RATE))
    return SttTurns(core.piece_of, vocab=core.vocab, silence_frames=silence)


def _load(cfg: AsrConfig, batch: int, cache_dir: str | Path | None = None, mode: MoshiMode | None = None) -> SttCore:
    try:
        return SttCore.from_spec(cfg.model or DEFAULT_MODEL, _device(cfg), batch, cache_dir=cache_dir, mode=mode)
    except UserError:
        raise
    except ValueError as exc:
        raise AsrUnavailableError(str(exc)) from None


class KyutaiTranscriber(Transcriber):
    """Batch-1 Kyutai STT driven synchronously (offline transcription)."""

    def __init__(self, core: SttCore, cfg: AsrConfig) -> None:
        self.core = core
        self.stats = TranscriberStats()
        self.turns = _turns(core, cfg)
        self._buf: np.ndarray = np.zeros(0, np.float32)
        core.attach(0)
        self._pending_silence = core.silence_prefix_frames

    def _step(self, frame: np.ndarray) -> list[Emission]:
        out = self.core.step_pcm({0: frame})[0]
        return self.turns.feed(out.text_id, out.end_prob)

    def push(self, pcm: np.ndarray) -> list[Emission]:
        ems: list[Emission] = []
        while self._pending_silence > 0:
            self._pending_silence -= 1
            ems += self._step(np.zeros(FRAME, np.float32))
        self._buf = np.concatenate([self._buf, np.asarray(pcm, np.float32).reshape(-1)])
        while self._buf.size >= FRAME:
            frame, self._buf = self._buf[:FRAME], self._buf[FRAME:]
            ems += self._step(frame)
        return ems

    def pending(self) -> bool:
        return False

    def work(self) -> list[Emission]:
        return []

    def finish(self) -> list[Emission]:
        ems: list[Emission] = []
        if self._buf.size:
            ems += self._step(np.pad(self._buf, (0, FRAME - self._buf.size)))
            self._buf = np.zeros(0, np.float32)
        for _ in range(self.core.delay_frames + FLUSH_EXTRA_FRAMES):
            ems += self._step(np.zeros(FRAME, np.float32))
        return ems + self.turns.end_turn()


@dataclass
class _Slot:
    stream: AsrStream
    turns: SttTurns
    buf: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    silence_left: int = 0
    flush_left: int | None = None  # frames of silence still to feed after close


class KyutaiRecognizer(Recognizer):
    """Loads the STT model once; one engine thread steps every open stream."""

    kind = "kyutai"

    def __init__(
        self,
        cfg: AsrConfig,
        *,
        batch_size: int = 1,
        cache_dir: str | Path | None = None,
        mode: MoshiMode | None = None,
        warmup_steps: int = 0,
    ) -> None:
        """``mode``: compile and CUDA graphs (the front-end's settings); ``warmup_steps``: silent steps of every
        slot before the engine thread starts (compiles and captures graphs now, not in the first session)."""
        super().__init__(cfg)
        self.batch_size = batch_size
        self.cache_dir = cache_dir
        self.core = _load(cfg, batch_size, cache_dir, mode)
        self.steps = 0  #: batched model steps taken by the engine thread
        self._last_step: float | None = None
        self.warm_up(warmup_steps)
        self._lock = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._attach_pending: set[int] = set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kame-kyutai-stt", daemon=True)
        self._thread.start()

    def warm_up(self, steps: int) -> None:
        """``steps`` silent steps of every slot (slots are reset when a stream opens). A model that fails to
        compile is run eager from then on, after one log line naming the cause."""
        if steps <= 0:
            return
        t0 = time.monotonic()
        try:
            self._warm_steps(steps)
        except Exception as exc:
            if not self.core.mode.compile:
                raise
            log.warning("Kyutai STT: torch.compile failed at warm-up, running eager: %s", first_line(exc))
            self.core.mode = MoshiMode(compile=False, cuda_graphs=self.core.mode.cuda_graphs)
            self._warm_steps(steps)
        log.info("Kyutai STT warm-up: %d steps of %d slots in %.2f s", steps, self.batch_size, time.monotonic() - t0)

    def _warm_steps(self, steps: int) -> None:
        silence = np.zeros(FRAME, np.float32)
        for slot in range(self.batch_size):
            self.core.attach(slot)
        for _ in range(steps):
            self.core.step_pcm(dict.fromkeys(range(self.batch_size), silence))

    def new_transcriber(self) -> Transcriber:
        return KyutaiTranscriber(_load(self.cfg, 1, self.cache_dir, self.core.mode), self.cfg)

    def open_stream(self, *, on_event: EventCallback | None = None) -> AsrStream:
        stream = AsrStream(self._stream_name(), max_queued_s=self.cfg.max_queued_s, max_events=self.cfg.max_events,
                           on_event=on_event)
        with self._lock:
            free = [i for i in range(self.batch_size) if i not in self._slots]
            if not free:
                stream.fail("all Kyutai STT slots are taken")
                return stream
            slot = free[0]
            self._slots[slot] = _Slot(stream=stream, turns=_turns(self.core, self.cfg),
                                      silence_left=self.core.silence_prefix_frames)
            self._attach_pending.add(slot)
            self._lock.notify_all()
        return stream

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join(5)

    # ------------------------------------------------------------------ engine thread
    def _pull(self) -> None:
        """Move each open stream's queued audio into its slot buffer; a closed one is padded, then flushed."""
        for s in self._slots.values():
            if s.flush_left is None:
                chunks, end = s.stream.inbox.take(False)
                if chunks:
                    s.buf = np.concatenate([s.buf, *chunks])
                if end is not None:  # closed: pad the tail, then flush with silence
                    s.flush_left = self.core.delay_frames + FLUSH_EXTRA_FRAMES if end else 0
                    if s.buf.size % FRAME:
                        s.buf = np.pad(s.buf, (0, FRAME - s.buf.size % FRAME))

    def _ready(self) -> list[int]:
        """Frames each slot could be stepped with now (silence prefix, audio, flush)."""
        return [s.silence_left + s.buf.size // FRAME + (s.flush_left or 0) for s in self._slots.values()]

    def _collect(self) -> dict[int, np.ndarray]:
        frames: dict[int, np.ndarray] = {}
        for slot, s in list(self._slots.items()):
            if s.silence_left > 0:
                s.silence_left -= 1
                frames[slot] = np.zeros(FRAME, np.float32)
            elif s.buf.size >= FRAME:
                frames[slot], s.buf = s.buf[:FRAME], s.buf[FRAME:]
            elif s.flush_left:
                s.flush_left -= 1
                frames[slot] = np.zeros(FRAME, np.float32)
        return frames

    def _finish_closed(self) -> None:
        for slot, s in list(self._slots.items()):
            if s.flush_left == 0 and s.buf.size < FRAME and s.silence_left == 0:
                for em in s.turns.end_turn():
                    s.stream.emit(em)
                s.stream.mark_done()
                del self._slots[slot]

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 - never leave streams hanging
            log.exception("Kyutai STT engine thread died")
            with self._lock:
                for s in self._slots.values():
                    s.stream.fail(f"Kyutai STT engine failed: {type(exc).__name__}")
                self._slots.clear()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._stop:
                    return
                attach, self._attach_pending = self._attach_pending, set()
            for slot in attach:  # a model call: outside the lock open_stream takes in the event loop
                self.core.attach(slot)
            with self._lock:
                if self._attach_pending:  # opened meanwhile: attach it before any step
                    continue
                self._finish_closed()
                self._pull()
                wait = wait_before_step(time.monotonic(), self._last_step, self._ready())
                if wait is None or wait > 0:
                    self._lock.wait(POLL_S if wait is None else min(wait, POLL_S))
                    continue
                frames = self._collect()
                slots = {k: self._slots[k] for k in frames}
            self._last_step = time.monotonic()
            self.steps += 1
            try:
                outs = self.core.step_pcm(frames)
            except Exception as exc:  # noqa: BLE001 - end these streams, keep the engine
                log.exception("Kyutai STT step failed")
                with self._lock:
                    for slot, s in slots.items():
                        s.stream.fail(f"Kyutai STT step failed: {type(exc).__name__}")
                        self._slots.pop(slot, None)
                continue
            for slot, out in outs.items():
                for em in slots[slot].turns.feed(out.text_id, out.end_prob):
                    slots[slot].stream.emit(em)
            time.sleep(0)
