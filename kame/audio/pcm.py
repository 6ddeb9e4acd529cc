"""PCM16 and G.711 <-> float32: the one place wires, clients, recorders and file writers convert samples.

kame works in float32 in [-1, 1) (what Mimi takes and gives); protocols and files carry little-endian
16-bit PCM, and telephone formats G.711 mu-law (``audio/pcmu``) and A-law (``audio/pcma``) at 8 kHz.
Floats go to integers clipped and rounded (a full-scale float is 32767, never a wrapped -32768);
integers come back divided by 32768. G.711 uses the stdlib ``audioop`` (deprecated on 3.11/3.12,
removed in 3.13, where the ``audioop-lts`` package provides the same module). Streams change rate
through :class:`StreamResampler` (soxr), here too, so that a wire, a client and the recogniser filter
audio alike.
"""

from __future__ import annotations

import warnings

import numpy as np

with warnings.catch_warnings():  # stdlib audioop is deprecated on 3.11/3.12 (audioop-lts from 3.13)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

#: One 16-bit sample's scale: integers are divided by this, floats multiplied by it less one.
SCALE = 32768.0
#: G.711's sample rate (telephone audio).
G711_RATE = 8000


def pcm16_to_float(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Little-endian 16-bit samples -> float32 (an odd trailing byte is ignored: callers that join
    chunks keep it for the next one)."""
    raw = bytes(data)
    return np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(np.float32) / SCALE


def float_to_pcm16(pcm: np.ndarray) -> np.ndarray:
    """float32 samples (any shape) -> little-endian int16 of the same shape, clipped and rounded."""
    return (np.clip(np.asarray(pcm, np.float32), -1.0, 1.0) * (SCALE - 1)).round().astype("<i2")


def float_to_pcm16_bytes(pcm: np.ndarray) -> bytes:
    """float32 samples -> the bytes of :func:`float_to_pcm16` (interleaved when ``pcm`` is 2-D, frames x
    channels)."""
    return float_to_pcm16(pcm).tobytes()


def g711_to_float(data: bytes, law: str) -> np.ndarray:
    """G.711 bytes (``law``: ``"ulaw"`` or ``"alaw"``) -> float32, one sample per byte."""
    linear = audioop.ulaw2lin(data, 2) if law == "ulaw" else audioop.alaw2lin(data, 2)
    return pcm16_to_float(linear)


def float_to_g711(pcm: np.ndarray, law: str) -> bytes:
    """float32 -> G.711 bytes (``law``: ``"ulaw"`` or ``"alaw"``), one byte per sample."""
    linear = float_to_pcm16_bytes(np.asarray(pcm, np.float32).reshape(-1))
    return audioop.lin2ulaw(linear, 2) if law == "ulaw" else audioop.lin2alaw(linear, 2)


def to_encoding(pcm: np.ndarray, encoding: str) -> bytes:
    """float32 -> the bytes of a wire encoding: ``audio/pcmu`` / ``audio/pcma`` (G.711), else ``audio/pcm``
    (16-bit little-endian PCM)."""
    if encoding == "audio/pcmu":
        return float_to_g711(pcm, "ulaw")
    if encoding == "audio/pcma":
        return float_to_g711(pcm, "alaw")
    return float_to_pcm16_bytes(np.asarray(pcm, np.float32).reshape(-1))


class EncodedAudioReader:
    """Bytes of one wire encoding (as :func:`to_encoding` names them), appended in pieces of any length
    -> float32: a 16-bit sample split across two pieces is joined, never lost nor misaligned."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._odd = b""

    def read(self, data: bytes) -> np.ndarray:
        if self.encoding == "audio/pcmu":
            return g711_to_float(data, "ulaw")
        if self.encoding == "audio/pcma":
            return g711_to_float(data, "alaw")
        data = self._odd + data
        self._odd = data[len(data) - len(data) % 2:]
        return pcm16_to_float(data)


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

    A band-limited resampler (not sample dropping) matters: aliasing smears consonants and costs
    recognition accuracy. Its filter delays the stream: "HQ" costs 12 ms between 24 and 16 kHz but 43 ms
    between 24 and 8 kHz, so a stream to or from G.711's rate uses "LQ" (12.5 ms; 16-bit precision, far
    beyond what 8-bit G.711 keeps) unless ``quality`` says otherwise.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: str | None = None) -> None:
        if quality is None:
            quality = "LQ" if min(in_rate, out_rate) <= G711_RATE else "HQ"
        import soxr  # here: the PCM helpers are imported by every wire, resampling by few (not the GPU check)

        self._rs = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)

    def push(self, pcm: np.ndarray) -> np.ndarray:
        return self._rs.resample_chunk(as_mono_float32(pcm), last=False)

    def flush(self) -> np.ndarray:
        """The samples still inside the filter (call once, at end of input)."""
        return self._rs.resample_chunk(np.zeros(0, np.float32), last=True)


def stream_resampler(in_rate: int, out_rate: int) -> StreamResampler | None:
    """A :class:`StreamResampler` between the two rates, or None when they are the same."""
    return None if in_rate == out_rate else StreamResampler(in_rate, out_rate)
