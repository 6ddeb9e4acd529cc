"""Acoustic echo: WebRTC's canceller (AEC3) for a microphone near a speaker, and a simulated echo path.

:class:`EchoCanceller` removes what was played (the reference) from what the microphone picked up,
with WebRTC's audio processing module (``livekit`` wheel, the ``mic`` extra), by default after
:mod:`kame.audio.echo_linear`. Blocks of any length are cut into 10 ms frames (at most 10 ms latency,
none for multiples of 10 ms). Frames go in sound-card order, reference *i* then microphone *i*: whole
blocks of each would look like jitter to AEC3's delay estimator. Pending reference is bounded by
:data:`MAX_QUEUE_MS` (the oldest is fed alone; nothing is dropped).

:class:`EchoPath` simulates speaker, room and microphone (convolution with an impulse response) so all
this is testable without sound cards. Both take float32 mono at one rate; a mismatched reference is
refused with :class:`EchoInputError`, never silently misused.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np

from kame.audio.echo_linear import LinearEchoCanceller
from kame.audio.pcm import float_to_pcm16_bytes, pcm16_to_float
from kame.errors import UserError

FRAME_MS = 10  #: the audio processing module's frame
RATES = (8000, 16000, 24000, 32000, 48000)  #: sample rates the module takes
MAX_QUEUE_MS = 500  #: reference waiting for its microphone frame, at most


class EchoInputError(UserError, ValueError):
    """Audio the canceller cannot use (wrong rate or channel count, unreadable impulse response)."""


def _livekit_rtc() -> Any:
    try:
        from livekit import rtc
    except (ImportError, OSError) as exc:
        raise UserError(
            f"echo cancellation needs the `livekit` package ({exc}): `pip install 'kame[mic]'`, or turn it off with --no-aec"
        ) from None
    return rtc


def _to_int16(pcm: np.ndarray) -> bytes:
    return float_to_pcm16_bytes(pcm)


class _Framer:
    """Cuts a stream of blocks into fixed frames; keeps the remainder for the next block."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pending: np.ndarray = np.zeros(0, np.float32)

    def frames(self, pcm: np.ndarray) -> list[np.ndarray]:
        buf = np.concatenate([self._pending, pcm]) if self._pending.size else pcm
        n = buf.size // self.size
        self._pending = buf[n * self.size :].copy()
        return [buf[i * self.size : (i + 1) * self.size] for i in range(n)]


class EchoCanceller:
    """WebRTC AEC3 on one microphone and the one signal played near it (float32 mono blocks).

    Call :meth:`far` with each block as it is played and :meth:`near` with each block the
    microphone captured; ``near`` returns the block with the echo removed, of the same length.
    ``delay_ms`` is a hint for the module's delay estimator (the playback plus capture latency);
    AEC3 finds the actual delay itself. Not thread-safe: feed both sides from one thread (the
    duplex stream's callback, or one event loop).

    ``linear`` (the default) adds :mod:`kame.audio.echo_linear`'s pre-canceller and a second AEC3 on its
    output, sent while the user speaks with the pre-canceller's own output blended in 12 dB down, a
    floor under what the suppressor may take from the voice (see :class:`_Mix`): in ``bench/echo.py`` it keeps far more
    of the user's words during double talk than AEC3 alone, for about three times the CPU (still
    under a tenth of a core). ``linear=False`` is AEC3 alone.
    """

    def __init__(self, sample_rate: int, channels: int = 1, *, delay_ms: int = 0, noise_suppression: bool = True,
                 high_pass_filter: bool = True, linear: bool = True) -> None:
        if sample_rate not in RATES:
            raise EchoInputError(f"echo cancellation works at {', '.join(map(str, RATES))} Hz, not {sample_rate} Hz")
        if channels != 1:
            raise EchoInputError(f"echo cancellation takes mono audio, not {channels} channels")
        rtc = _livekit_rtc()
        self._rtc = rtc
        self.sample_rate = sample_rate
        self.channels = channels
        self.frame = sample_rate * FRAME_MS // 1000
        self.delay_ms = max(0, int(delay_ms))
        self._apm = rtc.AudioProcessingModule(
            echo_cancellation=True, noise_suppression=noise_suppression, high_pass_filter=high_pass_filter,
            auto_gain_control=False,
        )
        self._far = _Framer(self.frame)
        self._near = _Framer(self.frame)
        #: reference frames not yet paired with their microphone frame (oldest first)
        self._ref: collections.deque[np.ndarray] = collections.deque()
        self.max_queue = MAX_QUEUE_MS // FRAME_MS
        self.linear = LinearEchoCanceller(sample_rate, self.frame) if linear else None
        # with the pre-canceller: a second AEC3 on its output, used while the user speaks (see _Mix)
        self._apm_lin = rtc.AudioProcessingModule(
            echo_cancellation=True, noise_suppression=noise_suppression, high_pass_filter=high_pass_filter,
            auto_gain_control=False,
        ) if linear else None
        self._mix = _Mix()
        self._out: collections.deque[np.ndarray] = collections.deque()
        self._out_len = 0
        self.far_samples = 0
        self.near_samples = 0

    def _check(self, side: str, pcm: np.ndarray, sample_rate: int | None, channels: int | None) -> np.ndarray:
        arr = np.asarray(pcm, dtype=np.float32)
        ch = channels if channels is not None else (arr.shape[1] if arr.ndim == 2 else 1)
        rate = sample_rate if sample_rate is not None else self.sample_rate
        if rate != self.sample_rate or ch != self.channels:
            raise EchoInputError(
                f"the {side} is {rate} Hz, {ch} channel(s) but the canceller runs at {self.sample_rate} Hz, "
                f"{self.channels} channel(s): resample or down-mix it first"
            )
        return arr.reshape(-1)

    def _frame(self, pcm: np.ndarray) -> Any:
        return self._rtc.AudioFrame(_to_int16(pcm), self.sample_rate, 1, pcm.size)

    def far(self, pcm: np.ndarray, *, sample_rate: int | None = None, channels: int | None = None) -> None:
        """The block just played (the reference the echo is made of); it waits for its microphone frames."""
        arr = self._check("reference (played audio)", pcm, sample_rate, channels)
        self.far_samples += arr.size
        for f in self._far.frames(arr):
            if len(self._ref) >= self.max_queue:  # played far ahead of the capture: the oldest goes in alone
                self._apm.process_reverse_stream(self._frame(self._ref.popleft()))
            self._ref.append(f)

    def _aec3(self, apm: Any, pcm: np.ndarray) -> np.ndarray:
        frame = self._frame(pcm)
        apm.set_stream_delay_ms(self.delay_ms)
        apm.process_stream(frame)  # in place
        return pcm16_to_float(bytes(frame.data))

    def near(self, pcm: np.ndarray, *, sample_rate: int | None = None, channels: int | None = None) -> np.ndarray:
        """The block the microphone captured, with the echo of what was played removed."""
        arr = self._check("microphone signal", pcm, sample_rate, channels)
        self.near_samples += arr.size
        for f in self._near.frames(arr):
            ref = self._ref.popleft() if self._ref else None
            if ref is not None:  # the reference frame played while this one was captured goes in first
                self._apm.process_reverse_stream(self._frame(ref))
                if self._apm_lin is not None:
                    self._apm_lin.process_reverse_stream(self._frame(ref))
            out = self._aec3(self._apm, f)
            if self.linear is not None and self._apm_lin is not None:
                pre = self.linear.process(ref if ref is not None else np.zeros(self.frame, np.float32), f)
                out = self._mix.frame(f, out, self._aec3(self._apm_lin, pre), pre, self.linear.expected_erle_db)
            self._out.append(out)
            self._out_len += self.frame
        # the same length back: leading zeros while the first partial frame waits (at most 10 ms)
        need = arr.size
        parts: list[np.ndarray] = []
        if self._out_len < need:
            parts.append(np.zeros(need - self._out_len, np.float32))
            need = self._out_len
        while need > 0:
            head = self._out[0]
            take = min(need, head.size)
            parts.append(head[:take])
            if take == head.size:
                self._out.popleft()
            else:
                self._out[0] = head[take:]
            self._out_len -= take
            need -= take
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


class _Mix:
    """Which of two AEC3 outputs is sent, frame by frame: AEC3 on the microphone, or AEC3 after the linear
    pre-canceller (:mod:`kame.audio.echo_linear`).

    The pre-canceller path keeps more of the user's words when both speak but leaks the loudspeaker's
    nonlinear echo where the assistant speaks alone, so it is sent only while the user speaks, read from
    AEC3-on-the-microphone's output: well above its noise floor, within ``of_mic_db`` of the microphone and
    above ``min_dbfs``. The switch holds ``hold`` frames and crossfades over ``ramp`` frames. While the user
    speaks, the pre-canceller's own output is blended in at ``voice_floor_db``, so the suppressor never takes
    more than about that from the voice, once the pre-canceller expects ``min_linear_erle_db`` itself
    (before that its output is mostly echo). The measurements behind these choices: docs/benchmarks.md."""

    def __init__(self, above_db: float = 12.0, of_mic_db: float = -12.0, min_dbfs: float = -60.0, hold: int = 20,
                 ramp: int = 4, voice_floor_db: float = -12.0, min_linear_erle_db: float = 6.0) -> None:
        self.above = 10 ** (above_db / 10)
        self.of_mic = 10 ** (of_mic_db / 10)
        self.min_energy = 10 ** (min_dbfs / 10)
        self.hold = hold
        self.step = 1.0 / ramp
        self.energy = 0.0  #: AEC3-on-the-microphone's frame energy, smoothed over about 30 ms
        self.mic_energy = 0.0  #: the microphone's, the same way
        self.pre_energy = 0.0  #: AEC3-after-the-pre-canceller's, the same way
        self._quieter = 0.0  #: 1.0 while the pre-cancelled path is the quieter one (3 dB hysteresis)
        self.floor = 1e-9  #: its floor (-90 dBFS at least)
        self._held = 0
        self.weight = 0.0  #: of the pre-cancelled path
        self.voice_floor = 10 ** (voice_floor_db / 20)
        self.min_linear_erle_db = min_linear_erle_db
        self.lin_weight = 0.0  #: of the pre-canceller's own output (at most ``voice_floor``)

    def frame(self, mic: np.ndarray, direct: np.ndarray, pre: np.ndarray, lin: np.ndarray | None = None,
              lin_erle_db: float = 0.0) -> np.ndarray:
        """One 10 ms frame: the microphone, AEC3 on it (``direct``), AEC3 after the pre-canceller (``pre``)
        and, optionally, the pre-canceller's own output (``lin``) with the enhancement it expects of itself."""
        out = self._switch(mic, direct, pre)
        if lin is None:
            return out
        top = self.voice_floor
        target = top if self._held > 0 and lin_erle_db >= self.min_linear_erle_db else 0.0
        v0 = self.lin_weight
        step = self.step * top
        self.lin_weight = min(target, v0 + step) if target > v0 else max(target, v0 - step)
        if v0 == self.lin_weight == 0.0:
            return out
        ramp = np.linspace(v0, self.lin_weight, out.size, endpoint=False, dtype=np.float32)
        return (ramp * lin + (1 - ramp) * out).astype(np.float32)

    def _switch(self, mic: np.ndarray, direct: np.ndarray, pre: np.ndarray) -> np.ndarray:
        e = float(np.mean(direct.astype(np.float64) ** 2))
        self.energy = 0.6 * self.energy + 0.4 * e
        self.mic_energy = 0.6 * self.mic_energy + 0.4 * float(np.mean(mic.astype(np.float64) ** 2))
        self.pre_energy = 0.6 * self.pre_energy + 0.4 * float(np.mean(pre.astype(np.float64) ** 2))
        # the floor follows a quieter moment at once and rises 6 dB a second
        self.floor = max(1e-9, min(self.energy, self.floor * 10 ** (0.6 / 100)))
        if self.energy > max(self.floor * self.above, self.mic_energy * self.of_mic, self.min_energy):
            self._held = self.hold
        elif self._held > 0:
            self._held -= 1
        if self.pre_energy < 0.5 * self.energy:
            self._quieter = 1.0
        elif self.energy < 0.5 * self.pre_energy:
            self._quieter = 0.0
        target = 1.0 if self._held > 0 else self._quieter
        w0 = self.weight
        self.weight = min(target, w0 + self.step) if target > w0 else max(target, w0 - self.step)
        if w0 == self.weight == 0.0:
            return direct
        if w0 == self.weight == 1.0:
            return pre
        ramp = np.linspace(w0, self.weight, direct.size, endpoint=False, dtype=np.float32)
        return (ramp * pre + (1 - ramp) * direct).astype(np.float32)


def read_impulse_response(path: Path, sample_rate: int) -> np.ndarray:
    """A mono room impulse response from a wav file, resampled to ``sample_rate``.

    Its leading silence is the echo's delay, its level the echo's level. Anything unusable (missing,
    not a wav, several channels, empty, silent) raises :class:`EchoInputError` saying which."""
    import wave

    try:
        with wave.open(str(path), "rb") as w:
            rate, channels, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            raw = w.readframes(n)
    except FileNotFoundError:
        raise EchoInputError(f"--echo-path {path}: no such file") from None
    except (OSError, EOFError, wave.Error) as exc:
        raise EchoInputError(f"--echo-path {path}: not a readable wav file ({exc})") from None
    if channels != 1:
        raise EchoInputError(f"--echo-path {path}: the impulse response has {channels} channels; give one (mono)")
    dtypes = {2: "<i2", 4: "<i4"}
    if width not in dtypes:
        raise EchoInputError(f"--echo-path {path}: {8 * width}-bit samples; use 16- or 32-bit PCM")
    ir = np.frombuffer(raw, dtype=dtypes[width]).astype(np.float64) / float(2 ** (8 * width - 1))
    if ir.size == 0 or not np.any(ir):
        raise EchoInputError(f"--echo-path {path}: the impulse response is empty or silent")
    if rate != sample_rate:
        import soxr

        ir = soxr.resample(ir, rate, sample_rate) * (rate / sample_rate)  # the same gain at the new rate
    return ir.astype(np.float32)


class EchoPath:
    """A simulated loudspeaker-room-microphone path: what is played, convolved with ``ir``, block by block.

    ``play(block)`` (at most ``block`` samples) returns what the microphone picks up during that
    block (the tails of earlier blocks included), by FFT overlap-add, so long responses stay cheap."""

    def __init__(self, ir: np.ndarray, block: int) -> None:
        self.ir = np.asarray(ir, np.float64).reshape(-1)
        self.block = block
        self._n = 1 << int(np.ceil(np.log2(block + self.ir.size - 1)))
        self._ir_f = np.fft.rfft(self.ir, self._n)
        self._tail: np.ndarray = np.zeros(self._n, np.float64)

    def play(self, pcm: np.ndarray) -> np.ndarray:
        x = np.asarray(pcm, np.float64).reshape(-1)
        if x.size > self.block:
            raise EchoInputError(f"echo path: blocks of at most {self.block} samples, not {x.size}")
        y = np.fft.irfft(np.fft.rfft(x, self._n) * self._ir_f, self._n)
        self._tail += y
        out = self._tail[: x.size].copy()
        self._tail = np.concatenate([self._tail[x.size :], np.zeros(x.size)])
        return out.astype(np.float32)
