"""A linear echo pre-canceller that runs before WebRTC's AEC3: a delay estimate and an adaptive filter.

Why: AEC3's nonlinear suppressor eats the user's words in double talk and, before it converges, lets
through echo that can open a false user turn; the less echo reaches AEC3, the less it has to suppress.
:class:`DelayEstimator` finds the echo's delay (GCC-PHAT, up to ``max_delay_ms``);
:class:`LinearEchoCanceller` subtracts the linear echo from there to ``tail_ms`` after it (a two-path,
partitioned-block frequency-domain Kalman filter). A diverging filter would add echo, so an output
louder than the microphone is never sent (the microphone passes through, then the filters restart)
and non-finite or worse-than-nothing filters are reset. Design: docs/clients.md; cost: docs/benchmarks.md.
Only numpy, on 10 ms frames; the caller pairs each reference frame with the microphone frame
captured while it played (``EchoCanceller`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LinearSettings:
    """How the pre-canceller searches and models the echo path."""

    max_delay_ms: int = 500  #: the longest delay searched (latency plus flight)
    tail_ms: int = 250  #: how much of the room's response after the direct path is modelled
    margin_ms: float = 5.0  #: modelled before the estimated delay (estimates err, onsets smear)
    window_ms: int = 1000  #: the GCC-PHAT window
    estimate_every_ms: int = 200  #: how often the delay is re-estimated
    min_peak_ratio: float = 8.0  #: a GCC-PHAT peak this many times the mean correlation is trusted
    copy_frames: int = 3  #: frames in a row the background must win before the foreground takes it
    #: the Kalman filter's prior on the room: its response decays 60 dB in this long (a typical room's RT60)
    prior_rt60_s: float = 0.5
    #: the prior's variance over the measured echo return loss (a prior wider than the truth only costs a
    #: few frames of misadjustment; a narrower one slows convergence)
    prior_scale: float = 4.0
    #: the echo path's random-walk model: each frame the coefficients keep this much of themselves
    #: (1 - forgetting**2 of their power is the process noise that keeps the filter tracking)
    forgetting: float = 0.9995
    noise_smoothing: float = 0.5  #: smoothing of the error spectrum, the observation noise estimate


def _shift_in(buf: np.ndarray, new: np.ndarray) -> None:
    """Append ``new`` at the end of ``buf`` in place, dropping as many samples from its start."""
    n = new.size
    buf[:-n] = buf[n:]
    buf[-n:] = new


class DelayEstimator:
    """The echo's delay behind the reference, by time-averaged GCC-PHAT (in samples, or None)."""

    def __init__(self, rate: int, frame: int, settings: LinearSettings) -> None:
        self.max_delay = int(settings.max_delay_ms * rate / 1000)
        self.window = int(settings.window_ms * rate / 1000)
        self.every = max(1, int(settings.estimate_every_ms * rate / 1000) // frame)
        self.min_ratio = settings.min_peak_ratio
        self.tolerance = max(1, int(settings.margin_ms * rate / 1000) // 2)
        self._ref = np.zeros(self.window + self.max_delay, np.float32)
        self._mic = np.zeros(self.window, np.float32)
        n = 2 * self.window + self.max_delay
        self._nfft = 1 << int(np.ceil(np.log2(n)))
        self._cross: np.ndarray = np.zeros(self._nfft // 2 + 1, np.complex128)
        self._frames = 0
        self._candidate: int | None = None
        self.delay: int | None = None
        self.confidence = 0.0

    def push(self, ref: np.ndarray, mic: np.ndarray) -> int | None:
        """One frame of each side; returns the current estimate (updated every ``estimate_every_ms``)."""
        _shift_in(self._ref, ref)
        _shift_in(self._mic, mic)
        self._frames += 1
        if self._frames % self.every == 0:
            self._estimate()
        return self.delay

    def echo_return_loss(self) -> float:
        """The microphone's power over the reference's across the last window: the echo path's energy gain
        (an upper bound: near-end sound and noise count too), floored at -30 dB."""
        ref = float(np.mean(self._ref[-self.window :].astype(np.float64) ** 2))
        mic = float(np.mean(self._mic.astype(np.float64) ** 2))
        return max(1e-3, mic / (ref + 1e-10))

    def _estimate(self) -> None:
        ref_energy = float(np.mean(self._ref[-self.window :].astype(np.float64) ** 2))
        if ref_energy < 1e-7:  # under -70 dBFS: nothing played, nothing to learn
            return
        r = np.fft.rfft(self._ref, self._nfft)
        m = np.fft.rfft(self._mic, self._nfft)
        # energy-weighted average over windows, then the phase transform
        self._cross = 0.6 * self._cross + r * np.conj(m)
        c = np.fft.irfft(self._cross / (np.abs(self._cross) + 1e-12), self._nfft)
        # c[k] = sum_n ref[n + k] mic[n]: lag d = max_delay - k
        lags = np.abs(c[: self.max_delay + 1])
        k = int(np.argmax(lags))
        ratio = float(lags[k] / (np.mean(lags) + 1e-12))
        self.confidence = ratio
        if ratio < self.min_ratio:
            self._candidate = None
            return
        lag = self.max_delay - k
        # a new delay is taken once two estimates in a row agree (a lone peak in a reverberant room does not
        # move the filter)
        if self._candidate is not None and abs(lag - self._candidate) <= self.tolerance:
            self.delay = lag
        self._candidate = lag


class _Fdaf:
    """Partitioned-block frequency-domain filter coefficients with their output (one path)."""

    def __init__(self, partitions: int, bins: int) -> None:
        self.w = np.zeros((partitions, bins), np.complex128)

    def output(self, x: np.ndarray, block: int) -> np.ndarray:
        y = np.fft.irfft(np.einsum("pk,pk->k", self.w, x), 2 * block)
        return y[block:]


class LinearEchoCanceller:
    """The delay estimate plus a two-path adaptive filter; ``process(ref, mic)`` per frame returns the
    microphone frame with the linear echo of ``ref`` (and of the frames before it) subtracted."""

    def __init__(self, rate: int, frame: int, settings: LinearSettings | None = None) -> None:
        self.settings = s = settings or LinearSettings()
        self.rate = rate
        self.block = frame
        self.delays = DelayEstimator(rate, frame, s)
        self.margin = int(s.margin_ms * rate / 1000)
        self.partitions = max(1, int(np.ceil((s.tail_ms * rate / 1000 + self.margin) / frame)))
        self.bins = frame + 1
        # the reference history the delayed frames are read from
        self._hist = np.zeros(self.delays.max_delay + 2 * frame, np.float32)
        self._offset: int | None = None  # samples back into the history where the filter starts
        self._reset_filters()
        self.frames = 0
        self.copies = 0
        self.resets = 0

    def _reset_filters(self) -> None:
        self._x = np.zeros((self.partitions, self.bins), np.complex128)
        self._fg = _Fdaf(self.partitions, self.bins)
        self._bg = _Fdaf(self.partitions, self.bins)
        self._p = self._prior()
        self._psi: np.ndarray = np.zeros(self.bins)
        self._e_model = 0.0
        self._e_left = 1e-12
        self._e_mic = self._e_fg = self._e_bg = 0.0
        self._wins = 0
        self._fg_bad = 0

    def _prior(self) -> np.ndarray:
        """The Kalman filter's initial state variance per partition and bin: how much echo each partition
        is expected to carry. A room's response decays exponentially (60 dB over its RT60), and its total
        energy is the echo return loss the delay estimator measured, so partition ``p`` gets that share of
        it. A flat prior would hand the late partitions, which carry almost nothing, as large a step as the
        direct path's and slow the convergence of all of them."""
        s = self.settings
        t = np.arange(self.partitions) * self.block / self.rate
        shape = 10 ** (-6 * t / s.prior_rt60_s)
        total = s.prior_scale * self.delays.echo_return_loss()
        return np.repeat((total * shape / shape.sum())[:, None], self.bins, axis=1)

    @property
    def expected_erle_db(self) -> float:
        """The echo return loss enhancement the Kalman filter expects of itself (dB; 0 before a delay is
        known): the power of the echo it models over the power its state variance says is left. It comes
        from the reference and the filter alone, so the user's voice neither raises nor lowers it; the
        loudspeaker's distortion, which no linear filter models, is not in it."""
        if self._offset is None:
            return 0.0
        return float(10 * np.log10(max(self._e_model, 1e-12) / max(self._e_left, 1e-12)))

    @property
    def delay(self) -> int | None:
        """The delay the filter is placed at (samples), once one is known."""
        return None if self._offset is None else self._offset + self.margin

    def process(self, ref: np.ndarray, mic: np.ndarray) -> np.ndarray:
        b = self.block
        ref = np.asarray(ref, np.float32).reshape(-1)
        mic = np.asarray(mic, np.float32).reshape(-1)
        if ref.size != b or mic.size != b:
            raise ValueError(f"the linear canceller takes frames of {b} samples, not {ref.size} and {mic.size}")
        self.frames += 1
        _shift_in(self._hist, ref)
        d = self.delays.push(ref, mic)
        if d is not None:
            offset = max(0, d - self.margin)
            if self._offset is None or abs(offset - self._offset) > self.margin // 2:
                self._offset = offset  # a new path: start over there
                self._reset_filters()
        if self._offset is None:
            return mic
        # the last two frames of the reference, `offset` samples ago
        end = self._hist.size - self._offset
        xf = np.fft.rfft(self._hist[end - 2 * b : end].astype(np.float64))
        self._x[1:] = self._x[:-1]
        self._x[0] = xf
        d64 = mic.astype(np.float64)
        e_fg = d64 - self._fg.output(self._x, b)
        e_bg = d64 - self._bg.output(self._x, b)
        self._adapt(e_bg)
        return self._choose(d64, e_fg, e_bg).astype(np.float32)

    def _adapt(self, e_bg: np.ndarray) -> None:
        """One step of the frequency-domain Kalman filter on the background coefficients.

        Per bin ``k`` and partition ``p``, the coefficient error has variance ``P[p, k]``; the error
        spectrum ``E`` is the echo left (``sum_p X P X^*``, halved by the 2-block transform's window)
        plus the observation noise: the near end's speech and noise, estimated by the smoothed error
        spectrum itself. The gain ``P X^* / (sum_p |X|^2 P + 2 psi)`` is a normalised step that is large
        while the filter is uncertain (fast convergence from the first frames) and small when the error
        is mostly near-end sound (double talk barely moves it), without a fixed step to tune; the
        variance shrinks by what each frame taught and grows by the random walk's process noise."""
        b = self.block
        s = self.settings
        err = np.fft.rfft(np.concatenate([np.zeros(b), e_bg]))
        self._psi = s.noise_smoothing * self._psi + (1 - s.noise_smoothing) * (err.real**2 + err.imag**2)
        x2 = self._x.real**2 + self._x.imag**2
        # floor: a quiet band (or the start, when the history is still empty) gets no huge step;
        # -90 dBFS of reference per sample, in the FFT's units
        floor = 2 * b * 1e-9
        xpx = np.sum(x2 * self._p, axis=0)
        gain = self._p / (xpx + 2 * self._psi + floor)
        # the filter's own view of how much echo it removes: the echo it models over the echo its
        # coefficient uncertainty leaves (both from the reference alone, so the near end does not count)
        y = np.einsum("pk,pk->k", self._bg.w, self._x)
        self._e_model = 0.9 * self._e_model + float(np.sum(y.real**2 + y.imag**2))
        self._e_left = 0.9 * self._e_left + float(np.sum(xpx))
        g = np.fft.irfft(np.conj(self._x) * (gain * err), 2 * b, axis=1)
        g[:, b:] = 0.0  # keep each partition causal and b long (the constrained update)
        self._bg.w += np.fft.rfft(g, axis=1)
        a2 = s.forgetting**2
        w2 = self._bg.w.real**2 + self._bg.w.imag**2
        self._p = a2 * (1 - 0.5 * gain * x2) * self._p + (1 - a2) * w2
        if not (np.all(np.isfinite(self._bg.w)) and np.all(np.isfinite(self._p))):
            self._bg.w[:] = self._fg.w
            self._p = self._prior()
            self.resets += 1

    def _choose(self, d: np.ndarray, e_fg: np.ndarray, e_bg: np.ndarray) -> np.ndarray:
        a = 0.7  # energies smoothed over a few frames (about 30 ms)
        self._e_mic = a * self._e_mic + float(d @ d)
        self._e_fg = a * self._e_fg + float(e_fg @ e_fg)
        self._e_bg = a * self._e_bg + float(e_bg @ e_bg)
        floor = 1e-9 * self.block  # under about -90 dBFS nothing is decided
        if self._e_bg < 0.5 * self._e_fg and self._e_mic > floor:
            self._wins += 1
            if self._wins >= self.settings.copy_frames:
                self._fg.w[:] = self._bg.w
                self._e_fg = self._e_bg
                self.copies += 1
                self._wins = 0
        else:
            self._wins = 0
        if self._e_bg > 4.0 * self._e_mic and self._e_mic > floor:  # worse than no filter: diverging
            self._bg.w[:] = self._fg.w
            self._e_bg = self._e_fg
            self.resets += 1
        # the background, when it is the quieter: the Kalman filter's adaptation holds through double
        # talk (its step shrinks where the error is near-end sound), so between two copies it is most
        # often the better filter; the foreground is the fallback when it is not
        out, e_out = (e_bg, self._e_bg) if self._e_bg < self._e_fg else (e_fg, self._e_fg)
        if e_out > 2.0 * self._e_mic and self._e_mic > floor:
            self._fg_bad += 1
            if self._fg_bad > 20:  # 200 ms louder than the microphone: the path changed
                self._fg.w[:] = 0.0
                self._bg.w[:] = 0.0
                self._p = self._prior()
                self._e_fg = self._e_bg = self._e_mic
                self._fg_bad = 0
                self.resets += 1
            return d
        self._fg_bad = 0
        return out
