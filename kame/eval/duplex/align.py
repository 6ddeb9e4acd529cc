"""The model's audio on the input's clock, for an ``output.wav`` as long as ``input.wav``.

Two alignments (each row of the table names the one it used):

- ``arrival`` (default, the benchmark's own Moshi client): one 80 ms frame of
  zeros, then every received frame in arrival order, back to back;
- ``frame``: output frame *n* at *n* x 80 ms (Moshi answers input frame *n*
  with output frame *n*), i.e. the same frames without the leading zero frame.

Either way the result is cut or zero-padded to the input's length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kame.audio.media import FRAME_SIZE

ALIGNMENTS = ("arrival", "frame")


def align_output(chunks: Sequence[np.ndarray], n_samples: int, alignment: str = "arrival") -> np.ndarray:
    """``n_samples`` of 24 kHz output built from the received chunks (in arrival order)."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment {alignment!r}: expected one of {', '.join(ALIGNMENTS)}")
    lead = [np.zeros(FRAME_SIZE, np.float32)] if alignment == "arrival" else []
    parts = lead + [np.asarray(c, np.float32).reshape(-1) for c in chunks]
    pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    out = np.zeros(n_samples, np.float32)
    n = min(n_samples, pcm.size)
    out[:n] = pcm[:n]
    return out
