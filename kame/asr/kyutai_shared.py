"""Kyutai STT sharing the front-end engine's model thread and Mimi encode.

When the STT and the front-end run on one device, the engine thread steps
both in the same tick on the same 32-codebook Mimi codes (see
:class:`~kame.frontend.engine.EngineCore` ``stt=``): the STT's text token of
each frame arrives with the front-end's output (``SlotOutput.stt``). A
:class:`SharedSttStream` turns those tokens into the usual ASR events, so the
session sees the same :class:`~kame.asr.stream.AsrStream` API as with any
other recogniser; its audio was already fed through the engine slot. The
engine thread hands each STT step straight to the stream (no round trip
through the session), and the flush at the end is an engine command.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kame.asr.config import AsrConfig
from kame.asr.kyutai_turns import SttTurns
from kame.asr.stream import AsrStream, EngineTap
from kame.audio.media import FRAME_RATE, FRAME_SIZE
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from kame.asr.kyutai_core import SttStep

FRAME = FRAME_SIZE


class SharedSttStream(AsrStream):
    """An ASR stream fed with STT steps instead of audio.

    :meth:`bind_engine` subscribes it to its slot's STT steps (delivered by the
    engine thread to :meth:`on_step`); :meth:`aclose` with ``flush`` asks the
    engine to step the STT's delay in silence first (an engine command), so
    the last words come out.
    """

    def __init__(self, name: str, turns: SttTurns, *, flush_frames: int, max_events: int = 1000) -> None:
        super().__init__(name, max_queued_s=1.0, max_events=max_events, on_event=None)
        self.turns = turns
        self.flush_frames = flush_frames
        self._slot: EngineTap | None = None
        self._lock = threading.Lock()

    def bind_engine(self, slot: EngineTap) -> None:
        self._slot = slot
        slot.stt_attach(self.on_step)

    def feed(self, pcm: np.ndarray) -> bool:
        """Only advances the audio clock: the engine slot already has this audio."""
        if self.done:
            return False
        self._fed += int(np.asarray(pcm).size)
        return True

    def on_step(self, step: SttStep) -> None:
        """One STT output frame of this session (called in the engine thread)."""
        with self._lock:
            if self.done:
                return
            for em in self.turns.feed(step.text_id, step.end_prob):
                self.emit(em)

    def finish(self) -> None:
        """End of input (after the flush frames went through): close the open turn."""
        with self._lock:
            if self.done:
                return
            for em in self.turns.end_turn():
                self.emit(em)
            self.mark_done()

    def close(self, flush: bool = True) -> None:
        if not flush:
            self.mark_done()

    async def release_engine(self, flush: bool = True) -> None:
        """The flush needs the slot: step the STT's delay (and silence prefix) in silence through it."""
        slot, self._slot = self._slot, None
        if flush and slot is not None and not self.done:
            await slot.stt_flush(self.flush_frames, 3.0)

    async def aclose(self, flush: bool = True, timeout: float | None = 30.0) -> bool:
        await self.release_engine(flush)  # a no-op when the pipeline did it already
        if flush:
            self.finish()
        else:
            self.mark_done()
        return True


class SharedKyutaiAsr:
    """Opens :class:`SharedSttStream`\\ s for an engine built with a shared STT core."""

    kind = "kyutai"

    def __init__(
        self, cfg: AsrConfig, piece_of: Callable[[int], str], *, delay_frames: int, prefix_frames: int = 0,
        vocab: TextVocab = MOSHI_VOCAB,
    ) -> None:
        """``delay_frames``: the model's text delay; ``prefix_frames``: the silence prefix, by which the
        engine delays each slot's STT input (both must be flushed at the end of a session)."""
        self.cfg = cfg
        self.piece_of = piece_of
        self.vocab = vocab  #: the STT model's (SttCore.vocab)
        self.delay_frames = delay_frames + prefix_frames
        self._count = 0

    def open_stream(self) -> SharedSttStream:
        self._count += 1
        silence = max(2, round(self.cfg.turn.end_silence_s * FRAME_RATE))
        return SharedSttStream(
            f"asr-kyutai-shared-{self._count}",
            SttTurns(self.piece_of, vocab=self.vocab, silence_frames=silence),
            flush_frames=self.delay_frames + 4,
            max_events=self.cfg.max_events,
        )

    def close(self) -> None:
        """Nothing to free: the model belongs to the engine."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def same_mimi(a: Path, b: Path) -> bool:
    """Whether two checkpoints' Mimi weights are the same file content (then one encode serves both)."""
    a, b = Path(a), Path(b)
    if a.resolve() == b.resolve():
        return True
    return a.stat().st_size == b.stat().st_size and _digest(a) == _digest(b)
