"""A linear echo pre-canceller that runs before WebRTC's AEC3: a delay estimate and an adaptive filter.

Why: AEC3 (``kame.echo``) removes echo in two stages, its own linear filter and a nonlinear
*suppressor* that attenuates the frequency bands where it believes echo remains. The suppressor is
what eats the user's words when both speak at once (double talk), and before AEC3 has converged it
lets echo through that can open a false user turn. The less echo reaches AEC3, the less its
suppressor has to do. This module subtracts most of the linear part of the echo first:

* :class:`DelayEstimator` finds how far behind the reference the echo arrives (playback and capture
  latency plus the flight from speaker to microphone, up to ``max_delay_ms``) by GCC-PHAT: the
  cross-spectrum of reference and microphone over the last second, averaged over time and whitened
  (phase transform), whose inverse transform peaks at the delay of the strongest path whatever the
  spectra of the speech;
* :class:`LinearEchoCanceller` models the room from just before that delay to ``tail_ms`` after it
  with a partitioned-block frequency-domain adaptive filter (normalised LMS per frequency bin, 10 ms
  partitions, gradient constrained to stay causal), so its cost does not grow with the delay.

Robustness, since a diverging filter would add echo rather than remove it:

* two filters (the *two-path* scheme): a background filter adapts on every frame; the foreground
  filter, whose output is used, only takes the background's coefficients when the background has
  removed clearly more for several frames in a row. During double talk the user's voice disturbs
  the background's adaptation, its residual grows, and nothing is copied; if the background ends up
  worse than no filter at all it is reset to the foreground;
* the step is normalised per bin by the reference power across the filter, plus a floor (no huge
  steps on quiet bands: regularised), and non-finite coefficients reset the filter;
* a foreground that makes the signal louder than the microphone (the echo path changed) is not
  used: the microphone passes through until the filters have re-converged.

Everything is vectorised numpy on 10 ms frames (a few FFTs of 20 ms and products over the
partitions, plus a 65536-point GCC-PHAT every 200 ms): about 3 % of a core at 24 kHz
(``bench/echo.py --variants linear``). Only numpy; the caller pairs each reference frame with
the microphone frame captured while it played (``EchoCanceller`` does).
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
    step: float = 0.5  #: the background filter's normalised step (0-1; over 1 it diverges on speech)
    min_peak_ratio: float = 8.0  #: a GCC-PHAT peak this many times the mean correlation is trusted
    copy_frames: int = 3  #: frames in a row the background must win before the foreground takes it


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
        self._e_mic = self._e_fg = self._e_bg = 0.0
        self._wins = 0
        self._fg_bad = 0

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
        b = self.block
        err = np.fft.rfft(np.concatenate([np.zeros(b), e_bg]))
        power = np.sum(self._x.real**2 + self._x.imag**2, axis=0)
        # floor: a quiet band (or the start, when the history is still empty) gets no huge step;
        # -60 dBFS of reference per sample, in the FFT's units
        floor = self.partitions * 2 * b * 1e-6
        mu = self.settings.step / (power + floor)
        grad = np.conj(self._x) * (mu * err)
        g = np.fft.irfft(grad, 2 * b, axis=1)
        g[:, b:] = 0.0  # keep each partition causal and b long (the constrained update)
        upd = np.fft.rfft(g, axis=1)
        self._bg.w += upd
        if not np.all(np.isfinite(self._bg.w)):
            self._bg.w[:] = self._fg.w
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
        if self._e_fg > 2.0 * self._e_mic and self._e_mic > floor:
            self._fg_bad += 1
            if self._fg_bad > 20:  # 200 ms louder than the microphone: the path changed
                self._fg.w[:] = 0.0
                self._e_fg = self._e_mic
                self._fg_bad = 0
                self.resets += 1
            return d
        self._fg_bad = 0
        return e_fg
