"""Live audio formats <-> the engine's 24 kHz float32 frames. No I/O.

A Live websocket carries raw mono audio in the format chosen at
``session.start`` (``openai/types/live/audio_format.py``): 16-bit
little-endian PCM at 24000 or 16000 Hz, or G.711 mu-law (``audio/pcmu``) or
A-law (``audio/pcma``) at 8000 Hz for telephony. Moshi and the ASR take
24 kHz, so other rates go through soxr's streaming resampler (stateful:
chunks of any size join without clicks), and G.711 through ``audioop``
(stdlib up to Python 3.12; the ``audioop-lts`` package provides the same
module from 3.13 on). Nothing here is hand-written DSP.

Input appends may have any length, even an odd number of PCM16 bytes;
:class:`LiveAudioIn` joins them and cuts engine frames. A muted input is
decoded as usual (so the resampler stays continuous) and replaced by
silence of the same length: the session timeline goes on.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import soxr

from kame.media import SAMPLE_RATE
from kame.server.wires.codec import FRAME_SIZE, FrameChunker

with warnings.catch_warnings():  # stdlib audioop is deprecated on 3.11/3.12 (removed in 3.13: audioop-lts)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

ENGINE_RATE = SAMPLE_RATE
Encoding = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
PCM_RATES = (SAMPLE_RATE, 16000)
G711_RATE = 8000


@dataclass(frozen=True)
class LiveAudioFormat:
    """One Live audio format (the same both ways, as the Live API has one ``audio.format``)."""

    type: Encoding = "audio/pcm"
    rate: int = ENGINE_RATE

    def __post_init__(self) -> None:
        if self.type == "audio/pcm":
            if self.rate not in PCM_RATES:
                raise ValueError(f"audio/pcm supports {' or '.join(map(str, PCM_RATES))} Hz, not {self.rate}")
        elif self.type in ("audio/pcmu", "audio/pcma"):
            if self.rate != G711_RATE:
                raise ValueError(f"{self.type} (G.711) is 8000 Hz, not {self.rate}")
        else:
            raise ValueError(f"unknown audio format type {self.type!r}")

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.type == "audio/pcm" else 1

    def to_json(self) -> dict[str, object]:
        return {"type": self.type, "rate": self.rate}


DEFAULT_FORMAT = LiveAudioFormat()


def _resampler(in_rate: int, out_rate: int) -> soxr.ResampleStream | None:
    """soxr's streaming resampler. Its filter delays the stream: "HQ" costs 12 ms between 24 and 16 kHz
    but 43 ms between 24 and 8 kHz, so G.711 uses "LQ" (12.5 ms; 16-bit precision, far beyond what
    8-bit G.711 keeps)."""
    if in_rate == out_rate:
        return None
    quality = "LQ" if min(in_rate, out_rate) <= G711_RATE else "HQ"
    return soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)


def _int16_to_float(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def _float_to_int16(pcm: np.ndarray) -> bytes:
    ints = (np.clip(np.asarray(pcm, np.float32).reshape(-1), -1.0, 1.0) * 32767.0).round().astype("<i2")
    return ints.tobytes()


class LiveAudioIn:
    """Client audio bytes in ``fmt`` -> 24 kHz float32 frames of ``frame_size`` samples."""

    def __init__(self, fmt: LiveAudioFormat = DEFAULT_FORMAT, frame_size: int = FRAME_SIZE) -> None:
        self.format = fmt
        self.frame_size = frame_size
        self._chunker = FrameChunker(frame_size)
        self._resample = _resampler(fmt.rate, ENGINE_RATE)
        self._odd = b""
        self.bytes_in = 0

    def _decode(self, data: bytes) -> np.ndarray:
        if self.format.type == "audio/pcmu":
            return _int16_to_float(audioop.ulaw2lin(data, 2))
        if self.format.type == "audio/pcma":
            return _int16_to_float(audioop.alaw2lin(data, 2))
        if self._odd:
            data = self._odd + data
            self._odd = b""
        if len(data) % 2:
            self._odd = data[-1:]
            data = data[:-1]
        return _int16_to_float(data)

    def push(self, data: bytes, *, muted: bool = False) -> list[np.ndarray]:
        """Frames completed by this append (muted: the same amount of silence)."""
        if not data:
            return []
        self.bytes_in += len(data)
        pcm = self._decode(data)
        if muted:
            pcm = np.zeros_like(pcm)
        if self._resample is not None and pcm.size:
            pcm = self._resample.resample_chunk(pcm, last=False)
        return self._chunker.push(pcm)

    @property
    def pending_samples(self) -> int:
        """24 kHz samples waiting for the rest of their frame."""
        return self._chunker.pending


class LiveAudioOut:
    """The engine's 24 kHz float32 output frames -> bytes in ``fmt`` (one chunk per frame)."""

    def __init__(self, fmt: LiveAudioFormat = DEFAULT_FORMAT) -> None:
        self.format = fmt
        self._resample = _resampler(ENGINE_RATE, fmt.rate)

    def encode(self, pcm: np.ndarray) -> bytes:
        data = np.asarray(pcm, np.float32).reshape(-1)
        if self._resample is not None:
            data = self._resample.resample_chunk(data, last=False)
        linear = _float_to_int16(data)
        if self.format.type == "audio/pcmu":
            return audioop.lin2ulaw(linear, 2)
        if self.format.type == "audio/pcma":
            return audioop.lin2alaw(linear, 2)
        return linear
