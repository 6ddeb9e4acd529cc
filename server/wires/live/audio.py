"""Live audio formats <-> the engine's 24 kHz float32 frames. No I/O.

A Live websocket carries raw mono audio in the format chosen at
``session.start`` (``openai/types/live/audio_format.py``): 16-bit
little-endian PCM at 24000 or 16000 Hz, or G.711 mu-law (``audio/pcmu``) or
A-law (``audio/pcma``) at 8000 Hz for telephony. Moshi and the ASR take
24 kHz, so other rates go through :mod:`kame.audio.pcm`'s streaming resampler
(soxr, stateful: chunks of any size join without clicks), and every
encoding through :mod:`kame.audio.pcm` too (G.711 by ``audioop``), the module
kame's clients use. Nothing here is hand-written DSP.

Input appends may have any length, even an odd number of PCM16 bytes;
:class:`LiveAudioIn` joins them and cuts engine frames. A muted input is
decoded as usual (so the resampler stays continuous) and replaced by
silence of the same length: the session timeline goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.audio.pcm import G711_RATE, EncodedAudioReader, stream_resampler, to_encoding
from kame.server.wires.codec import FRAME_SIZE, FrameChunker

ENGINE_RATE = SAMPLE_RATE
Encoding = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
PCM_RATES = (SAMPLE_RATE, 16000)


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

    def to_json(self) -> dict[str, object]:
        return {"type": self.type, "rate": self.rate}


DEFAULT_FORMAT = LiveAudioFormat()


class LiveAudioIn:
    """Client audio bytes in ``fmt`` -> 24 kHz float32 frames of ``frame_size`` samples."""

    def __init__(self, fmt: LiveAudioFormat = DEFAULT_FORMAT, frame_size: int = FRAME_SIZE) -> None:
        self.format = fmt
        self.frame_size = frame_size
        self._chunker = FrameChunker(frame_size)
        self._resample = stream_resampler(fmt.rate, ENGINE_RATE)
        self._reader = EncodedAudioReader(fmt.type)
        self.bytes_in = 0

    def push(self, data: bytes, *, muted: bool = False) -> list[np.ndarray]:
        """Frames completed by this append (muted: the same amount of silence)."""
        if not data:
            return []
        self.bytes_in += len(data)
        pcm = self._reader.read(data)
        if muted:
            pcm = np.zeros_like(pcm)
        if self._resample is not None and pcm.size:
            pcm = self._resample.push(pcm)
        return self._chunker.push(pcm)

    @property
    def pending_samples(self) -> int:
        """24 kHz samples waiting for the rest of their frame."""
        return self._chunker.pending


class LiveAudioOut:
    """The engine's 24 kHz float32 output frames -> bytes in ``fmt`` (one chunk per frame)."""

    def __init__(self, fmt: LiveAudioFormat = DEFAULT_FORMAT) -> None:
        self.format = fmt
        self._resample = stream_resampler(ENGINE_RATE, fmt.rate)

    def encode(self, pcm: np.ndarray) -> bytes:
        data = np.asarray(pcm, np.float32).reshape(-1)
        if self._resample is not None:
            data = self._resample.push(data)
        return to_encoding(data, self.format.type)
