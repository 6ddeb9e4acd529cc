"""What the GPU check runs, in which order, and what it drops when the lent box's minutes run short.

Pure (standard library only, an injectable clock): ``bench/gpu_check.py`` drives it with a worker
process that has loaded the checkpoint once; the tests drive it with faked timings. The stages, by
priority (what is dropped first when time runs short is the LAST of this list):

1. write and load the checkpoint (never dropped); 2. the batch the memory plan allows at most
(never dropped: the largest batch that fits is measured first); 3. the search for the largest
batch whose p99 tick is under 80 ms (secant steps between the best batch under and the smallest
over; when cut short the result is the bracket); 4. a real server at that batch (its clients'
seconds shrink before it is dropped); 5. the Kyutai STT beside the engine; 6. int8 weights and
their behaviour agreement with bf16 (only where ``frontend.weights`` exists; run last in the worker);
7. graphs off.
A stage runs only if, after its estimated cost, the time left still covers the minimum of every
stage of higher priority not yet run; estimates are replaced by what the run measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

TARGET_MS = 80.0
STAGES = ("load", "ceiling", "search", "server", "stt", "int8", "graphs_off")
#: The stated order in which stages are dropped when time runs short (the reverse of their priority).
DROP_ORDER = tuple(reversed(STAGES[2:]))


@dataclass
class Costs:
    """Seconds each stage is expected to take (replaced by measured ones as the run goes)."""

    load_s: float = 60.0  # write and load the checkpoint (the real 7B: ~45 s to write, ~15 s to load)
    new_batch_s: float = 75.0  # a batch size not run before: compile, graph capture and the timed ticks
    server_start_s: float = 60.0  # `kame serve`: load (the file is in the page cache) and warm-up (cached kernels)
    server_stop_s: float = 10.0
    server_min_clients_s: float = 15.0
    stt_s: float = 80.0  # the STT loaded beside the engine, compiled, its ticks
    int8_s: float = 120.0  # reload with int8 weights, compile, ticks, the agreement run
    graphs_off_s: float = 20.0  # eager ticks at batch 1: nothing to compile


@dataclass
class Measurement:
    """One batch size's ticks: the p99 tick in ms, or why there is none (``error``: "out of memory", ...)."""

    batch: int
    p99_ms: float | None
    p50_ms: float | None = None
    error: str | None = None

    @property
    def under(self) -> bool:
        return self.error is None and self.p99_ms is not None and self.p99_ms < TARGET_MS


class CeilingSearch:
    """The largest batch up to ``plan_max`` whose p99 tick is under the target, in few measurements.

    ``plan_max`` first (it is the answer if it is under); then a guess on the straight line through
    the measured points around the target (proportional to the first when only one is known), kept
    strictly inside the bracket (best under, smallest over); an error (out of memory) counts as over
    without a time, and the next guess halves the bracket."""

    def __init__(self, plan_max: int, target_ms: float = TARGET_MS) -> None:
        self.plan_max = max(1, plan_max)
        self.target = target_ms
        self.measured: dict[int, Measurement] = {}

    @property
    def lo(self) -> int:
        """The largest batch measured under the target (0: none yet)."""
        return max((b for b, m in self.measured.items() if m.under), default=0)

    @property
    def hi(self) -> int:
        """The smallest batch measured over the target (or failing); plan_max + 1 when none."""
        return min((b for b, m in self.measured.items() if not m.under), default=self.plan_max + 1)

    @property
    def done(self) -> bool:
        return self.hi <= self.lo + 1

    def record(self, m: Measurement) -> None:
        self.measured[m.batch] = m

    def next_batch(self) -> int | None:
        if not self.measured:
            return self.plan_max
        if self.done:
            return None
        lo, hi = self.lo, self.hi
        timed = sorted((b, m.p99_ms) for b, m in self.measured.items() if m.error is None and m.p99_ms is not None)
        guess: float | None = None
        over = [(b, t) for b, t in timed if t >= self.target]
        under = [(b, t) for b, t in timed if t < self.target]
        if under and over:  # the line through the two points closest to the target on either side
            (b0, t0), (b1, t1) = under[-1], over[0]
            guess = b0 + (self.target - t0) * (b1 - b0) / (t1 - t0) if t1 > t0 else None
        elif len(timed) >= 2:  # two points on one side: extrapolate their line
            (b0, t0), (b1, t1) = timed[-2:] if not under else timed[:2]
            slope = (t1 - t0) / (b1 - b0) if b1 != b0 else 0.0
            guess = b0 + (self.target - t0) / slope if slope > 0 else None
        elif len(timed) == 1:  # one point: ticks proportional to the batch (over-guesses when a tick has a fixed part)
            b0, t0 = timed[0]
            guess = b0 * self.target / t0 if t0 > 0 else None
        if guess is None or not math.isfinite(guess):
            guess = (lo + hi) / 2
        n = int(math.floor(guess))
        if n <= lo:
            n = lo + 1
        if n >= hi:
            n = hi - 1
        return max(1, n)

    def result(self) -> dict[str, Any]:
        return {
            "plan_max": self.plan_max,
            "largest_batch_under_80ms": self.lo,
            "bracket": [self.lo, self.hi if self.hi <= self.plan_max else None],
            "exact": self.done,
            "measured": [self.measured[b].batch for b in self.measured],
        }


class Ops(Protocol):
    """What the check does; the real one drives a worker process and a server, a test fakes the timings."""

    def load(self) -> int:
        """Write (if needed) and load the checkpoint; returns the memory plan's largest batch (0: failed)."""

    def measure(self, batch: int) -> Measurement: ...

    def server(self, batch: int, clients_s: float, deadline: float) -> dict[str, Any]: ...

    def stt(self, batch: int) -> dict[str, Any]: ...

    def int8(self, batch: int) -> dict[str, Any] | None:
        """None: this build has no ``frontend.weights`` (the stage is skipped with a note); an ``int8_available``
        attribute False says so before the schedule reserves time for it."""

    def graphs_off(self, batch: int) -> dict[str, Any]: ...

    def close_worker(self) -> None: ...


@dataclass
class Schedule:
    """The run: stages in order under ``budget_s``, each allowed only if the higher-priority rest still fits."""

    budget_s: float
    costs: Costs = field(default_factory=Costs)
    clock: Callable[[], float] = time.monotonic
    server_clients_s: float = 60.0
    notes: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.t0 = self.clock()
        self.deadline = self.t0 + self.budget_s

    def left(self) -> float:
        return self.deadline - self.clock()

    def _server_min(self) -> float:
        return self.costs.server_start_s + self.costs.server_min_clients_s + self.costs.server_stop_s

    def _minimum(self, stage: str) -> float:
        return {"server": self._server_min(), "stt": self.costs.stt_s, "int8": self.costs.int8_s,
                "graphs_off": self.costs.graphs_off_s, "search": self.costs.new_batch_s}.get(stage, 0.0)

    def allowed(self, stage: str, cost: float, *, before: tuple[str, ...] = ()) -> bool:
        """``stage`` may run now for ``cost`` s if the higher-priority stages in ``before`` (still to run)
        keep their minimum afterwards; otherwise it is dropped with a note."""
        reserve = sum(self._minimum(s) for s in before if STAGES.index(s) < STAGES.index(stage))
        if self.left() - cost >= reserve:
            return True
        self.notes.append(f"{stage}: dropped, {self.left():.0f} s left, needs {cost:.0f} s"
                          + (f" + {reserve:.0f} s kept for {', '.join(b for b in before if STAGES.index(b) < STAGES.index(stage))}"
                             if reserve else ""))
        return False

    def _timed(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        t = self.clock()
        out = fn()
        return out, self.clock() - t

    def run(self, ops: Ops) -> dict[str, Any]:
        """Every stage that fits; returns the result (also kept in :attr:`result` as it grows)."""
        r = self.result
        r.update(stages_run=[], drop_order=list(DROP_ORDER), notes=self.notes)
        plan_max, took = self._timed(ops.load)
        r["load_s"] = round(took, 1)
        if plan_max <= 0:
            self.notes.append("load: failed, nothing measured")
            r.update(CeilingSearch(1).result(), largest_batch_under_80ms=0)
            return r
        r["stages_run"].append("load")
        search = CeilingSearch(plan_max)
        r["batches"] = []
        batch = search.next_batch()
        assert batch is not None
        m, took = self._timed(lambda: ops.measure(batch))  # the ceiling: never dropped
        search.record(m)
        r["batches"].append(m.__dict__ | {"wall_s": round(took, 1)})
        r["stages_run"].append("ceiling")
        self.costs.new_batch_s = max(took, 1.0)
        later = ("server",)
        while (batch := search.next_batch()) is not None:
            if not self.allowed("search", self.costs.new_batch_s, before=later):
                break
            m, took = self._timed(lambda b=batch: ops.measure(b))
            search.record(m)
            r["batches"].append(m.__dict__ | {"wall_s": round(took, 1)})
            self.costs.new_batch_s = max(self.costs.new_batch_s, took) if m.error else took
            if "search" not in r["stages_run"]:
                r["stages_run"].append("search")
        r.update(search.result())
        best = max(1, search.lo)
        int8_ok = bool(getattr(ops, "int8_available", True))
        if not int8_ok:
            self.notes.append("int8: skipped, this build has no frontend.weights (issue 62's int8 path)")
        # graphs off before int8 (the worker then holds int8 weights), each keeping time for what outranks it
        worker_stages = [("stt", self.costs.stt_s, ops.stt), ("graphs_off", self.costs.graphs_off_s, ops.graphs_off)]
        if int8_ok:
            worker_stages.append(("int8", self.costs.int8_s, ops.int8))
        for i, (stage, cost, fn) in enumerate(worker_stages):
            pending = ("server", *(later for later, _, _ in worker_stages[i + 1:]))
            if not self.allowed(stage, cost, before=pending):
                continue
            out, took = self._timed(lambda f=fn, b=(1 if stage == "graphs_off" else best): f(b))
            if out is None:
                self.notes.append(f"{stage}: skipped, this build has no frontend.weights (issue 62's int8 path)")
                continue
            r[stage] = out
            r["stages_run"].append(stage)
        ops.close_worker()
        room = self.left() - self.costs.server_start_s - self.costs.server_stop_s
        clients = min(self.server_clients_s, room)
        if clients >= self.costs.server_min_clients_s:
            r["server"], _ = self._timed(lambda: ops.server(best, clients, self.deadline))
            r["stages_run"].append("server")
        else:
            self.notes.append(f"server: dropped, {self.left():.0f} s left, needs {self._server_min():.0f} s")
        r["elapsed_s"] = round(self.clock() - self.t0, 1)
        return r
