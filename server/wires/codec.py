"""Per-session audio coding: Ogg/Opus in and out (sphn 0.2), and re-chunking to engine frames.

Clients send Ogg pages whose Opus frames may be 20 ms (opus-recorder in the
browser) or 80 ms (moshi's Python client); the engine and the ASR get whole
1920-sample frames. A corrupt stream raises :class:`AudioDecodeError`; the
sphn reader stays broken after one, so the session ends there.
"""

from __future__ import annotations

import numpy as np

from kame.audio.media import FRAME_SIZE, SAMPLE_RATE


class AudioDecodeError(ValueError):
    """The client's Ogg/Opus stream cannot be decoded."""


class FrameChunker:
    """Collects PCM of any length and hands it out in ``frame_size`` pieces."""

    def __init__(self, frame_size: int = FRAME_SIZE) -> None:
        self.frame_size = frame_size
        self._pending: np.ndarray = np.zeros(0, np.float32)

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        data = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if data.size == 0:
            return []
        buf = np.concatenate([self._pending, data]) if self._pending.size else data
        n = buf.size // self.frame_size
        frames = [buf[i * self.frame_size : (i + 1) * self.frame_size] for i in range(n)]
        self._pending = buf[n * self.frame_size :].copy()
        return frames

    @property
    def pending(self) -> int:
        return int(self._pending.size)


class OpusIn:
    """Client Ogg/Opus bytes -> 24 kHz float32 frames of ``frame_size``."""

    def __init__(self, sample_rate: int = SAMPLE_RATE, frame_size: int = FRAME_SIZE) -> None:
        import sphn

        self._reader = sphn.OpusStreamReader(sample_rate)
        self._chunker = FrameChunker(frame_size)

    def decode(self, ogg: bytes) -> list[np.ndarray]:
        if not ogg:
            return []
        try:
            pcm = self._reader.append_bytes(ogg)
        except Exception as exc:  # noqa: BLE001 - sphn raises ValueError/RuntimeError with a description
            raise AudioDecodeError(f"corrupt Ogg/Opus audio ({_short(exc)})") from None
        return self._chunker.push(np.asarray(pcm, dtype=np.float32))


class OpusOut:
    """Output frames -> Ogg/Opus bytes (possibly empty while the encoder fills a page)."""

    def __init__(self, sample_rate: int = SAMPLE_RATE) -> None:
        import sphn

        self._writer = sphn.OpusStreamWriter(sample_rate)

    def encode(self, pcm: np.ndarray) -> bytes:
        return bytes(self._writer.append_pcm(np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)))


def _short(exc: BaseException, limit: int = 80) -> str:
    text = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
