"""PCM16 input of ``/v1/realtime``: appends of any size -> 80 ms float32 frames. No I/O.

Clients append whatever their audio callback produced (128 samples from a
browser worklet, 20 ms, a whole file, even an odd number of bytes when a
buffer was split carelessly). Bytes are joined, an odd trailing byte waits
for the next append, and :class:`~kame.server.wires.codec.FrameChunker` cuts the
samples into the engine's frames.
"""

from __future__ import annotations

import numpy as np

from kame.audio.pcm import pcm16_to_float
from kame.server.wires.codec import FRAME_SIZE, FrameChunker


class Pcm16In:
    """Little-endian 16-bit mono bytes -> float32 frames of ``frame_size``."""

    def __init__(self, frame_size: int = FRAME_SIZE) -> None:
        self._chunker = FrameChunker(frame_size)
        self._odd = b""
        self.bytes_in = 0

    def push(self, data: bytes) -> list[np.ndarray]:
        if not data:
            return []
        self.bytes_in += len(data)
        if self._odd:
            data = self._odd + data
            self._odd = b""
        if len(data) % 2:
            self._odd = data[-1:]
            data = data[:-1]
        if not data:
            return []
        return self._chunker.push(pcm16_to_float(data))

    @property
    def pending_samples(self) -> int:
        return self._chunker.pending
