"""Both sides of a session on one wall-clock timeline, as a listener at the client hears them.

``t = 0`` is when the first user audio was sent. The user's audio sits at
the position it was scheduled for (it is sent on an absolute 80 ms
schedule, so sample count = time). The assistant's audio is placed the way
a player with a small jitter buffer plays it: the first chunk starts when
it arrives; each next chunk follows the previous one seamlessly if it
arrived no more than :data:`JITTER_S` after the previous one finished (so
network jitter does not chop the speech), or starts when it arrives if it
is later than that (a stall the listener hears as a gap). Latencies
measured on this recording therefore include the server's processing and
the network, as a user would experience them.
"""

from __future__ import annotations

import numpy as np

from kame.audio.media import SAMPLE_RATE

RATE = SAMPLE_RATE
#: Lateness a player's jitter buffer hides (s).
JITTER_S = 0.1


class GrowingPcm:
    """A float32 buffer that grows as audio is written at any position (gaps are zeros)."""

    def __init__(self, capacity_s: float = 60.0) -> None:
        self._buf = np.zeros(int(capacity_s * RATE), np.float32)
        self.size = 0

    def write(self, pos: int, pcm: np.ndarray) -> None:
        end = pos + len(pcm)
        if end > len(self._buf):
            grown = np.zeros(max(end, 2 * len(self._buf)), np.float32)
            grown[: self.size] = self._buf[: self.size]
            self._buf = grown
        self._buf[pos:end] = pcm
        self.size = max(self.size, end)

    def array(self) -> np.ndarray:
        return self._buf[: self.size].copy()


class SessionTimeline:
    """The user's and the assistant's audio of one session, aligned."""

    def __init__(self) -> None:
        self.user = GrowingPcm()
        self.assistant = GrowingPcm()
        self._user_cursor = 0
        self._assistant_cursor = 0
        self.late_chunks = 0  # assistant chunks that arrived too late to follow the previous one (gaps)

    def add_user(self, pcm: np.ndarray) -> float:
        """Append the next piece of user audio; returns its start time (s)."""
        start = self._user_cursor
        self.user.write(start, np.asarray(pcm, np.float32))
        self._user_cursor += len(pcm)
        return start / RATE

    def add_assistant(self, pcm: np.ndarray, arrival_s: float) -> np.ndarray:
        """Place a chunk that arrived at ``arrival_s``; returns what was written (gap silence + chunk)."""
        pcm = np.asarray(pcm, np.float32)
        at = max(0, round(arrival_s * RATE))
        if self._assistant_cursor == 0:
            pos = at
        elif at > self._assistant_cursor + int(JITTER_S * RATE):
            self.late_chunks += 1
            pos = at
        else:
            pos = self._assistant_cursor
        gap = pos - self._assistant_cursor
        self.assistant.write(pos, pcm)
        self._assistant_cursor = pos + len(pcm)
        if gap:
            return np.concatenate([np.zeros(gap, np.float32), pcm])
        return pcm

    def stereo(self, start_s: float = 0.0, end_s: float | None = None) -> np.ndarray:
        """``[n, 2]`` float32: column 0 the user, column 1 the assistant, from ``start_s`` to ``end_s``."""
        n = max(self.user.size, self.assistant.size)
        a = round(start_s * RATE)
        b = n if end_s is None else min(n, round(end_s * RATE))
        b = max(a, b)
        out = np.zeros((b - a, 2), np.float32)
        u, s = self.user.array(), self.assistant.array()
        out[: max(0, min(b, len(u)) - a), 0] = u[a : min(b, len(u))]
        out[: max(0, min(b, len(s)) - a), 1] = s[a : min(b, len(s))]
        return out

    def duration_s(self) -> float:
        return max(self.user.size, self.assistant.size) / RATE
