"""CPU time of the server process's threads, grouped by thread name (Linux ``/proc``).

What the host spends per session (event loop, engine thread, codec threads) decides how many
GPU sessions one host can feed; this measures it in the running server. Threads Python did not
start (torch's and CUDA's own, the OpenMP pool) have no Python name and count as ``other``.
Groups drop a trailing number (``kame-rec-12`` -> ``kame-rec``), so labels stay bounded.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

#: Python's main thread runs uvicorn's event loop in ``kame serve``.
GROUP_NAMES = {"MainThread": "event_loop"}
_TARGET = re.compile(r" \(.*\)$")
_SUFFIX = re.compile(r"[-_ ]?[0-9a-f]*[0-9][0-9a-f_-]*$")


def thread_group(name: str) -> str:
    """A bounded label for a thread name: the fixed names mapped, a trailing id or number dropped."""
    if name in GROUP_NAMES:
        return GROUP_NAMES[name]
    name = _TARGET.sub("", name)  # Python's default names: "Thread-3 (serve)"
    base = _SUFFIX.sub("", name) or name
    return GROUP_NAMES.get(base, base)


def _cpu_seconds(stat: str, ticks: int) -> float:
    """utime + stime of one ``/proc/.../stat`` line (fields counted after the command's closing paren)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def thread_cpu_seconds(task_dir: Path = Path("/proc/self/task")) -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process's threads, by :func:`thread_group`."""
    ticks = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out: dict[str, float] = {}
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return out
    for tid in tids:
        try:
            seconds = _cpu_seconds((task_dir / tid / "stat").read_text(), ticks)
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        group = thread_group(names[int(tid)]) if int(tid) in names else "other"
        out[group] = out.get(group, 0.0) + seconds
    return out


class ThreadCpuCollector(Collector):
    """``kame_thread_cpu_seconds_total{thread=...}``, read at each scrape."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "kame_thread_cpu_seconds", "CPU time of the server's threads by name (other: threads without a Python name).",
            labels=["thread"],
        )
        for group, seconds in sorted(thread_cpu_seconds().items()):
            family.add_metric([group], seconds)
        yield family
