"""Client-side timing of one audio session, shared by both protocol clients.

Every complete 1920-sample output frame gets an arrival time; from those
come the real-time factor, the time to first audio and each frame's
lateness against an 80 ms schedule (what ``bench/server_load.py``,
``kame mic`` and the tests report).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.audio.media import FRAME_S, FRAME_SIZE, SAMPLE_RATE
from kame.stats import percentile  # noqa: F401  (re-exported to the clients and benches)

RATE = SAMPLE_RATE
FRAME = FRAME_SIZE
#: How long ``send_pcm`` waits, after a send found the connection closed, for the receiver to take the close.
CLOSE_SEEN_TIMEOUT_S = 5.0


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


class AudioSessionBase:
    """What both protocol clients do the same way once connected: wait for the tail of the
    reply, pace and send audio, send silence, close. Subclasses set ``ws``, ``stats``, ``closed``,
    ``_recv_task`` and implement ``_send_piece``."""

    DEFAULT_CHUNK = FRAME
    ws: Any
    stats: StreamStats
    closed: asyncio.Event
    _recv_task: asyncio.Task[None]

    async def _send_piece(self, piece: np.ndarray, chunk: int) -> int | None:
        """Send one piece of audio (at most ``chunk`` samples) in the protocol's format; the samples it
        counts as sent, or None when the connection is closed."""
        raise NotImplementedError

    async def send_pcm(
        self, pcm: np.ndarray, *, chunk: int | None = None, realtime: bool = True, speed: float = 1.0
    ) -> int:
        """Send ``pcm`` (float32, 24 kHz) in ``chunk``-sample pieces, paced at ``speed`` x real time
        (``realtime=False``: as fast as the socket takes them); returns the samples sent.

        Stops early (without raising) when the session closes."""
        chunk = chunk or self.DEFAULT_CHUNK
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        step = chunk / RATE / speed
        start = time.monotonic()
        if self.stats.first_send_t is None:
            self.stats.first_send_t = start
        sent = 0
        for k, i in enumerate(range(0, pcm.size, chunk)):
            if self.closed.is_set():
                break
            if realtime:
                delay = start + k * step - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            counted = await self._send_piece(pcm[i : i + chunk], chunk)
            if counted is None:
                # The send found the connection closed before the receiver took the close: wait for it,
                # so that a caller checking ``closed`` (and the close code) after this early return sees
                # the server's close, not an open session (kame mic once skipped a 1001 reconnect so).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.closed.wait(), CLOSE_SEEN_TIMEOUT_S)
                break
            self.stats.samples_sent += counted
            sent += counted
            self.stats.last_send_t = time.monotonic()
        return sent

    async def send_silence(self, seconds: float, *, chunk: int | None = None) -> int:
        return await self.send_pcm(np.zeros(int(seconds * RATE), np.float32), chunk=chunk)

    async def drain_output(self, seconds: float = 1.0, *, until_complete: bool = False) -> None:
        """Keep receiving after the last audio was sent (frames in flight): ``seconds``, or with
        ``until_complete`` until as much audio came back as was sent (at most ``seconds``)."""
        deadline = time.monotonic() + seconds
        while not self.closed.is_set() and time.monotonic() < deadline:
            # the last frame may still sit in an encoder or a re-chunking buffer: one frame of slack
            if until_complete and self.stats.samples_received >= self.stats.samples_sent - FRAME:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.closed.wait(), min(0.05, max(0.0, deadline - time.monotonic())))

    async def close(self, code: int = 1000) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(code)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._recv_task, 5)
