"""The audio clocks of a WebRTC call: the input jitter buffer on the server's clock, the output FIFO. No I/O.

Moshi's clock is its input: one 80 ms frame in, one frame out. Over a websocket
the client's audio *is* that clock (TCP delivers everything, late at worst).
Over RTP packets are lost, reordered, late, or not sent at all (DTX, a muted
track), so the clock must be the server's: :class:`InputClock` is asked for a
frame every 80 ms by the transport, and answers with what arrived for that
stretch of the sender's timeline, concealing what did not (silence with short
fades, counted). Audio is placed by its RTP timestamp, not by arrival order:
a reordered packet lands where it belongs, a late one (its stretch already
played) is dropped and counted, a long gap (DTX) is silence, a timeline jump
(a new sender clock) re-anchors.

:class:`OutputBuffer` is the other way: Moshi's 80 ms frames in, 20 ms RTP
frames out on the RTP sender's clock; silence when nothing waits, so RTP flows
continuously; a short prefill absorbs the engine's tick jitter.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kame.audio.media import FRAME_SIZE, SAMPLE_RATE

#: Fade (samples) at the edges of concealed audio, so a lost packet is a dip, not a click.
FADE_SAMPLES = 48


@dataclass
class InputStats:
    """What the input clock did, in samples of 24 kHz audio (cumulative)."""

    played: int = 0
    concealed: int = 0
    late_dropped: int = 0
    overflow_dropped: int = 0
    resyncs: int = 0
    delay_raises: int = 0


class InputClock:
    """RTP audio (positions on the sender's timeline, 24 kHz samples) -> one frame per server tick.

    ``delay`` samples of playout delay absorb jitter: the frame taken at a tick covers the sender's
    timeline ``delay`` behind the newest audio expected by then. ``max_ahead``: audio further ahead than
    that re-anchors the timeline (a sender whose clock jumped, a burst after a long stall).
    """

    def __init__(self, *, frame_size: int = FRAME_SIZE, delay: int = 1440, max_ahead: int = SAMPLE_RATE,
                 max_late: int = SAMPLE_RATE * 3 // 10) -> None:
        self.frame_size = frame_size
        self.delay = delay
        self.max_ahead = max_ahead
        self.max_late = max_late
        self.stats = InputStats()
        self._cursor: int | None = None  # the sender position the next frame starts at
        self._chunks: dict[int, np.ndarray] = {}  # start position -> samples (not overlapping)
        self._real_end: int | None = None  # the end of the last real (not concealed) audio played

    @property
    def anchored(self) -> bool:
        return self._cursor is not None

    def buffered(self) -> int:
        """Samples waiting at or after the cursor."""
        if self._cursor is None:
            return 0
        return sum(len(c) for start, c in self._chunks.items() if start + len(c) > self._cursor)

    def push(self, position: int, pcm: np.ndarray) -> None:
        """Audio that starts at ``position`` of the sender's timeline (any order, any length)."""
        if not len(pcm):
            return
        pcm = np.asarray(pcm, dtype=np.float32)
        if self._cursor is None:
            self._cursor = position - self.delay
        end = position + len(pcm)
        late = self._cursor - position
        if 0 < late <= self.max_late and (self._real_end is None or position >= self._real_end):
            # the buffer ran dry and this is what it waited for (a burst after a stall): play it, later. The
            # stretch it covers was concealed already; from now on the playout runs ``late`` further behind.
            self._cursor = position
            self.stats.delay_raises += 1
        elif end <= self._cursor:
            self.stats.late_dropped += len(pcm)
            return
        if position < self._cursor:  # partly late: keep the part still to play
            cut = self._cursor - position
            self.stats.late_dropped += cut
            pcm, position = pcm[cut:], self._cursor
        if position - self._cursor > self.max_ahead:  # the timeline jumped: start again from here
            self.stats.resyncs += 1
            self.stats.overflow_dropped += self.buffered()
            self._chunks.clear()
            self._cursor = position - self.delay
        for start, chunk in list(self._chunks.items()):  # a duplicate or an overlap: the first copy wins
            if start < position + len(pcm) and position < start + len(chunk):
                if start <= position and start + len(chunk) >= position + len(pcm):
                    return
                if start <= position:
                    cut = start + len(chunk) - position
                    pcm, position = pcm[cut:], position + cut
                else:
                    pcm = pcm[: start - position]
                if not len(pcm):
                    return
        self._chunks[position] = pcm

    def take(self) -> np.ndarray:
        """The next frame on the server's clock: what arrived for it, the rest concealed."""
        n = self.frame_size
        out = np.zeros(n, dtype=np.float32)
        if self._cursor is None:  # nothing ever arrived (ICE still connecting, a muted peer): silence
            self.stats.concealed += n
            return out
        lo, hi = self._cursor, self._cursor + n
        have = np.zeros(n, dtype=bool)
        for start in sorted(self._chunks):
            chunk = self._chunks[start]
            if start >= hi:
                break
            a, b = max(lo, start), min(hi, start + len(chunk))
            if b > a:
                out[a - lo : b - lo] = chunk[a - start : b - start]
                have[a - lo : b - lo] = True
            if start + len(chunk) <= hi:
                del self._chunks[start]
            elif start < hi:  # keep the rest of this chunk for the next frame
                del self._chunks[start]
                self._chunks[hi] = chunk[hi - start :]
        got = int(have.sum())
        if got:
            self._real_end = lo + int(np.flatnonzero(have)[-1]) + 1
        self.stats.played += got
        self.stats.concealed += n - got
        if got < n:
            self._fade_gaps(out, have)
        self._cursor = hi
        self._shrink()
        return out

    def _shrink(self) -> None:
        """Give back latency a stall added: while more than ``delay`` plus a frame waits, skip 10 ms a frame."""
        assert self._cursor is not None
        if not self._chunks:
            return
        ahead = max(start + len(c) for start, c in self._chunks.items()) - self._cursor
        excess = ahead - self.delay - self.frame_size
        if excess <= 0:
            return
        skip = min(excess, self.frame_size // 8)
        new = self._cursor + skip
        for start in sorted(self._chunks):
            chunk = self._chunks[start]
            if start >= new:
                break
            del self._chunks[start]
            if start + len(chunk) > new:
                self._chunks[new] = chunk[new - start :]
                self.stats.overflow_dropped += new - start
            else:
                self.stats.overflow_dropped += len(chunk)
        self._cursor = new

    def _fade_gaps(self, out: np.ndarray, have: np.ndarray) -> None:
        """Short fades into and out of each concealed stretch (silence between)."""
        edges = np.flatnonzero(np.diff(have.astype(np.int8)))
        # into a gap: fade the audio before it down; out of a gap: fade the audio after it up
        for e in edges:
            if have[e]:  # audio ends at e
                a = max(0, e + 1 - FADE_SAMPLES)
                out[a : e + 1] *= np.linspace(1.0, 0.0, e + 1 - a, dtype=np.float32)
            else:  # audio starts at e + 1
                b = min(len(out), e + 1 + FADE_SAMPLES)
                out[e + 1 : b] *= np.linspace(0.0, 1.0, b - e - 1, dtype=np.float32)


@dataclass
class OutputStats:
    """What the output buffer did (cumulative, in 24 kHz samples)."""

    played: int = 0
    silence: int = 0
    underruns: int = 0
    overflow_dropped: int = 0
    cleared: int = 0


class OutputBuffer:
    """Moshi's output (80 ms frames, at the engine's pace) -> RTP frames (20 ms) on the sender's clock.

    Playing starts once ``prefill`` samples wait (the engine's tick jitter), and again after an
    underrun; beyond ``limit`` waiting samples the oldest are dropped (latency stays bounded).
    """

    def __init__(self, *, rtp_frame: int = 480, prefill: int = 960, limit: int = SAMPLE_RATE // 2) -> None:
        self.rtp_frame = rtp_frame
        self.prefill = prefill
        self.limit = limit
        self.stats = OutputStats()
        self._q: deque[np.ndarray] = deque()
        self._head = 0  # samples of _q[0] already played
        self._size = 0
        self._playing = False
        #: samples queued in total (a position on the output timeline), and played in total
        self.queued_total = 0
        self.played_total = 0

    @property
    def size(self) -> int:
        return self._size

    def push(self, pcm: np.ndarray) -> None:
        pcm = np.asarray(pcm, dtype=np.float32)
        if not len(pcm):
            return
        self._q.append(pcm)
        self._size += len(pcm)
        self.queued_total += len(pcm)
        while self._size > self.limit:
            drop = len(self._q[0]) - self._head
            self._q.popleft()
            self._head = 0
            self._size -= drop
            self.stats.overflow_dropped += drop
            self.played_total += drop

    def clear(self) -> int:
        """Drop everything waiting (``output_audio_buffer.clear``); returns the samples dropped."""
        dropped = self._size
        self.stats.cleared += dropped
        self.played_total += dropped
        self._q.clear()
        self._head = self._size = 0
        self._playing = False
        return dropped

    def take(self) -> np.ndarray:
        """One RTP frame: queued audio, or silence."""
        n = self.rtp_frame
        if not self._playing:
            if self._size < self.prefill:
                self.stats.silence += n
                return np.zeros(n, dtype=np.float32)
            self._playing = True
        out = np.zeros(n, dtype=np.float32)
        filled = 0
        while filled < n and self._q:
            chunk = self._q[0]
            k = min(n - filled, len(chunk) - self._head)
            out[filled : filled + k] = chunk[self._head : self._head + k]
            filled += k
            self._head += k
            if self._head >= len(chunk):
                self._q.popleft()
                self._head = 0
        self._size -= filled
        self.played_total += filled
        self.stats.played += filled
        if filled < n:
            self.stats.silence += n - filled
            self.stats.underruns += 1
            self._playing = False
        return out
