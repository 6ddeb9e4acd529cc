"""Speculation without side effects: tool calls of requests that may be superseded.

KAME asks the LLM again every couple of words, so a request is often cancelled while a tool runs.
:class:`SpeculativeCalls` (one per session, owned by its oracle loop) makes that safe: a request on a
partial transcript is offered only read-only tools; read-only calls run in their own task, shared by
(name, arguments) and cached while fresh (``cache_ttl_s``; failures are not cached). A side-effecting
call is never cancelled (not even at the session's end) and never issued twice for the same (name,
arguments) in the turn or while its result has not reached an LLM; if its request was superseded,
:meth:`SpeculativeCalls.carry_over` hands it to the next request
(:class:`~kame.backend.tool_loop.PriorCall`). Every execution is bounded by ``call_timeout_s`` and
reported to the observer. Pure asyncio: the work is the inner :class:`ToolExecutor`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kame.backend.tool_loop import PriorCall, ToolExecutor
from kame.backend.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec, failed, refused, timed_out

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCallEvent:
    """A real execution started or finished (shared reuses are not executions)."""

    kind: Literal["started", "finished"]
    name: str
    call_id: str
    read_only: bool
    arguments: str
    outcome: ToolOutcome | None = None
    duration_s: float | None = None
    error: str | None = None  #: the result text of a failed call (already free of secrets)


ToolObserver = Callable[[ToolCallEvent], None]


@dataclass
class _Shared:
    task: asyncio.Task[ToolResult]
    started: float
    finished: float | None = None


@dataclass
class _Effect:
    call: ToolCall
    task: asyncio.Task[ToolResult]
    turn_id: int
    text: str = ""
    delivered: bool = False


@dataclass
class SpeculationStats:
    executions: int = 0  #: real calls started
    shared_hits: int = 0  #: read-only calls answered by a running or cached call
    effect_reuses: int = 0  #: side-effecting calls asked again and not re-issued
    refused: int = 0
    by_key: dict[tuple[str, str], int] = field(default_factory=dict)  #: real calls per (name, arguments)


class SpeculativeCalls:
    """One per session; see the module doc."""

    def __init__(
        self,
        inner: ToolExecutor,
        *,
        call_timeout_s: float = 5.0,
        cache_ttl_s: float = 30.0,
        max_cached: int = 64,
        observer: ToolObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.call_timeout_s = call_timeout_s
        self.cache_ttl_s = cache_ttl_s
        self.max_cached = max_cached
        self.observer = observer
        self.clock = clock
        self.stats = SpeculationStats()
        self._shared: dict[tuple[str, str], _Shared] = {}
        self._effects: dict[tuple[str, str], _Effect] = {}
        self.closed = False

    # ------------------------------------------------------------------ what a request may call

    @staticmethod
    def offered(tools: Sequence[ToolSpec], *, turn_ended: bool) -> list[ToolSpec]:
        """The tools a request may be offered: read-only ones only, until the user's turn has ended."""
        return [t for t in tools if turn_ended or t.read_only]

    def executor(self, *, turn_id: int, turn_ended: bool) -> RequestCalls:
        """The executor one request's tool loop uses."""
        return RequestCalls(self, turn_id, turn_ended)

    def carry_over(self) -> list[PriorCall]:
        """Side-effecting calls whose result has not reached an LLM yet, oldest first."""
        return [
            PriorCall(e.call, asyncio.shield(e.task), e.text) for e in self._effects.values() if not e.delivered
        ]

    def mark_delivered(self, calls: Sequence[ToolCall]) -> None:
        """These calls' results reached an LLM that answered: no later request needs them."""
        keys = {c.key for c in calls}
        for key, effect in self._effects.items():
            if key in keys or effect.call.id in {c.id for c in calls}:
                effect.delivered = True

    # ------------------------------------------------------------------ running

    def _execute_task(self, call: ToolCall, spec: ToolSpec) -> asyncio.Task[ToolResult]:
        self.stats.executions += 1
        self.stats.by_key[call.key] = self.stats.by_key.get(call.key, 0) + 1
        return asyncio.get_running_loop().create_task(self._execute(call, spec), name=f"kame-tool-{spec.name}")

    async def _execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        started = self.clock()
        self._notify(ToolCallEvent("started", call.name, call.id, spec.read_only, call.arguments))
        try:
            result = await asyncio.wait_for(self.inner.execute(call, spec), self.call_timeout_s)
            if not isinstance(result, ToolResult):
                result = failed(call, "the tool returned no result")
        except asyncio.TimeoutError:
            result = timed_out(call, self.call_timeout_s)
        except asyncio.CancelledError:
            result = failed(call, "cancelled (session ended)")
            self._finished(call, spec, result, started)
            raise
        except Exception as exc:  # noqa: BLE001 - a broken tool fails its call only
            text = str(exc).strip()
            result = failed(call, f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__)
        self._finished(call, spec, result, started)
        return result

    def _finished(self, call: ToolCall, spec: ToolSpec, result: ToolResult, started: float) -> None:
        shared = self._shared.get(call.key)
        if spec.read_only and shared is not None:
            shared.finished = self.clock()
            if not result.ok:  # never cache a failure: the next request tries again
                self._shared.pop(call.key, None)
        self._notify(
            ToolCallEvent(
                "finished", call.name, call.id, spec.read_only, call.arguments, result.outcome,
                self.clock() - started, None if result.ok else result.output,
            )
        )

    def _notify(self, event: ToolCallEvent) -> None:
        if self.observer is None:
            return
        try:
            self.observer(event)
        except Exception:  # an exporter bug must not fail a call
            log.exception("tool observer failed")

    def _shared_task(self, call: ToolCall, spec: ToolSpec) -> tuple[asyncio.Task[ToolResult], bool]:
        key = call.key
        entry = self._shared.get(key)
        now = self.clock()
        if entry is not None:
            fresh = entry.finished is None or now - entry.finished <= self.cache_ttl_s
            if fresh and not entry.task.cancelled():
                self.stats.shared_hits += 1
                return entry.task, True
            self._shared.pop(key, None)
        self._evict(now)
        task = self._execute_task(call, spec)
        self._shared[key] = _Shared(task, now)
        return task, False

    def _evict(self, now: float) -> None:
        stale = [k for k, e in self._shared.items() if e.finished is not None and now - e.finished > self.cache_ttl_s]
        for key in stale:
            del self._shared[key]
        while len(self._shared) >= self.max_cached:
            done = [k for k, e in self._shared.items() if e.finished is not None]
            if not done:
                break
            del self._shared[done[0]]

    def _effect_task(self, call: ToolCall, spec: ToolSpec, turn_id: int, text: str) -> tuple[_Effect, bool]:
        key = call.key
        effect = self._effects.get(key)
        if effect is not None and (not effect.delivered or effect.turn_id == turn_id):
            self.stats.effect_reuses += 1
            return effect, True
        effect = _Effect(call, self._execute_task(call, spec), turn_id, text)
        self._effects[key] = effect
        return effect, False

    async def aclose(self) -> None:
        """End of the session: read-only calls are cancelled; side-effecting ones run to their end
        (bounded by their timeout) in the background, so closing the session does not wait for them."""
        self.closed = True
        shared = [e.task for e in self._shared.values()]
        for task in shared:
            if not task.done():
                task.cancel()
        for effect in self._effects.values():
            if not effect.task.done():
                _BACKGROUND.add(effect.task)  # the loop keeps only weak references to tasks
                effect.task.add_done_callback(_BACKGROUND.discard)
        for task in shared:
            with contextlib.suppress(BaseException):
                await task


#: Side-effecting calls still running after their session closed (kept alive until they end).
_BACKGROUND: set[asyncio.Task[ToolResult]] = set()


class RequestCalls:
    """The :class:`ToolExecutor` of one request (see :meth:`SpeculativeCalls.executor`)."""

    def __init__(self, owner: SpeculativeCalls, turn_id: int, turn_ended: bool) -> None:
        self.owner = owner
        self.turn_id = turn_id
        self.turn_ended = turn_ended
        self.pre_call_text = ""  #: set by the caller: what the LLM said before calling (kept with effects)

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        owner = self.owner
        if owner.closed:
            return failed(call, "the session has ended")
        if spec.read_only:
            task, _ = owner._shared_task(call, spec)
        elif not self.turn_ended:
            owner.stats.refused += 1
            return refused(call, "this tool has side effects: it runs only after the user has finished speaking")
        else:
            effect, _ = owner._effect_task(call, spec, self.turn_id, self.pre_call_text)
            task = effect.task
        # shield: cancelling this request must not cancel a call others share or that must complete.
        result = await asyncio.shield(task)
        return result.for_call(call.id)
