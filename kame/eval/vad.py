"""Speech and silence in recorded audio, and the response latency of a turn.

Latency is measured on the audio as a listener hears it, never from server
events: events say when the server *decided* something, the recording says
when sound was heard. Frames are 30 ms. A frame is voiced when

- ``webrtc`` (default): WebRTC VAD (aggressiveness 2, on a 16 kHz copy)
  says speech AND its RMS is above ``gate_dbfs`` (-50 dBFS; webrtcvad alone
  fires on faint codec noise);
- ``energy``: its RMS is above ``energy_dbfs`` (-40 dBFS, i.e. 0.01 of full
  scale; espeak and Moshi speak at about -20 to -30 dBFS RMS and pause
  well below -50).

Voiced frames are smoothed into segments: a segment starts at the first
frame of ``min_speech_s`` (150 ms, about a syllable) of consecutive voiced
frames (clicks, breaths and codec blips are not an answer) and ends at the last voiced frame before ``hangover_s`` (300 ms)
of silence (pauses between words do not split it).

Latency of a turn = first assistant segment that *starts* after the user's
speech onset of the turn, minus the end of the user's last segment in the
turn. It is negative when the assistant starts before the user has finished
(Moshi and KAME do). A segment already running when the user starts (a
greeting, the tail of the previous reply) is not a response and is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from kame.audio.loudness import at_least
from kame.audio.media import SAMPLE_RATE

RATE = SAMPLE_RATE
FRAME_S = 0.03
_VAD_RATE = 16000


@dataclass(frozen=True)
class VadConfig:
    """How frames are classified and smoothed (defaults documented in the module)."""

    kind: Literal["webrtc", "energy"] = "webrtc"
    aggressiveness: int = 2
    gate_dbfs: float = -50.0
    energy_dbfs: float = -40.0
    min_speech_s: float = 0.15
    hangover_s: float = 0.3

    def __post_init__(self) -> None:
        if self.kind not in ("webrtc", "energy"):
            raise ValueError(f"VAD kind {self.kind!r}: expected webrtc or energy")
        if not 0 <= self.aggressiveness <= 3:
            raise ValueError("VAD aggressiveness must be 0-3")


@dataclass(frozen=True)
class Segment:
    """Speech from ``start_s`` to ``end_s`` (seconds from the start of the audio)."""

    start_s: float
    end_s: float


class SpeechTracker:
    """Incremental speech segmentation of one channel at 24 kHz.

    The session driver feeds it the assistant's audio as it arrives (to end
    a reply after a silence); :func:`speech_segments` feeds it a whole
    recording. Both see identical frames, so they agree.
    """

    def __init__(self, cfg: VadConfig | None = None, rate: int = RATE) -> None:
        self.cfg = cfg or VadConfig()
        self._rate = rate
        self._frame = round(FRAME_S * (_VAD_RATE if self.cfg.kind == "webrtc" else rate))
        self._min_frames = max(1, math.ceil(self.cfg.min_speech_s / FRAME_S - 1e-9))
        self._hang_frames = max(1, math.ceil(self.cfg.hangover_s / FRAME_S - 1e-9))
        self._vad: VoiceDetector | None = None
        self._resampler = None
        if self.cfg.kind == "webrtc":
            import soxr

            from kame.asr.vad import VoiceDetector  # the ASR's detector: WebRTC VAD behind a loudness gate

            self._vad = VoiceDetector(self.cfg.aggressiveness, self.cfg.gate_dbfs, _VAD_RATE)
            self._resampler = soxr.ResampleStream(rate, _VAD_RATE, 1, dtype="float32", quality="HQ")
        self._rest: np.ndarray = np.zeros(0, np.float32)
        self._index = 0  # frames classified so far
        self._run = 0  # consecutive voiced frames while not in speech
        self._silent = 0  # consecutive unvoiced frames while in speech
        self._open: float | None = None  # start of the segment in progress
        self.last_voiced_end_s: float | None = None
        self.segments: list[Segment] = []

    @property
    def in_speech(self) -> bool:
        return self._open is not None

    @property
    def open_start_s(self) -> float | None:
        return self._open

    def all_segments(self) -> list[Segment]:
        """Closed segments plus the one in progress (ending at its last voiced frame)."""
        if self._open is None or self.last_voiced_end_s is None:
            return list(self.segments)
        return [*self.segments, Segment(self._open, self.last_voiced_end_s)]

    def push(self, pcm: np.ndarray) -> None:
        x = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x)
        self._consume(x)

    def finish(self) -> list[Segment]:
        """End of audio: flush the resampler and close the open segment; returns all segments."""
        if self._resampler is not None:
            self._consume(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        if self._open is not None and self.last_voiced_end_s is not None:
            self.segments.append(Segment(self._open, self.last_voiced_end_s))
        self._open = None
        return list(self.segments)

    def _consume(self, x: np.ndarray) -> None:
        buf: np.ndarray = np.concatenate([self._rest, x]) if self._rest.size else x
        n = len(buf) // self._frame
        for i in range(n):
            self._classify(buf[i * self._frame : (i + 1) * self._frame])
        self._rest = buf[n * self._frame :].copy()

    def _voiced(self, f: np.ndarray) -> bool:
        if self._vad is None:
            return at_least(f, self.cfg.energy_dbfs)
        return self._vad.is_voiced(f)

    def _classify(self, f: np.ndarray) -> None:
        k = self._index
        self._index += 1
        voiced = self._voiced(f)
        if self._open is None:
            self._run = self._run + 1 if voiced else 0
            if self._run >= self._min_frames:
                self._open = (k - self._run + 1) * FRAME_S
                self.last_voiced_end_s = (k + 1) * FRAME_S
                self._silent = 0
            return
        if voiced:
            self.last_voiced_end_s = (k + 1) * FRAME_S
            self._silent = 0
            return
        self._silent += 1
        if self._silent >= self._hang_frames:
            assert self.last_voiced_end_s is not None
            self.segments.append(Segment(self._open, self.last_voiced_end_s))
            self._open = None
            self._run = 0


def speech_segments(pcm: np.ndarray, cfg: VadConfig | None = None, rate: int = RATE) -> list[Segment]:
    """All speech segments of a recording."""
    tracker = SpeechTracker(cfg, rate)
    tracker.push(pcm)
    return tracker.finish()


@dataclass(frozen=True)
class TurnLatency:
    """Where the user's speech ended and the assistant's began in one turn (s on the session timeline)."""

    user_start_s: float | None
    user_end_s: float | None
    assistant_start_s: float | None
    latency_s: float | None
    note: str = ""
    assistant_segments: list[Segment] = field(default_factory=list)


#: A segment's start is the start of its first voiced 30 ms frame, so speech that begins exactly
#: at a window's edge can be dated up to a frame (plus the resampler's delay) earlier.
EDGE_S = 0.06


def turn_latency(
    user: list[Segment], assistant: list[Segment], window_start_s: float, window_end_s: float
) -> TurnLatency:
    """The latency of the turn spoken in ``[window_start_s, window_end_s)`` (see the module doc).

    Segments are assigned by their start, with windows moved :data:`EDGE_S` earlier.
    """
    lo, hi = window_start_s - EDGE_S, window_end_s - EDGE_S
    mine = [s for s in user if lo <= s.start_s < hi]
    if not mine:
        return TurnLatency(None, None, None, None, "no user speech found in the turn")
    u_start, u_end = mine[0].start_s, mine[-1].end_s
    theirs = [s for s in assistant if u_start <= s.start_s < hi]
    if not theirs:
        return TurnLatency(u_start, u_end, None, None, "the assistant did not start speaking in the turn")
    a_start = theirs[0].start_s
    return TurnLatency(u_start, u_end, a_start, round(a_start - u_end, 3), "", theirs)


