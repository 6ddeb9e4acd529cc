"""The pytest-xdist scheduler of the test command: units by shared server, and the ``alone`` tests last,
on one worker, once every other worker has finished.

Units come from ``tests.support.scheduling.scope_of_tests``: every test asking for one shared server
(transitively) is one unit, so the server starts once per run; other tests are a unit per file.

A test marked ``alone`` asserts timing under a load it makes itself, which another worker's load would
blur. Its unit (``alone:<unit>``) is held back from the queue. The worker that ran (or will run) the
held tests' own server group is their *runner*, so that their shared server is the one already started,
not a second process; without one, the first worker to run out of work. Once the queue is empty, the
other workers are shut down (they finish what they hold and exit); when the runner is the last worker
left, it gets the held units, one after another. Only this scheduler's part of the run differs from
xdist's ``LoadScopeScheduling``; a run of one process (``-n 0``) runs the tests in collection order.

Why a worker waits with one test: xdist runs a worker's last queued test only once it knows what comes
next (more tests, or shutdown), for the fixtures' teardown. So "done" below is "at most one pending".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

from tests.support.scheduling import ALONE_PREFIX


class AloneLastScheduling(LoadScopeScheduling):
    """``LoadScopeScheduling`` by ``scope``, with the ``alone:`` units run last on one worker."""

    def __init__(self, config: pytest.Config, log: Any, scope: Callable[[str], str]) -> None:
        super().__init__(config, log)
        self._scope = scope
        self.held: dict[str, dict[str, bool]] = {}
        self.runner: WorkerController | None = None
        self._wanted: set[str] = set()  # the server groups of the held units: their worker runs them

    def _split_scope(self, nodeid: str) -> str:
        return self._scope(nodeid)

    def schedule(self) -> None:
        """Queue the units (the held ones apart) and give every worker its first; later calls (a worker
        added) reschedule, as in xdist."""
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        for nodeid in self.collection:
            scope = self._scope(nodeid)
            queue = self.held if scope.startswith(ALONE_PREFIX) else self.workqueue
            queue.setdefault(scope, {})[nodeid] = False
        if not self.workqueue:  # only held tests selected: nothing to wait for
            self.workqueue.update(self.held)
            self.held.clear()
        self._wanted = {s[len(ALONE_PREFIX):] for s in self.held if s.startswith(ALONE_PREFIX + "servers:")}
        for _ in range(len(self.nodes) - max(1, len(self.workqueue))):  # more workers than units
            unused, _work = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            if self.workqueue:
                self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)

    def _assign_work_unit(self, node: WorkerController) -> None:
        if self.workqueue and next(iter(self.workqueue)) in self._wanted and self.runner is None:
            self.runner = node
        super()._assign_work_unit(node)

    @property
    def tests_finished(self) -> bool:
        return not self.held and super().tests_finished

    @property
    def has_pending(self) -> bool:
        return bool(self.held) or super().has_pending

    def _reschedule(self, node: WorkerController) -> None:
        if not self.held or self.workqueue:
            super()._reschedule(node)
            return
        if node.shutting_down:
            return
        if self.runner is None or self.runner not in self.assigned_work:
            self.runner = node
        if node is not self.runner:
            node.shutdown()  # it runs what it holds, then ends; remove_node() follows
            return
        self._release_if_alone()

    def remove_node(self, node: WorkerController) -> str | None:
        crashed = super().remove_node(node)
        if self.held and not self.workqueue:
            if self.runner is node or self.runner not in self.assigned_work:
                self.runner = next(iter(self.assigned_work), None)
            self._release_if_alone()
        return crashed

    def _release_if_alone(self) -> None:
        """Hand the held units to the runner once it is the only worker left and holds at most one test."""
        runner = self.runner
        if runner is None or list(self.assigned_work) != [runner] or self._pending_of(self.assigned_work[runner]) > 1:
            return
        held, self.held = self.held, {}
        for scope, unit in held.items():
            self.workqueue[scope] = unit
            super()._assign_work_unit(runner)
