"""Client-side timing of one audio session, shared by both protocol clients.

Every complete 1920-sample output frame gets an arrival time; from those
come the real-time factor, the time to first audio and each frame's
lateness against an 80 ms schedule (what ``bench/server_load.py``,
``kame mic`` and the tests report).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

RATE = 24000
FRAME = 1920
FRAME_S = FRAME / RATE


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


@dataclass
class StreamStats:
    """What one session sent and received, with client-side timestamps (time.monotonic)."""

    connected_t: float = 0.0
    first_send_t: float | None = None
    last_send_t: float | None = None
    samples_sent: int = 0
    samples_received: int = 0
    frame_arrivals: list[float] = field(default_factory=list)  # one per complete 1920-sample output frame

    @property
    def audio_sent_s(self) -> float:
        return self.samples_sent / RATE

    @property
    def audio_received_s(self) -> float:
        return self.samples_received / RATE

    @property
    def wall_s(self) -> float:
        """From the first audio sent to the last audio received (or sent)."""
        if self.first_send_t is None or not self.frame_arrivals:
            return 0.0
        return max(self.frame_arrivals[-1], self.last_send_t or 0.0) - self.first_send_t

    @property
    def rtf(self) -> float:
        """Real-time factor: audio received / wall time (1.0 = the server keeps up exactly)."""
        wall = self.wall_s
        return self.audio_received_s / wall if wall > 0 else 0.0

    @property
    def time_to_first_audio_s(self) -> float | None:
        if self.first_send_t is None or not self.frame_arrivals:
            return None
        return self.frame_arrivals[0] - self.first_send_t

    def lateness_s(self, start: int = 0) -> list[float]:
        """Lateness of each frame against t0 + k * 80 ms, t0 = the arrival of frame ``start``."""
        arr = self.frame_arrivals[start:]
        if not arr:
            return []
        t0 = arr[0]
        return [max(0.0, t - (t0 + k * FRAME_S)) for k, t in enumerate(arr)]

    def lateness_ms(self, q: float, start: int = 0) -> float:
        return 1000 * percentile(self.lateness_s(start), q)

    def gaps_s(self, start: int = 0) -> list[float]:
        """Pauses between consecutive output frames (from frame ``start`` on)."""
        return [b - a for a, b in itertools.pairwise(self.frame_arrivals[start:])]

    def max_gap_s(self, start: int = 0) -> float:
        return max(self.gaps_s(start), default=0.0)
