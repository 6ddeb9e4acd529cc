"""How loud audio is: one RMS, compared in dBFS, for every loudness gate in kame.

The ASR's voice detector ignores frames below its floor (``asr.turn.min_rms_dbfs``),
the evaluation's speech segmentation gates WebRTC VAD (or decides on energy alone)
the same way, and the realtime wire counts an output frame as speech above -40 dBFS.
"""

from __future__ import annotations

import math

import numpy as np


def rms(pcm: np.ndarray) -> float:
    """Root mean square of float samples (full scale 1.0), in float64; 0 for no samples."""
    data = np.asarray(pcm)
    return float(np.sqrt(np.mean(np.square(data, dtype=np.float64)))) if data.size else 0.0


def dbfs(pcm: np.ndarray) -> float:
    """Level in dB relative to full scale (-inf for digital silence)."""
    level = rms(pcm)
    return 20.0 * math.log10(level) if level > 0 else float("-inf")


def at_least(pcm: np.ndarray, floor_dbfs: float) -> bool:
    """Whether ``pcm`` is at least ``floor_dbfs`` loud."""
    return rms(pcm) >= 10.0 ** (floor_dbfs / 20.0)
