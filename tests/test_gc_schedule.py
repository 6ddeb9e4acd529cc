"""The scheduled garbage collector: what it runs, when, and that it frees cycles holding big buffers."""

from __future__ import annotations

import asyncio
import gc
import weakref

from kame.server.app.gc_schedule import GarbageCollector


class Node:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.me = self  # a cycle: only the cycle collector frees it


def test_a_cycle_holding_a_large_message_is_freed_by_one_run() -> None:
    seen: list[tuple[float, int]] = []
    collector = GarbageCollector(10.0, ready=lambda: True, observe=lambda s, n: seen.append((s, n)))
    gc.disable()  # CPython's own schedule must not free it first
    try:
        node = Node(b"x" * (400 * 1024))
        alive = weakref.ref(node)
        del node
        assert alive() is not None
        took, found = collector.run_once()
    finally:
        gc.enable()
    assert alive() is None
    assert found >= 1 and took >= 0
    assert seen == [(took, found)] and collector.runs == 1


def test_runs_on_its_interval_and_only_once_ready() -> None:
    ready = {"value": False}
    calls: list[str] = []
    collector = GarbageCollector(0.02, ready=lambda: ready["value"], collect=lambda: calls.append("gc") or 0)

    async def main() -> None:
        task = asyncio.create_task(collector.run())
        await asyncio.sleep(0.15)
        assert calls == []  # models not loaded yet: a full collection would walk all of them
        ready["value"] = True
        await asyncio.sleep(0.15)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert 2 <= len(calls) <= 10
    assert collector.runs == len(calls)
