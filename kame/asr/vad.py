"""Where a user's turn starts and ends: WebRTC VAD frames plus a small state machine.

Whisper is not streaming and hallucinates on silence, so it is only ever
shown audio inside a turn; the turn ends after ``end_silence_s`` of silence,
which is also the cue the back-end waits for.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import webrtcvad

from kame.asr.config import TurnConfig
from kame.asr.resample import ASR_RATE
from kame.audio.loudness import at_least
from kame.audio.pcm import float_to_pcm16_bytes

FRAME_S = 0.03  #: WebRTC VAD accepts 10, 20 or 30 ms frames; 30 ms is the most reliable.
START_WINDOW_S = 0.3  #: window over which ``start_s`` of voiced audio must be found


class VoiceDetector:
    """Is a 30 ms frame speech? WebRTC VAD gated by a loudness floor."""

    def __init__(self, aggressiveness: int, min_rms_dbfs: float, rate: int = ASR_RATE) -> None:
        self._vad = webrtcvad.Vad(aggressiveness)
        self._rate = rate
        self._floor_dbfs = min_rms_dbfs

    def is_voiced(self, frame: np.ndarray) -> bool:
        if not at_least(frame, self._floor_dbfs):
            return False
        return bool(self._vad.is_speech(float_to_pcm16_bytes(frame), self._rate))


@dataclass(frozen=True)
class TurnStart:
    """A turn begins; ``audio`` is the pre-roll (including the frames that triggered it)."""

    audio: np.ndarray


@dataclass(frozen=True)
class TurnAudio:
    """Audio inside the current turn; ``voiced``: some of it is speech (not just a pause)."""

    audio: np.ndarray
    voiced: bool = True


@dataclass(frozen=True)
class TurnEnd:
    """The turn is over; the last ``trailing`` samples of it were unvoiced.

    ``forced``: cut by ``max_utterance_s`` or by the end of input, not by silence.
    """

    trailing: int
    forced: bool = False


TurnSignal = TurnStart | TurnAudio | TurnEnd


class TurnDetector:
    """Turns 16 kHz audio of any chunk size into start / audio / end signals."""

    def __init__(self, cfg: TurnConfig, rate: int = ASR_RATE) -> None:
        self._voice = VoiceDetector(cfg.vad_aggressiveness, cfg.min_rms_dbfs, rate)
        self._n = int(round(FRAME_S * rate))
        window = max(1, round(START_WINDOW_S / FRAME_S))
        self._start_frames = max(1, min(window, math.ceil(cfg.start_s / FRAME_S - 1e-9)))
        self._end_frames = max(1, math.ceil(cfg.end_silence_s / FRAME_S - 1e-9))
        self._max_frames = max(1, int(cfg.max_utterance_s / FRAME_S))
        self._votes: deque[bool] = deque(maxlen=window)
        self._ring: deque[np.ndarray] = deque(maxlen=window + round(cfg.pre_roll_s / FRAME_S))
        self._rest: np.ndarray = np.zeros(0, np.float32)
        self.in_turn = False
        self._silence = 0
        self._frames = 0

    def push(self, x: np.ndarray) -> list[TurnSignal]:
        buf = np.concatenate([self._rest, x]) if self._rest.size else x
        n_full = len(buf) // self._n
        self._rest = buf[n_full * self._n :].copy()
        out: list[TurnSignal] = []
        for i in range(n_full):
            self._frame(buf[i * self._n : (i + 1) * self._n], out)
        return _merge_audio(out)

    def finish(self) -> list[TurnSignal]:
        """End of input: close an open turn (its last partial frame included)."""
        out: list[TurnSignal] = []
        if self.in_turn:
            if self._rest.size:
                out.append(TurnAudio(self._rest))
            out.append(TurnEnd(self._silence * self._n, forced=True))
            self.in_turn = False
        self._rest = np.zeros(0, np.float32)
        return out

    def cut(self) -> list[TurnSignal]:
        """End an open turn now (the client said the turn is over: ``input_audio_buffer.commit``); the input
        goes on and the next voice opens a new turn."""
        if not self.in_turn:
            return []
        self.in_turn = False
        self._votes.clear()
        return [TurnEnd(self._silence * self._n, forced=True)]

    def _frame(self, f: np.ndarray, out: list[TurnSignal]) -> None:
        voiced = self._voice.is_voiced(f)
        self._votes.append(voiced)
        if not self.in_turn:
            self._ring.append(f)
            if sum(self._votes) >= self._start_frames:
                out.append(TurnStart(np.concatenate(list(self._ring))))
                self._frames = len(self._ring)
                self._ring.clear()
                self._silence = 0
                self.in_turn = True
            return
        out.append(TurnAudio(f, voiced))
        self._frames += 1
        self._silence = 0 if voiced else self._silence + 1
        if self._silence >= self._end_frames:
            out.append(TurnEnd(self._silence * self._n))
            self.in_turn = False
            self._votes.clear()
        elif self._frames >= self._max_frames:
            # Cut; the vote window still holds the ongoing speech, so the next frame opens a new turn.
            out.append(TurnEnd(self._silence * self._n, forced=True))
            self.in_turn = False


def _merge_audio(signals: list[TurnSignal]) -> list[TurnSignal]:
    """Join runs of TurnAudio so callers handle a few arrays, not one per 30 ms."""
    out: list[TurnSignal] = []
    run: list[TurnAudio] = []

    def close_run() -> None:
        if run:
            out.append(TurnAudio(np.concatenate([a.audio for a in run]), any(a.voiced for a in run)))
            run.clear()

    for s in signals:
        if isinstance(s, TurnAudio):
            run.append(s)
            continue
        close_run()
        out.append(s)
    close_run()
    return out
