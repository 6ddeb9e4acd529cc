"""The pytest-xdist scheduler of the test command: units by shared server, two lanes (real-time and batch),
and the ``alone`` tests last, on one worker, once every other worker has finished.

Units come from ``tests.support.scheduling.scope_of_tests``: every test asking for one shared server
(transitively) is one unit, so the server starts once per run; other tests are a unit per file.

A test marked ``alone`` asserts timing under a load it makes itself, which another worker's load would
blur. Its unit (``alone:<unit>``) is held back from the queue. The worker that ran (or will run) the
held tests' own server group is their *runner*, so that their shared server is the one already started,
not a second process; without one, the first worker to run out of work. Once the queue is empty, the
other workers are shut down (they finish what they hold and exit); when the runner is the last worker
left, it gets the held units, one after another. Only this scheduler's part of the run differs from
xdist's ``LoadScopeScheduling``; a run of one process (``-n 0``) runs the tests in collection order.

Two lanes, because two cores cannot hold four real-time loads: one session of the CPU demo takes most of
a core (its engine's tick and Whisper), and four workers each driving a server made the sessions fall
behind the wall clock and the tests that check it fail, a different few each run. A *real-time* unit holds
a server or the wall clock (``tests.support.scheduling.is_realtime``: a shared server's group, an
``alone`` test, a test marked ``realtime``); it runs only on the first ``realtime_workers`` workers, at
the normal priority. The other workers run the *batch* units (CPU-bound, timing-free) at a lower one
(``nice``: tests/conftest.py), so they take what the real-time lane leaves; a batch worker never takes a
real-time unit (it would run it niced), a real-time worker takes batch units once its lane is empty.

Why a worker waits with one test: xdist runs a worker's last queued test only once it knows what comes
next (more tests, or shutdown), for the fixtures' teardown. So "done" below is "at most one pending".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

from tests.support.scheduling import ALONE_PREFIX, is_realtime, realtime_worker


class AloneLastScheduling(LoadScopeScheduling):
    """``LoadScopeScheduling`` by ``scope``, in two lanes, with the ``alone:`` units run last on one worker."""

    def __init__(self, config: pytest.Config, log: Any, scope: Callable[[str], str], realtime_workers: int = 0) -> None:
        super().__init__(config, log)
        self._scope = scope
        self.realtime_workers = realtime_workers  # 0: one lane, every worker takes every unit
        self._workers = 0  # the run's workers, counted once: the lanes do not change as workers end
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

    def _realtime(self, node: WorkerController) -> bool:
        self._workers = self._workers or len(self.nodes)
        return not self.realtime_workers or realtime_worker(node.gateway.id, self._workers, self.realtime_workers)

    def _next_for(self, node: WorkerController) -> str | None:
        """The first queued unit ``node`` may run: a real-time worker its lane's first, else a batch unit; a
        batch worker only batch units."""
        if not self.realtime_workers:
            return next(iter(self.workqueue), None)
        batch = next((s for s in self.workqueue if not is_realtime(s)), None)
        if not self._realtime(node):
            return batch
        return next((s for s in self.workqueue if is_realtime(s)), batch)

    def _assign_work_unit(self, node: WorkerController) -> None:
        scope = self._next_for(node)
        if scope is None:  # nothing in its lane: a batch worker once only real-time units are left
            return
        if scope in self._wanted and self.runner is None:
            self.runner = node
        self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def _lane_reschedule(self, node: WorkerController) -> None:
        """xdist's ``_reschedule`` by lane: a worker with nothing left in its lane shuts down."""
        if node.shutting_down:
            return
        if self._next_for(node) is None:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:
            return
        self._assign_work_unit(node)

    @property
    def tests_finished(self) -> bool:
        return not self.held and super().tests_finished

    @property
    def has_pending(self) -> bool:
        return bool(self.held) or super().has_pending

    def _reschedule(self, node: WorkerController) -> None:
        if not self.held or self.workqueue:
            self._lane_reschedule(node)
            return
        if node.shutting_down:
            return
        if not self._realtime(node):
            node.shutdown()  # the held units run on a real-time worker
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
                self.runner = next((n for n in self.assigned_work if self._realtime(n)), None)
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
