"""Read any common WAV file as 24 kHz mono float32 (what sessions feed recognisers).

A small RIFF reader rather than the ``wave`` module, which refuses float
and WAVE_FORMAT_EXTENSIBLE files that many tools write.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import soxr

from kame.asr.resample import INPUT_RATE
from kame.audio.pcm import pcm16_to_float
from kame.errors import UserError

_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """``(samples [frames, channels] float32 in [-1, 1], sample rate)``; bad files raise UserError."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file")
    data = p.read_bytes()
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise UserError(f"{p}: not a WAV file")
    fmt: tuple[int, int, int, int] | None = None
    pcm: bytes | None = None
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = data[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            if len(body) < 16:
                raise UserError(f"{p}: truncated fmt chunk")
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == _EXTENSIBLE and len(body) >= 26:
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            pcm = body
            break
        pos += 8 + size + (size & 1)
    if fmt is None or pcm is None:
        raise UserError(f"{p}: WAV file without {'fmt' if fmt is None else 'data'} chunk")
    tag, channels, rate, bits = fmt
    if channels < 1 or rate < 1:
        raise UserError(f"{p}: bad WAV header ({channels} channels, {rate} Hz)")
    x = _decode(pcm, tag, bits)
    if x is None:
        raise UserError(f"{p}: unsupported WAV encoding (format {tag}, {bits} bits)")
    n = len(x) // channels
    return x[: n * channels].reshape(n, channels), rate


def _decode(raw: bytes, tag: int, bits: int) -> np.ndarray | None:
    if tag == _FLOAT and bits in (32, 64):
        return np.frombuffer(raw[: len(raw) // (bits // 8) * (bits // 8)], f"<f{bits // 8}").astype(np.float32)
    if tag != _PCM:
        return None
    if bits == 8:
        return (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    if bits == 16:
        return pcm16_to_float(raw)
    if bits == 24:
        b = np.frombuffer(raw[: len(raw) // 3 * 3], np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        return v.astype(np.float32) / float(1 << 23)
    if bits == 32:
        return np.frombuffer(raw[: len(raw) // 4 * 4], "<i4").astype(np.float32) / float(1 << 31)
    return None


def to_mono_24k(x: np.ndarray, rate: int) -> np.ndarray:
    """Average the channels, resample to 24 kHz with soxr."""
    mono = x.mean(axis=1) if x.ndim == 2 else x
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if rate != INPUT_RATE:
        mono = soxr.resample(mono, rate, INPUT_RATE, quality="HQ").astype(np.float32)
    return mono


def load_wav_24k_mono(path: str | Path) -> np.ndarray:
    x, rate = read_wav(path)
    return to_mono_24k(x, rate)

