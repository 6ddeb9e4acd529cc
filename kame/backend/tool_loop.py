"""The tool loop: one LLM request that may call functions, round after round.

:func:`run_rounds` is kame's one loop: :meth:`ToolLoop.run` drives it with the registry's stream and a
:class:`ToolExecutor` (the oracle, client functions of the Realtime and Live wires), and the Responses
delegation (:mod:`kame.session.responses.rounds`) with its own :class:`RoundPlan`. Calls run
concurrently with a per-call timeout, for at most ``max_rounds`` rounds (then ``tool_choice: none``).
Every failed call becomes a result the LLM reads; the loop fails only when the LLM request does
(``BackendError``). It knows nothing of the oracle, the session or any wire: callers consume
:class:`TextDelta`, :class:`CallsRequested`, :class:`CallFinished` and :class:`LoopDone`.
Closing the iterator closes the HTTP stream; whether a running call is then cancelled is the
executor's business (:mod:`kame.backend.speculation` keeps shared and side-effecting calls alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kame.backend.tools import (
    ToolCall,
    ToolCallAssembler,
    ToolResult,
    ToolSpec,
    cap_output,
    failed,
    refused,
    round_messages,
    timed_out,
)

if TYPE_CHECKING:
    from kame.backend.registry import BackendRegistry

log = logging.getLogger(__name__)


class ToolExecutor(Protocol):
    """Runs one call. May raise (the loop reports the error to the LLM); need not time out itself."""

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult: ...


@dataclass(frozen=True)
class ToolLoopLimits:
    """Bounds of one loop run."""

    max_rounds: int = 3  #: tool rounds; the request after the last one may not call tools
    call_timeout_s: float = 5.0  #: the loop stops waiting for a call after this long
    max_output_chars: int | None = 4000  #: longer outputs are cut before they reach the LLM


@dataclass(frozen=True)
class TextDelta:
    text: str
    round: int
    after_tools: bool


@dataclass(frozen=True)
class CallsRequested:
    round: int
    calls: tuple[ToolCall, ...]
    text: str  #: what the LLM said in this round before calling


@dataclass(frozen=True)
class CallFinished:
    round: int
    call: ToolCall
    result: ToolResult
    duration_s: float  #: how long this loop waited for it (0 for a result that was ready)


@dataclass(frozen=True)
class LoopDone:
    text: str  #: the final round's text
    rounds: int  #: tool rounds taken
    after_tools: bool
    messages: tuple[Mapping[str, Any], ...] = field(default=())  #: the whole history, tool rounds included
    unrun: tuple[ToolCall, ...] = ()  #: calls the last round made that nobody ran (see :meth:`RoundPlan.finish`)


LoopEvent = TextDelta | CallsRequested | CallFinished | LoopDone


@dataclass(frozen=True)
class PriorCall:
    """A call issued by an earlier request of the same turn whose result this run must deliver."""

    call: ToolCall
    result: Awaitable[ToolResult]
    text: str = ""


class RoundPlan:
    """How one loop run asks, resolves and records its rounds: the hooks of :func:`run_rounds`.

    The loop itself (round after round, the last one without tools, text
    streamed out as it comes, calls assembled, events in order) is the same
    for every caller; what differs is where a round's request goes, who runs
    its calls and what the history is. Each default is the plain loop's
    (:meth:`ToolLoop.run`), else nothing (a plan without ``request`` asks
    nothing and its loop ends at once).
    """

    def request(self, round_no: int, last: bool) -> AsyncGenerator[Any, None]:
        """Stream round ``round_no``: text (``str``), call deltas, and items for :meth:`note`.

        ``last``: the request after the last tool round (the LLM must answer).
        Closing the generator must close the back-end's stream.
        """
        return _nothing()

    def assembler(self, round_no: int) -> ToolCallAssembler:
        """Joins the round's call deltas (ids the LLM did not give are ``call_r<round>_<n>``)."""
        return ToolCallAssembler(id_prefix=f"call_r{round_no}")

    def note(self, round_no: int, item: Any) -> bool:
        """An item of the stream that is not text: True if it was the plan's (else it is a call delta)."""
        return False

    def go_on(self, round_no: int, calls: Sequence[ToolCall]) -> bool:
        """Whether a round that called tools (not the last) gets its calls run and a next round."""
        return True

    def resolve(self, round_no: int, calls: Sequence[ToolCall]) -> AsyncIterator[CallFinished]:
        """Run the round's calls; yield each result as it is ready (default: none is run)."""
        return _nothing()

    async def record(
        self, round_no: int, calls: Sequence[ToolCall], finished: Sequence[CallFinished], text: str
    ) -> bool:
        """The round boundary: put the round into the history; True if results are now in it."""
        return True

    def finish(self, round_no: int, text: str, calls: Sequence[ToolCall]) -> tuple[Mapping[str, Any], ...]:
        """The last round ended (``calls``: those it made but nobody runs); the whole history."""
        return ()


async def run_rounds(plan: RoundPlan, max_rounds: int, *, after_tools: bool = False) -> AsyncGenerator[LoopEvent, None]:
    """The one tool loop: rounds of ``plan`` until one makes no calls, ``max_rounds`` tool rounds at most.

    ``after_tools``: results are in the history before the first round
    (calls of an earlier request). Events as in the module doc; the
    :class:`LoopDone` of a round whose calls were not run carries them.
    """
    rounds = 0
    while True:
        last = rounds >= max_rounds
        items = plan.request(rounds, last)
        assembler = plan.assembler(rounds)
        text = ""
        async with contextlib.aclosing(items):
            async for item in items:
                if isinstance(item, str):
                    if item:
                        text += item
                        yield TextDelta(item, rounds, after_tools)
                elif not plan.note(rounds, item):
                    assembler.add(item)
        calls = tuple(assembler.calls())
        if not calls or last or not plan.go_on(rounds, calls):
            yield LoopDone(text, rounds, after_tools, plan.finish(rounds, text, calls), calls)
            return
        yield CallsRequested(rounds, calls, text)
        finished: list[CallFinished] = []
        async for done in plan.resolve(rounds, calls):
            finished.append(done)
            yield done
        after_tools = await plan.record(rounds, calls, finished, text) or after_tools
        rounds += 1


async def _nothing() -> AsyncGenerator[Any, None]:
    """An empty stream: the no-op default of the plan's streaming hooks."""
    return
    yield  # pragma: no cover - makes this an async generator


class ToolLoop:
    """Runs tool loops on the back-ends of one registry."""

    def __init__(
        self,
        registry: BackendRegistry,
        limits: ToolLoopLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.limits = limits or ToolLoopLimits()
        self.clock = clock

    async def run(
        self,
        backend: str | None,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        executor: ToolExecutor,
        *,
        tool_choice: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        prior: Sequence[PriorCall] = (),
        limits: ToolLoopLimits | None = None,
    ) -> AsyncGenerator[LoopEvent, None]:
        """Stream the events of one request (see the module doc).

        ``tools`` may be empty (then nothing is offered and no call is
        accepted). ``prior`` calls are awaited first and put into the
        history as a tool round, so their results reach this request's LLM.
        """
        lim = limits or self.limits
        plan = _RegistryRounds(self, backend, list(messages), tools, executor, tool_choice, max_tokens, temperature, lim)
        after_tools = False
        if prior:
            calls = tuple(p.call for p in prior)
            results: list[ToolResult] = []
            for p in prior:
                started = self.clock()
                result = await _await_result(p.call, p.result, lim)
                results.append(result)
                yield CallFinished(0, p.call, result, self.clock() - started)
            plan.history.extend(round_messages(calls, results, "".join(p.text for p in prior)))
            after_tools = True
        async with contextlib.aclosing(run_rounds(plan, lim.max_rounds, after_tools=after_tools)) as events:
            async for event in events:
                yield event


class _RegistryRounds(RoundPlan):
    """The plain loop's rounds: the registry's stream, calls run by an executor, OpenAI messages as history."""

    def __init__(
        self,
        loop: ToolLoop,
        backend: str | None,
        history: list[Any],
        tools: Sequence[ToolSpec],
        executor: ToolExecutor,
        tool_choice: str | None,
        max_tokens: int | None,
        temperature: float | None,
        limits: ToolLoopLimits,
    ) -> None:
        self.loop = loop
        self.backend = backend
        self.history = history
        self.tools = tools
        self.specs = {t.name: t for t in tools}
        self.executor = executor
        self.tool_choice = tool_choice
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.limits = limits

    def request(self, round_no: int, last: bool) -> AsyncGenerator[Any, None]:
        choice = "none" if last and self.tools else self.tool_choice
        return _opened(
            self.loop.registry.stream_turn(
                self.backend,
                self.history,
                tools=list(self.tools) or None,
                tool_choice=choice,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
        )

    def resolve(self, round_no: int, calls: Sequence[ToolCall]) -> AsyncIterator[CallFinished]:
        return self._run_calls(round_no, calls)

    async def record(
        self, round_no: int, calls: Sequence[ToolCall], finished: Sequence[CallFinished], text: str
    ) -> bool:
        results_by_id = {f.call.id: f.result for f in finished}
        self.history.extend(round_messages(calls, [results_by_id[c.id] for c in calls], text))
        return True

    def finish(self, round_no: int, text: str, calls: Sequence[ToolCall]) -> tuple[Mapping[str, Any], ...]:
        if calls:
            log.warning("tool loop: the LLM still called %d tools after the last round", len(calls))
        self.history.append({"role": "assistant", "content": text})
        return tuple(_plain(m) for m in self.history)

    async def _run_calls(self, round_no: int, calls: Sequence[ToolCall]) -> AsyncIterator[CallFinished]:
        """Run the calls of one round concurrently; yield each result as it is ready."""
        clock, lim = self.loop.clock, self.limits
        started = clock()
        ready: list[CallFinished] = []
        tasks: dict[asyncio.Task[ToolResult], ToolCall] = {}
        for call in calls:
            early = _precheck(call, self.specs)
            if early is not None:
                ready.append(CallFinished(round_no, call, early, 0.0))
                continue
            aw = _guarded(self.executor, call, self.specs[call.name])
            task = asyncio.get_running_loop().create_task(_await_result(call, aw, lim), name=f"kame-tool-{call.name}")
            tasks[task] = call
        for item in ready:
            yield item
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    yield CallFinished(round_no, tasks[task], task.result(), clock() - started)
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()


async def _opened(stream: Any) -> AsyncGenerator[Any, None]:
    """A registry stream (an async context manager) as a plain iterator that closes it."""
    async with stream:
        async for item in stream:
            yield item


async def _await_result(call: ToolCall, aw: Awaitable[ToolResult], lim: ToolLoopLimits) -> ToolResult:
    try:
        result = await asyncio.wait_for(aw, lim.call_timeout_s)
    except asyncio.TimeoutError:
        return timed_out(call, lim.call_timeout_s)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken tool is reported to the LLM, not raised
        return failed(call, _describe(exc))
    if not isinstance(result, ToolResult):
        return failed(call, "the tool returned no result")
    result = result.for_call(call.id)
    if result.ok:
        result = ToolResult(result.call_id, result.name, "ok", cap_output(result.output, lim.max_output_chars))
    return result


def _precheck(call: ToolCall, specs: Mapping[str, ToolSpec]) -> ToolResult | None:
    """A result without running anything: unknown/unoffered tool, or arguments that are not an object."""
    if call.name not in specs:
        return refused(call, f"no tool named {call.name!r} is available now")
    try:
        call.parsed_arguments()
    except ValueError:
        return failed(call, "the arguments are not a JSON object")
    return None


async def _guarded(executor: ToolExecutor, call: ToolCall, spec: ToolSpec) -> ToolResult:
    return await executor.execute(call, spec)


def _describe(exc: BaseException) -> str:
    """A short error text for the LLM: the exception's type and message (tools are told to keep secrets out)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _plain(message: Any) -> Mapping[str, Any]:
    as_dict = getattr(message, "as_dict", None)
    return as_dict() if callable(as_dict) else message
