"""PCM16 and G.711 <-> float32: the one place wires, clients, recorders and file writers convert samples.

kame works in float32 in [-1, 1) (what Mimi takes and gives); protocols and files carry little-endian
16-bit PCM, and telephone formats G.711 mu-law (``audio/pcmu``) and A-law (``audio/pcma``) at 8 kHz.
Floats go to integers clipped and rounded (a full-scale float is 32767, never a wrapped -32768);
integers come back divided by 32768. G.711 uses the stdlib ``audioop`` (deprecated on 3.11/3.12,
removed in 3.13, where the ``audioop-lts`` package provides the same module). No resampling here: the
callers' soxr streams do it.
"""

from __future__ import annotations

import warnings

import numpy as np

with warnings.catch_warnings():  # stdlib audioop is deprecated on 3.11/3.12 (audioop-lts from 3.13)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

#: One 16-bit sample's scale: integers are divided by this, floats multiplied by it less one.
SCALE = 32768.0


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
