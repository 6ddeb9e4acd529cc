"""The per-session recognition state machine, independent of threads and clocks.

A :class:`Transcriber` splits its work in two so one loop can drive it
from a worker thread, a worker process or a simulated clock alike:
``push`` is cheap (resample, VAD, bookkeeping) and takes every chunk as it
comes; ``work`` does at most one expensive step (a decode). A driver pushes
everything that has arrived before calling ``work``, so a slow decoder
always decodes the newest audio instead of falling behind.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kame.asr.agreement import LocalAgreement
from kame.asr.config import AsrConfig
from kame.asr.events import Emission, EventType
from kame.asr.resample import ASR_RATE, StreamResampler
from kame.asr.vad import TurnAudio, TurnDetector, TurnEnd, TurnSignal, TurnStart


@dataclass
class TranscriberStats:
    """Counters a bench or a metrics endpoint can read."""

    partial_decodes: int = 0
    final_decodes: int = 0
    decode_s: float = 0.0  #: wall time spent decoding


class Transcriber(ABC):
    """Recognition state of one session. Driven by one thread at a time, never shared."""

    stats: TranscriberStats

    @abstractmethod
    def push(self, pcm: np.ndarray) -> list[Emission]:
        """Take 24 kHz mono float32 audio of any length; cheap, never decodes."""

    @abstractmethod
    def pending(self) -> bool:
        """Whether :meth:`work` has something to do now."""

    @abstractmethod
    def work(self) -> list[Emission]:
        """Do the most urgent expensive step (a final first, else a partial)."""

    @abstractmethod
    def finish(self) -> list[Emission]:
        """End of input: close the open turn and emit every final still owed."""

    def cut(self) -> list[Emission]:
        """End the turn in progress now (its final follows from :meth:`work`), keep listening. A recogniser
        that cannot (it finds turns by itself) does nothing; the pipeline then uses the last partial."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release resources (idempotent)."""


@dataclass
class Utterance:
    """Audio of one turn at 16 kHz and its stabiliser."""

    index: int
    agreement: LocalAgreement
    chunks: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    decoded_at: int = 0  #: utterance length at the last partial decode
    voiced_upto: int = 0  #: utterance length after its last voiced audio
    last_partial: str = ""
    last_stable: str = ""
    settled_upto: int = -1  #: ``voiced_upto`` when a pause was last decoded to settle the words

    def append(self, x: np.ndarray, voiced: bool = True) -> None:
        if x.size:
            self.chunks.append(x)
            self.samples += len(x)
            if voiced:
                self.voiced_upto = self.samples

    def audio(self) -> np.ndarray:
        if len(self.chunks) != 1:
            self.chunks = [np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)]
        return self.chunks[0]

    def truncate(self, n: int) -> None:
        if n < self.samples:
            self.chunks = [self.audio()[: max(0, n)]]
            self.samples = len(self.chunks[0])


class SegmentingTranscriber(Transcriber):
    """Turn detection, partial cadence, local agreement and finals for any decoder.

    Subclasses say how to decode: :meth:`partial_text` (the turn so far,
    called at most every ``partial_interval_s`` of new audio) and
    :meth:`final_text` (the whole turn, once, after it ended).
    """

    def __init__(self, cfg: AsrConfig) -> None:
        self.cfg = cfg
        self.stats = TranscriberStats()
        self._resampler = StreamResampler()
        self._turns = TurnDetector(cfg.turn)
        self._interval = max(1, int(cfg.partial_interval_s * ASR_RATE))
        self._min_partial = int(cfg.min_partial_s * ASR_RATE)
        self._tail = int(cfg.turn.tail_s * ASR_RATE)
        self._current: Utterance | None = None
        self._ended: deque[Utterance] = deque()
        self._count = 0

    # ------------------------------------------------------------------ decoder hooks

    @abstractmethod
    def partial_text(self, utt: Utterance) -> str:
        """Hypothesis for the turn so far (``utt.audio()`` keeps growing)."""

    @abstractmethod
    def final_text(self, utt: Utterance) -> str:
        """The committed text of a finished turn."""

    def on_turn_start(self, utt: Utterance) -> None:
        """Hook for decoders that keep per-turn state."""

    # ------------------------------------------------------------------ Transcriber

    def push(self, pcm: np.ndarray) -> list[Emission]:
        return self._route(self._turns.push(self._resampler.push(pcm)))

    def pending(self) -> bool:
        return bool(self._ended) or self._partial_due()

    def work(self) -> list[Emission]:
        if self._ended:
            ended = self._ended.popleft()
            t0 = time.perf_counter()
            text = self.final_text(ended)
            self.stats.decode_s += time.perf_counter() - t0
            self.stats.final_decodes += 1
            return [Emission(EventType.FINAL, text, text, ended.index)]
        utt = self._current
        if utt is None or not self._partial_due():
            return []
        if utt.voiced_upto <= utt.decoded_at:
            utt.settled_upto = utt.voiced_upto  # the one decode of this pause (see _partial_due)
        utt.decoded_at = utt.samples
        t0 = time.perf_counter()
        hyp = self.partial_text(utt)
        self.stats.decode_s += time.perf_counter() - t0
        self.stats.partial_decodes += 1
        partial, stable = utt.agreement.update(hyp)
        if partial == utt.last_partial and stable == utt.last_stable:
            return []  # a hypothesis that agrees with the last one still reports the words it settles
        utt.last_partial, utt.last_stable = partial, stable
        return [Emission(EventType.PARTIAL, partial, stable, utt.index)]

    def cut(self) -> list[Emission]:
        out = self._route(self._turns.cut())
        while self._ended:  # the finals of everything before the cut, now, in order
            out += self.work()
        return [*out, Emission(EventType.CUT)]

    def finish(self) -> list[Emission]:
        out = self._route(self._turns.push(self._resampler.flush()))
        out += self._route(self._turns.finish())
        while self._ended:
            out += self.work()
        return out

    # ------------------------------------------------------------------ internals

    def _partial_due(self) -> bool:
        # Due every partial_interval_s of audio, but only if speech (not a pause) came since the
        # last decode: re-decoding a pause rarely changes the words and costs as much. Except once
        # per pause while the last hypothesis has words no two decodes agreed on yet: that decode
        # settles the turn's last words (usually the last one spoken) during the pause instead of at
        # the final, end_silence_s later. A Live client sees the user's words as the stable
        # transcript's deltas, and Pipecat's OpenAILiveLLMService ends a user turn after 0.8 s
        # without one: a last word held back until the final split the turn in two.
        u = self._current
        if u is None or u.samples < self._min_partial or u.samples - u.decoded_at < self._interval:
            return False
        if u.voiced_upto > u.decoded_at:
            return True
        return u.last_partial != u.last_stable and u.settled_upto != u.voiced_upto

    def _route(self, signals: list[TurnSignal]) -> list[Emission]:
        out: list[Emission] = []
        for s in signals:
            if isinstance(s, TurnStart):
                utt = Utterance(self._count, LocalAgreement(self.cfg.agreement))
                self._count += 1
                utt.append(s.audio)
                self._current = utt
                self.on_turn_start(utt)
                out.append(Emission(EventType.SPEECH_STARTED, utterance=utt.index))
            elif isinstance(s, TurnAudio):
                if self._current is not None:
                    self._current.append(s.audio, s.voiced)
            elif isinstance(s, TurnEnd) and self._current is not None:
                utt, self._current = self._current, None
                utt.truncate(utt.samples - max(0, s.trailing - self._tail))
                self._ended.append(utt)
                out.append(Emission(EventType.SPEECH_STOPPED, utterance=utt.index))
        return out
