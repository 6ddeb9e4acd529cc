"""The pytest-xdist scheduling of the test command: units by shared server, and the ``alone`` tests first
on one worker while every other process of the run yields the CPU to them.

Units come from ``tests.support.scheduling.scope_of_tests``: every test asking for one shared server
(transitively) is one unit, so the server starts once per run; other tests are a unit per file.

A test marked ``alone`` asserts timing under a load it makes itself, which another worker's load at
the same priority would blur. Waiting for the other workers to finish first would leave most of the
machine idle for the minute those tests take (they are real time, a quarter of the two cores), so:

- the *runner* (worker ``gw0``) gets the ``alone:`` units first, then the units of the shared servers
  they ask for (that server starts once, on the runner); the other workers take the rest of the queue
  from the start, as in xdist's ``LoadScopeScheduling``;
- every other worker runs at the lowest CPU priority (``nice`` 19, inherited by the servers and
  browsers it starts), so the kernel gives the alone tests the CPU whenever they want it
  (``lower_priority``, from conftest.py's ``pytest_configure``);
- once its last alone test is done, the runner lowers itself and its children to the same priority
  (``AloneTests.after``), so that from then on every worker shares the CPU as equals.

Lowering a priority needs no privilege; raising one back would, so the order is what it is. A run of
one process (``-n 0``) runs the tests in collection order, at the priority it was given.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

from tests.support.scheduling import ALONE_PREFIX

#: The worker that runs the alone tests.
RUNNER = "gw0"
#: The priority of everything else while they run, and of everything after.
LOW_PRIORITY = 19


class AloneFirstScheduling(LoadScopeScheduling):
    """``LoadScopeScheduling`` by ``scope``; the ``alone:`` units and their servers' units go to ``RUNNER`` first."""

    def __init__(self, config: pytest.Config, log: Any, scope: Callable[[str], str]) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep the collection's order: the slowest files first (conftest.py)
        self._scope = scope
        self._reserved: list[str] = []  # the runner's units, in order: alone ones, then their servers'
        self._runner: WorkerController | None = None

    def _split_scope(self, nodeid: str) -> str:
        return self._scope(nodeid)

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed and self._check_nodes_have_same_collection():
            scopes = dict.fromkeys(self._scope(n) for n in next(iter(self.registered_collections.values())))
            alone = [s for s in scopes if s.startswith(ALONE_PREFIX)]
            servers = {s[len(ALONE_PREFIX):] for s in alone} & {s for s in scopes if s.startswith("servers:")}
            self._reserved = alone + [s for s in scopes if s in servers]
        super().schedule()

    def _assign_work_unit(self, node: WorkerController) -> None:
        if node is self._runner and self._pending_of(self.assigned_work[node]) > 2:
            return  # xdist's first round: the runner has its reserved units; it asks again when they run low
        if self._reserved:
            runner = self._runner = next((n for n in self.nodes if n.gateway.id == RUNNER), self.nodes[0])
            reserved, self._reserved = self._reserved, []
            for scope in reversed(reserved):  # to the front of the queue, in order
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            for scope in reserved:
                if scope in self.workqueue:
                    super()._assign_work_unit(runner)
            if node is runner:
                return
        if self.workqueue:  # the runner took the last units: nothing left for this worker's first round
            super()._assign_work_unit(node)


def lower_priority() -> None:
    """This process and what it starts from now on: the lowest CPU priority."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current < LOW_PRIORITY:
        os.nice(LOW_PRIORITY - current)


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc), so that servers started by the runner follow it."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        found += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return found


class AloneTests:
    """The runner's side: after its last alone test, lower itself and its children to ``LOW_PRIORITY``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def after(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if item.get_closest_marker(self.marker) is None:
            return
        if nextitem is not None and nextitem.get_closest_marker(self.marker) is not None:
            return
        for pid in _children(os.getpid()):
            try:
                os.setpriority(os.PRIO_PROCESS, pid, max(LOW_PRIORITY, os.getpriority(os.PRIO_PROCESS, pid)))
            except OSError:  # it ended meanwhile
                pass
        lower_priority()
