"""The tool loop: one LLM request that may call functions, round after round.

:meth:`ToolLoop.run` sends the messages with the offered tools, streams the
LLM's text out at once (``TextDelta``), assembles the streamed
``tool_calls`` (:class:`~kame.backend.tools.ToolCallAssembler`), runs the
calls concurrently through a :class:`ToolExecutor` with a per-call timeout,
appends the assistant's calls and one ``tool`` message per result, and asks
again, for at most ``max_rounds`` tool rounds (the request after the last
round offers the tools with ``tool_choice: none`` so the LLM must answer).
Every failure of a call (exception, timeout, unknown or refused tool,
arguments that are not JSON) becomes a result the LLM reads: the loop
itself fails only when the LLM request does (``BackendError``).

It knows nothing of the oracle, the session or any wire: callers (the
oracle loop, the Realtime and Live wires, the Responses delegation) consume
its events:

* :class:`TextDelta` - text of round ``round``; ``after_tools`` is True once
  any call's result is in the history (an answer *built on tools*);
* :class:`CallsRequested` - a round ended with calls (and the text before them);
* :class:`CallFinished` - one call's result (and how long the caller waited);
* :class:`LoopDone` - the final text, the rounds taken and the whole history.

Closing the iterator (or cancelling its consumer) closes the HTTP stream and
stops waiting for calls; whether a running call is then cancelled is the
executor's business (:mod:`kame.backend.speculation` keeps shared and
side-effecting calls alive).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kame.backend.tools import (
    ToolCall,
    ToolCallAssembler,
    ToolCallDelta,
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


LoopEvent = TextDelta | CallsRequested | CallFinished | LoopDone


@dataclass(frozen=True)
class PriorCall:
    """A call issued by an earlier request of the same turn whose result this run must deliver."""

    call: ToolCall
    result: Awaitable[ToolResult]
    text: str = ""


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
        specs = {t.name: t for t in tools}
        history: list[Any] = list(messages)
        after_tools = False
        rounds = 0
        if prior:
            calls = tuple(p.call for p in prior)
            results: list[ToolResult] = []
            for p in prior:
                started = self.clock()
                result = await self._await_result(p.call, p.result, lim)
                results.append(result)
                yield CallFinished(0, p.call, result, self.clock() - started)
            history.extend(round_messages(calls, results, "".join(p.text for p in prior)))
            after_tools = True
        while True:
            last = rounds >= lim.max_rounds
            choice = "none" if last and tools else tool_choice
            stream = self.registry.stream_turn(
                backend,
                history,
                tools=list(tools) or None,
                tool_choice=choice,
                max_tokens=max_tokens,
                temperature=temperature,
            )
            assembler = ToolCallAssembler(id_prefix=f"call_r{rounds}")
            text = ""
            async with stream:
                async for item in stream:
                    if isinstance(item, ToolCallDelta):
                        assembler.add(item)
                    elif item:
                        text += item
                        yield TextDelta(item, rounds, after_tools)
            calls = tuple(assembler.calls())
            if not calls or last:
                if calls:
                    log.warning("tool loop: the LLM still called %d tools after the last round", len(calls))
                history.append({"role": "assistant", "content": text})
                yield LoopDone(text, rounds, after_tools, tuple(_plain(m) for m in history))
                return
            yield CallsRequested(rounds, calls, text)
            results_by_id: dict[str, ToolResult] = {}
            async for finished in self._run_calls(rounds, calls, specs, executor, lim):
                results_by_id[finished.call.id] = finished.result
                yield finished
            history.extend(round_messages(calls, [results_by_id[c.id] for c in calls], text))
            after_tools = True
            rounds += 1

    async def _run_calls(
        self,
        round_no: int,
        calls: Sequence[ToolCall],
        specs: Mapping[str, ToolSpec],
        executor: ToolExecutor,
        lim: ToolLoopLimits,
    ) -> AsyncIterator[CallFinished]:
        """Run the calls of one round concurrently; yield each result as it is ready."""
        started = self.clock()
        ready: list[CallFinished] = []
        tasks: dict[asyncio.Task[ToolResult], ToolCall] = {}
        for call in calls:
            early = _precheck(call, specs)
            if early is not None:
                ready.append(CallFinished(round_no, call, early, 0.0))
                continue
            aw = _guarded(executor, call, specs[call.name])
            task = asyncio.get_running_loop().create_task(
                self._await_result(call, aw, lim), name=f"kame-tool-{call.name}"
            )
            tasks[task] = call
        for item in ready:
            yield item
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    yield CallFinished(round_no, tasks[task], task.result(), self.clock() - started)
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()

    async def _await_result(self, call: ToolCall, aw: Awaitable[ToolResult], lim: ToolLoopLimits) -> ToolResult:
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
