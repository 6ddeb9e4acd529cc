"""``bench/echo.py --network``'s model of the server's path: the delay from what the server sent to what the
client plays moves in 20 ms steps within 40-250 ms, the jitter buffer plays silence or skips (never a sample
twice, never out of order), and the client's clock drift stretches what comes back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import echo as bench  # noqa: E402  (bench/echo.py)

RATE = bench.RATE


def test_the_delay_walks_in_20_ms_steps_within_its_bounds() -> None:
    d = bench.network_delays(RATE * 60, 250, seed=4)
    assert d[0] == 250 * RATE // 1000
    ms = np.unique(d) * 1000 // RATE
    assert ms.min() >= 40 and ms.max() <= 250 and ms.size > 2
    steps = np.diff(d)[np.diff(d) != 0] * 1000 // RATE
    assert set(np.abs(steps).tolist()) == {20}
    assert np.all(bench.network_delays(RATE * 10, 100, seed=4, step_ms=0) == 100 * RATE // 1000)


def test_the_client_plays_each_sent_sample_at_most_once_in_order_with_silence_where_the_delay_grows() -> None:
    sent = np.arange(1, RATE * 8 + 1, dtype=np.float32)  # every sample tells which one it is
    d = bench.network_delays(sent.size, 100, seed=2)
    played = bench.network_played(sent, d)
    heard = played[played > 0]
    assert np.all(np.diff(heard) > 0)  # in order, never twice
    grew = int(np.sum(np.maximum(np.diff(d), 0)))
    assert np.sum(played == 0) == d[0] + grew  # the first delay, then each step up, is silence
    assert played[d[0]] == 1.0


def test_drift_stretches_the_signal_by_its_ppm() -> None:
    t = np.arange(RATE * 10) / RATE
    x = np.sin(2 * np.pi * 500 * t).astype(np.float32)
    y = bench.drifted(x, 100.0)
    assert y.size == x.size
    # 100 ppm over 10 s: the end has moved by 1 ms, half a 500 Hz period: the two are in antiphase there
    tail = slice(-RATE // 10, None)
    assert float(np.mean(x[tail] * y[tail])) < -0.4
    head = slice(RATE // 10, RATE // 5)
    assert float(np.mean(x[head] * y[head])) > 0.4
