"""A scripted front-end: a session's engine slot that plays given audio with given words, and a client's
acoustic echo path, for pipeline tests that need the assistant to say known words.

The CPU demo's random tiny model babbles noise, so a test of what happens to the assistant's own voice
coming back (the echo guard) needs a front-end that says something real: :class:`ScriptedSlot` steps
once per 80 ms input frame fed, as the engine does, and outputs the script's audio for that step with the
script's text piece (the word begins at that step). :class:`ScriptedPipeline` is the real
:class:`~kame.session.pipeline.Pipeline` (real ASR stream, real guard, real events) on such a slot.
:class:`EchoPath` is what a laptop with its speakers on does to what it receives: a delay, a loss, a
low-pass, added to the microphone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.audio.media import FRAME_SIZE
from kame.frontend.engine import SlotOutput
from kame.oracle.config import OracleConfig
from kame.session.pipeline import Pipeline
from kame.session.settings import SessionSettings
from tests.support.speech import synthesize, word_end_times

STEP_S = FRAME_SIZE / 24000
FIRST_PIECE_ID = 10  #: text ids from here on are the script's pieces (0-9 hold pad and end of padding)


@dataclass
class Utterance:
    """The assistant says ``text`` (espeak) from ``start_s`` of the session on."""

    text: str
    start_s: float


@dataclass
class Script:
    """What the front-end says: audio per step and the piece (a word's start) at the step it begins."""

    audio: np.ndarray
    pieces: dict[int, str] = field(default_factory=dict)  #: step -> "▁Word"

    @classmethod
    def speak(cls, utterances: Sequence[Utterance], length_s: float) -> Script:
        audio = np.zeros(int(length_s * 24000) + FRAME_SIZE, np.float32)
        pieces: dict[int, str] = {}
        for u in utterances:
            pcm = synthesize(u.text)
            at = int(u.start_s * 24000)
            audio[at : at + pcm.size] += pcm[: audio.size - at]
            ends = word_end_times(u.text)
            begins = [0.0, *ends[:-1]]
            for word, begin in zip(u.text.split(), begins):
                pieces[int(round((u.start_s + begin) / STEP_S))] = "\u2581" + word
        return cls(audio, pieces)

    def vocabulary(self) -> tuple[dict[str, int], Callable[[int], str]]:
        ids = {p: FIRST_PIECE_ID + i for i, p in enumerate(dict.fromkeys(self.pieces.values()))}
        back = {i: p for p, i in ids.items()}
        return ids, back.__getitem__


class ScriptedSlot:
    """Stands in for :class:`~kame.frontend.engine_thread.AsyncSlot`: one step per input frame fed."""

    def __init__(self, script: Script, sink: Callable[[SlotOutput | Exception], None]) -> None:
        self.script = script
        self.sink = sink
        self.ids, _ = script.vocabulary()
        self.slot: int | None = None
        self.dropped_outputs = 0
        self.steps = 0
        self._pending = 0

    async def attach(self, prompt: object = None) -> None:  # a PersonaPlex prompt: none here
        self.slot = 0

    def detach(self) -> None:
        self.slot = None

    async def reset(self) -> None:
        self.steps = self._pending = 0

    def feed(self, pcm: np.ndarray) -> None:
        self._pending += int(np.asarray(pcm).size)
        loop = asyncio.get_running_loop()
        while self._pending >= FRAME_SIZE:
            self._pending -= FRAME_SIZE
            n = self.steps
            self.steps += 1
            frame = self.script.audio[n * FRAME_SIZE : (n + 1) * FRAME_SIZE]
            if frame.size < FRAME_SIZE:
                frame = np.zeros(FRAME_SIZE, np.float32)
            piece = self.script.pieces.get(n)
            text_id = self.ids[piece] if piece is not None else 3  # 3: pad (no text this step)
            loop.call_soon(self.sink, SlotOutput(slot=0, step=n, pcm=frame.copy(), text_id=text_id, oracle_id=-1))

    def set_sampling(self, *args: Any) -> None:
        pass

    def oracle_reset(self, ids: list[int], done: Any = None) -> None:
        pass

    def oracle_push(self, ids: list[int]) -> None:
        pass

    def oracle_clear(self) -> None:
        pass


class ScriptedPipeline(Pipeline):
    """The real pipeline on a :class:`ScriptedSlot` (no engine, no LLM)."""

    def __init__(self, script: Script, *, recognizer: Any, settings: SessionSettings | None = None,
                 **kwargs: Any) -> None:
        self.script = script
        _, piece_of = script.vocabulary()
        super().__init__(engine=None, oracle_config=OracleConfig(), registry=None,  # type: ignore[arg-type]
                         recognizer=recognizer, encode=lambda text: [], piece_of=piece_of, settings=settings, **kwargs)

    def _new_slot(self) -> Any:
        return ScriptedSlot(self.script, self._on_slot)


class EchoPath:
    """The assistant's audio as a laptop's microphone hears it: ``delay_s`` later (network and playback),
    ``gain_db`` quieter, low-passed (small speakers, the room). Frames it has not received yet are
    counted in ``missing`` (a test that lets them go silent would test nothing)."""

    def __init__(self, delay_s: float = 0.3, gain_db: float = -12.0, cutoff_hz: float = 3000.0) -> None:
        self.delay = int(round(delay_s * 24000))
        self.gain = 10 ** (gain_db / 20)
        self.alpha = 1.0 - float(np.exp(-2 * np.pi * cutoff_hz / 24000))
        self.received = np.zeros(0, np.float32)
        self.missing = 0
        self._state = 0.0

    def receive(self, pcm: np.ndarray) -> None:
        self.received = np.concatenate([self.received, np.asarray(pcm, np.float32)])

    def heard(self, start: int, n: int) -> np.ndarray:
        """The echo in microphone samples ``start .. start + n``."""
        lo, hi = start - self.delay, start - self.delay + n
        out = np.zeros(n, np.float32)
        if hi <= 0:
            return out
        avail = self.received[max(lo, 0) : hi]
        if max(lo, 0) + avail.size < hi:
            self.missing += hi - (max(lo, 0) + avail.size)
        out[n - (hi - max(lo, 0)) : n - (hi - max(lo, 0)) + avail.size] = avail
        y = np.empty(n, np.float32)
        s = self._state
        for i, x in enumerate(out * self.gain):  # one-pole low-pass
            s += self.alpha * (float(x) - s)
            y[i] = s
        self._state = s
        return y
