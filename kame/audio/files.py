"""Reading and writing audio files as 24 kHz mono float32 (what Mimi and the server use)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
from kame.audio.pcm import float_to_pcm16
from kame.errors import UserError


def read_audio(path: str | Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Any audio file sphn can decode (wav, mp3, ogg, flac...), resampled with soxr, as mono float32."""
    import soxr
    import sphn

    p = Path(path)
    if not p.is_file():
        raise UserError(f"audio file {p}: not found")
    try:
        data, file_rate = sphn.read(str(p))
    except Exception as exc:  # noqa: BLE001 - sphn raises plain exceptions for bad files
        raise UserError(f"audio file {p}: cannot be decoded ({exc})") from None
    data = np.asarray(data, dtype=np.float32)
    if data.ndim == 2:
        data = data.mean(axis=0)
    if int(file_rate) != sample_rate:
        data = soxr.resample(data, int(file_rate), sample_rate, quality="HQ")
    return np.ascontiguousarray(data.reshape(-1), dtype=np.float32)


def write_wav(path: str | Path, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """16-bit PCM wav (plays everywhere)."""
    import wave

    ints = float_to_pcm16(np.asarray(pcm, dtype=np.float32).reshape(-1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(ints.tobytes())


def frames_of(pcm: np.ndarray, frame_size: int = FRAME_SIZE) -> list[np.ndarray]:
    """Split into whole frames, zero-padding the last one."""
    pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
    n = -(-pcm.size // frame_size) if pcm.size else 0
    padded = np.zeros(n * frame_size, dtype=np.float32)
    padded[: pcm.size] = pcm
    return [padded[i * frame_size : (i + 1) * frame_size] for i in range(n)]
