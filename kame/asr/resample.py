"""Streaming 24 kHz -> 16 kHz conversion for recognisers trained at 16 kHz."""

from __future__ import annotations

import numpy as np
import soxr

from kame.media import SAMPLE_RATE
from kame.pcm import SCALE

#: Sample rate of the audio sessions feed (Mimi / Moshi frames).
INPUT_RATE = SAMPLE_RATE
#: Sample rate Whisper, pocketsphinx and WebRTC VAD work at.
ASR_RATE = 16000


def as_mono_float32(pcm: np.ndarray) -> np.ndarray:
    """1-D float32 view of a frame (accepts int16 too, scaled to [-1, 1))."""
    x = np.asarray(pcm)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / SCALE
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1:
        if x.size != max(x.shape, default=0):
            raise ValueError(f"expected mono audio, got an array of shape {x.shape}")
        x = x.reshape(-1)
    return x


class StreamResampler:
    """soxr's stateful resampler: chunks of any size, no clicks at chunk edges.

    A band-limited resampler (not sample dropping) matters: aliasing smears
    consonants and costs recognition accuracy.
    """

    def __init__(self, in_rate: int = INPUT_RATE, out_rate: int = ASR_RATE) -> None:
        self._rs = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def push(self, pcm: np.ndarray) -> np.ndarray:
        return self._rs.resample_chunk(as_mono_float32(pcm), last=False)

    def flush(self) -> np.ndarray:
        """The samples still inside the filter (call once, at end of input)."""
        return self._rs.resample_chunk(np.zeros(0, np.float32), last=True)
