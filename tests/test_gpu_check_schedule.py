"""The GPU check's schedule (bench/gpu_check_schedule.py) driven with a lent box's timings, faked.

A faked clock advances as the real stages would take on an H100: 60 s to write and load the 7B,
70 s to compile and capture each new batch size plus 40 timed ticks, a server that starts in 60 s.
The tick time per batch is a made-up line (or curve) whose largest batch under 80 ms is known; the
check must name it within its 345 s, and drop stages in its stated order when time runs short.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check_schedule", ROOT / "bench" / "gpu_check_schedule.py")
assert _spec is not None and _spec.loader is not None
sched = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check_schedule"] = sched
_spec.loader.exec_module(sched)

BUDGET_S = 345.0


class FakeBox:
    """The check's operations with H100-like durations on a fake clock; ``tick_ms(b)`` is the p99 tick."""

    def __init__(self, plan_max: int, tick_ms: Callable[[int], float], *, oom_above: int | None = None,
                 int8: bool = True, compile_s: float = 70.0) -> None:
        self.now = 1000.0
        self.plan_max = plan_max
        self.tick_ms = tick_ms
        self.oom_above = oom_above
        self.has_int8 = int8
        self.int8_available = int8
        self.compile_s = compile_s
        self.calls: list[str] = []
        self.compiled: set[int] = set()
        self.worker_open = False

    def clock(self) -> float:
        return self.now

    def load(self) -> int:
        self.now += 60.0
        self.worker_open = True
        self.calls.append("load")
        return self.plan_max

    def _ticks(self, batch: int) -> None:
        assert self.worker_open, "measured after the worker was closed"
        if batch not in self.compiled:
            self.now += self.compile_s
            self.compiled.add(batch)
        self.now += 45 * self.tick_ms(batch) / 1000 + 1.0

    def measure(self, batch: int) -> Any:
        self.calls.append(f"measure {batch}")
        if self.oom_above is not None and batch > self.oom_above:
            self.now += 20.0
            return sched.Measurement(batch, None, error="out of memory")
        self._ticks(batch)
        return sched.Measurement(batch, self.tick_ms(batch), 0.9 * self.tick_ms(batch))

    def stt(self, batch: int) -> dict[str, Any]:
        self.calls.append(f"stt {batch}")
        self.now += 80.0
        return {"batch": batch}

    def int8(self, batch: int) -> dict[str, Any] | None:
        self.calls.append(f"int8 {batch}")
        if not self.has_int8:
            return None
        self.now += 120.0
        return {"batch": batch, "text_agreement": 0.97}

    def graphs_off(self, batch: int) -> dict[str, Any]:
        self.calls.append(f"graphs_off {batch}")
        self.now += 15.0
        return {"batch": batch}

    def close_worker(self) -> None:
        self.worker_open = False
        self.calls.append("close")

    def server(self, batch: int, clients_s: float, deadline: float) -> dict[str, Any]:
        self.calls.append(f"server {batch} {clients_s:.0f}")
        self.now += 60.0 + clients_s + 8.0
        assert self.now <= deadline
        return {"sessions": batch}


def truth(plan_max: int, tick_ms: Callable[[int], float]) -> int:
    return max((b for b in range(1, plan_max + 1) if tick_ms(b) < 80.0), default=0)


def run(box: FakeBox, budget: float = BUDGET_S) -> dict[str, Any]:
    s = sched.Schedule(budget_s=budget, clock=box.clock, server_clients_s=60.0)
    result = s.run(box)
    assert box.now - 1000.0 <= budget, f"ran {box.now - 1000.0:.0f} s of {budget:.0f}"
    return result


def line(ms0: float, per_slot: float) -> Callable[[int], float]:
    return lambda b: ms0 + per_slot * b


@pytest.mark.parametrize(
    ("plan_max", "tick_ms"),
    [
        (34, line(18.0, 2.5)),  # H100 7B-like: 34 fit, 24 make the frame
        (34, line(30.0, 1.2)),  # the line crosses at 41: the plan's 34 is the answer
        (60, line(12.0, 0.9)),  # crossing at 75 > 60: the answer is 60
        (34, lambda b: 15.0 + 0.09 * b * b),  # curved: 26 (75.8 ms), 27 is 80.6
        (34, line(60.0, 3.0)),  # a slow card: 6
        (34, line(79.0, 3.0)),  # not even one
    ],
)
def test_the_check_names_the_largest_batch_under_80_ms(plan_max: int, tick_ms: Callable[[int], float]) -> None:
    box = FakeBox(plan_max, tick_ms)
    result = run(box)
    assert box.calls[:2] == ["load", f"measure {plan_max}"], box.calls  # the plan's maximum first
    assert result["largest_batch_under_80ms"] == truth(plan_max, tick_ms), (result, box.calls)
    assert box.calls.count("load") == 1  # written and loaded once; every batch measured in that process
    measured = [c for c in box.calls if c.startswith("measure")]
    assert len(measured) <= 4, measured


def test_the_plan_max_under_80_ms_leaves_time_for_every_stage() -> None:
    box = FakeBox(34, line(30.0, 1.2), compile_s=40.0)
    result = run(box, budget=600.0)
    assert result["exact"] and result["largest_batch_under_80ms"] == 34
    assert [c.split()[0] for c in box.calls] == ["load", "measure", "stt", "graphs_off", "int8", "close", "server"]
    assert box.calls[-1] == "server 34 60" and result["server"] == {"sessions": 34}
    assert result["int8"]["text_agreement"] == 0.97


def test_short_time_drops_the_stated_stages_first() -> None:
    box = FakeBox(34, line(18.0, 2.5))
    result = run(box)
    assert sched.DROP_ORDER == ("graphs_off", "int8", "stt", "server", "search")
    # the search took the time (its last step too: the answer stands, its bracket is said); every later
    # stage dropped, each with a note saying why
    dropped = [n.split(":")[0] for n in result["notes"]]
    assert dropped == ["search", "stt", "graphs_off", "int8", "server"], result["notes"]
    assert result["largest_batch_under_80ms"] == 24
    lo, hi = result["bracket"]
    assert lo == 24 and hi in (25, 26)


def test_no_int8_weights_in_this_build_is_a_note() -> None:
    box = FakeBox(34, line(30.0, 1.2), int8=False, compile_s=30.0)
    result = run(box, budget=600.0)
    assert "int8" not in result and "int8" not in result["stages_run"]
    assert any(n.startswith("int8: skipped, this build has no frontend.weights") for n in result["notes"])
    assert "int8 34" not in box.calls  # not asked, and no time kept for it


def test_out_of_memory_at_the_plan_max_searches_below() -> None:
    box = FakeBox(34, line(20.0, 1.0), oom_above=20)
    result = run(box)
    assert result["batches"][0]["error"] == "out of memory"
    assert result["largest_batch_under_80ms"] == 20 or result["bracket"][0] >= 17, (result, box.calls)


def test_a_failed_load_measures_nothing() -> None:
    box = FakeBox(0, line(20.0, 1.0))
    result = run(box)
    assert result["largest_batch_under_80ms"] == 0 and box.calls == ["load"]
    assert result["notes"] == ["load: failed, nothing measured"]
