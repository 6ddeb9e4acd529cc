"""The server's CPU per thread group (server/telemetry/threads.py): names, /proc reading, the metric."""

from __future__ import annotations

import threading
import time

from kame.server.telemetry.metrics import ServerMetrics
from kame.server.telemetry.threads import thread_cpu_seconds, thread_group


def test_thread_groups_are_bounded_names() -> None:
    assert thread_group("MainThread") == "event_loop"
    assert thread_group("kame-engine") == "kame-engine"
    assert thread_group("kame-opus") == "kame-opus"
    assert thread_group("kame-rec-3f2a9c01") == "kame-rec"
    assert thread_group("asyncio_7") == "asyncio"
    assert thread_group("ThreadPoolExecutor-0_12") == "ThreadPoolExecutor"
    assert thread_group("Thread-4 (serve)") == "Thread"


def _burn(seconds: float, burned: threading.Event, release: threading.Event) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    burned.set()
    release.wait(10)  # alive, so that /proc still lists it when read


def test_a_named_thread_cpu_is_counted_in_its_group_and_exported() -> None:
    """Read while the thread is alive and done burning (no race with its end: a polling loop once read
    nothing in about half its runs)."""
    before = thread_cpu_seconds().get("kame-burner", 0.0)
    burned, release = threading.Event(), threading.Event()
    t = threading.Thread(target=_burn, args=(0.3, burned, release), name="kame-burner-1")
    t.start()
    try:
        assert burned.wait(30)
        during = thread_cpu_seconds().get("kame-burner", 0.0)
    finally:
        release.set()
        t.join()
    assert during - before >= 0.25, (before, during)
    assert "event_loop" in thread_cpu_seconds()  # the main thread
    body = ServerMetrics().render().decode()
    assert 'kame_thread_cpu_seconds_total{thread="event_loop"}' in body


def test_server_load_gives_cpu_per_realtime_session_from_two_scrapes() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from server_load import cpu_per_session

    before = 'kame_thread_cpu_seconds_total{thread="event_loop"} 10.0\nkame_thread_cpu_seconds_total{thread="kame-engine"} 5.0\n'
    after = ('kame_thread_cpu_seconds_total{thread="event_loop"} 10.6\nkame_thread_cpu_seconds_total{thread="kame-engine"} 8.0\n'
             'kame_thread_cpu_seconds_total{thread="kame-opus"} 0.3\n')
    # 8 sessions received 60 s of audio in all: 0.6 s of event loop = 1 % of a core per real-time session
    got = cpu_per_session(before, after, 60.0)
    assert set(got) == {"event_loop", "kame-engine", "kame-opus"}
    assert abs(got["event_loop"] - 1.0) < 1e-9 and abs(got["kame-engine"] - 5.0) < 1e-9 and abs(got["kame-opus"] - 0.5) < 1e-9
