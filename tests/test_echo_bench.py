"""``bench/echo.py --quick``: one condition end to end (a generated room, espeak far and near ends, Whisper,
the server's turn detector), AEC off and kame's default canceller, within 60 s.

What is checked is that the bench measures: without a canceller the echo is all there (ERLE about 0 dB)
and opens a user turn where only the assistant speaks; with kame's canceller (the linear pre-canceller
and AEC3) the echo is removed by 25 dB or more, no false turn is opened, and the user's words heard
through the double talk stay within 10 points of the echo-free run's. The plot is written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: the real-time lane under xdist (tests/conftest.py): a bench condition timed against the wall clock
pytestmark = pytest.mark.realtime

ROOT = Path(__file__).resolve().parents[1]


def test_one_condition_end_to_end(tmp_path: Path) -> None:
    out, png = tmp_path / "echo.json", tmp_path / "echo.png"
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "echo.py"), "--quick", "--variants", "off,linear+aec3",
         "--json", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-2000:]
    assert took < 60, took
    data = json.loads(out.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {"off", "linear+aec3"}
    assert data["user_content_words"] >= 20  # one missed word is at most 5 points
    assert len(data["echo_free_turns"]) >= 1  # the detector hears the user when there is no echo
    off, on = rows["off"], rows["linear+aec3"]
    assert abs(off["erle_db"]) < 1.0
    assert off["false_turns_per_min"] > 0, off  # the echo alone opens a turn
    assert on["erle_db"] >= 25, on
    assert on["false_turns_per_min"] == 0, on
    assert on["recall"] >= data["echo_free_recall"] - 0.10, (on, data["echo_free_recall"])
    assert 0 < on["rtf"] < 0.5, on
    assert png.stat().st_size > 10_000
