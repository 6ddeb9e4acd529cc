"""Runs Responses delegations: back-end rounds, the client's function calls, and how they end.

One :class:`ResponsesDelegator` per Live session in Responses delegation. A round is one back-end
request streamed as one response (:class:`~kame.session.responses.stream.ResponseStream`); a round that
called functions ends ``completed``, and the client's ``function_call_output`` and ``response.create``
start the next; a round without calls ends the delegation. Delegations run one at a time, in order, on
the session's one conversation (:class:`~kame.session.responses.conversation.ConversationLog`), so a
later question sees earlier answers. Failures end the response, never the session: a back-end error
ends it ``failed``; an unanswered call (``function_timeout_s``) returns nothing; ``max_rounds`` caps
the rounds. The rounds run through :func:`~kame.backend.tool_loop.run_rounds`; nothing here touches
audio or the engine (:mod:`.source` joins it to the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kame.backend.speculation import ToolCallEvent
from kame.backend.tool_loop import CallFinished, LoopDone, RoundPlan, TextDelta, run_rounds
from kame.backend.tools import ToolCall, ToolCallAssembler, ToolOutcome
from kame.session.function_tools import MAX_OUTPUT_CHARS, FunctionTool, ToolErrors, function_output
from kame.session.responses.conversation import (
    BackendTurn,
    CallOutput,
    CallRecord,
    ClientMessage,
    ConversationLog,
    build_backend_messages,
)
from kame.session.responses.settings import ResponsesDelegationSettings, ResponsesError
from kame.session.responses.stream import (
    Event,
    IncompleteReason,
    ResponseStream,
    Usage,
    failure_code,
    incomplete_reason,
    new_id,
    response_event,
)

log = logging.getLogger(__name__)

DEFAULT_FUNCTION_TIMEOUT_S = 30.0
DEFAULT_MAX_ROUNDS = 4
DEFAULT_MAX_OUTPUT_CHARS = MAX_OUTPUT_CHARS  #: the one limit of every wire (kame.session.function_tools)
#: The Live API's names for a function output's faults.
OUTPUT_ERRORS = ToolErrors(lambda code, message, param: ResponsesError(code, message, param=param))


def loop_task(work: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
    """The default task factory of the answer source: a task of the running loop.

    A served session passes its pipeline's instead (its tasks end with the
    session); this one serves the unit tests that run a source without one.
    """
    return asyncio.get_running_loop().create_task(work, name=name)


@dataclass(frozen=True)
class ServerTool:
    """A tool kame runs itself (an operator-configured MCP server's), offered next to the client's functions."""

    name: str  #: the function name the back-end sees
    server_label: str
    tool: str  #: the tool's name on its server
    function: FunctionTool

    @property
    def key(self) -> str:
        """How ``tool_choice`` names it (:class:`~.settings.ToolChoiceSpec`)."""
        return f"mcp:{self.server_label}:{self.tool}"


class ServerTools(Protocol):
    """The session's server-side tools (bound to the MCP toolbox by :mod:`.backend`)."""

    async def offered(self, settings: ResponsesDelegationSettings) -> Sequence[ServerTool]: ...

    async def call(self, tool: ServerTool, call_id: str, arguments: str) -> tuple[bool, str]:
        """Run it: (ok, text). Never raises for a broken tool; the text is safe for clients."""
        ...


@dataclass(frozen=True)
class RoundEnd:
    """Optional last item of a round source: why the back-end stopped, and its token usage."""

    finish_reason: str | None = None
    usage: Usage | None = None
    notice: str | None = None  #: something the client should know (an ``info`` ``kame.backend_notice``)
    tools_notice: str | None = None  #: the back-end refused function tools (an ``info`` ``kame.tools_refused``)


@dataclass(frozen=True)
class RoundRequest:
    """One back-end request of a delegation."""

    messages: list[dict[str, Any]]
    functions: tuple[FunctionTool, ...]  #: offered (empty on the last round: the back-end must answer)
    tool_choice: str | None  #: ``auto`` / ``none`` / ``required`` or one function's name
    max_tokens: int | None
    backend: str
    model: str | None


#: Streams one round: text chunks (``str``), :class:`~kame.backend.tools.ToolCallDelta` items, optionally a final :class:`RoundEnd`.
RoundSource = Callable[[RoundRequest], AsyncIterator[Any]]


@dataclass(frozen=True)
class TextOut:
    """Back-end text for the oracle: ``after_tools`` once a function's result is in the conversation."""

    delegation_id: str
    round: int
    delta: str
    after_tools: bool


@dataclass(frozen=True)
class RoundText:
    """The whole text of a round that ended (completed or cut short): one oracle answer.

    "Let me check" before a call and the answer built on its result are
    separate rounds, so each becomes its own oracle sequence.
    """

    delegation_id: str
    round: int
    text: str
    after_tools: bool


@dataclass(frozen=True)
class DelegationDone:
    """How a delegation ended."""

    delegation_id: str
    status: Literal["completed", "incomplete", "failed", "cancelled"]
    text: str  #: the last round's text (the answer)
    rounds: int
    usage: Usage | None


@dataclass(frozen=True)
class PromptOptions:
    max_words: int = 30
    language: str = "English"
    max_chars: int | None = 16_000


@dataclass
class _Waiting:
    """A round that ended with calls, waiting for the client's outputs and ``response.create``."""

    delegation_id: str
    calls: dict[str, str]  # call_id -> name
    answered: set[str] = field(default_factory=set)
    resume: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def missing(self) -> list[str]:
        return [c for c in self.calls if c not in self.answered]


class ResponsesDelegator:
    """The delegations of one session (single owner: the session's event loop)."""

    def __init__(
        self,
        *,
        settings: Callable[[], ResponsesDelegationSettings],
        source: RoundSource,
        send: Callable[[Event], None],
        on_text: Callable[[TextOut], None] = lambda _out: None,
        on_round_text: Callable[[RoundText], None] = lambda _out: None,
        on_done: Callable[[DelegationDone], None] = lambda _done: None,
        conversation: ConversationLog | None = None,
        prompt: PromptOptions | None = None,
        function_timeout_s: float = DEFAULT_FUNCTION_TIMEOUT_S,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        ids: Callable[[str], str] = new_id,
        clock: Callable[[], float] = time.time,
        spawn: Callable[[Coroutine[Any, Any, DelegationDone]], asyncio.Task[DelegationDone]] | None = None,
        server_tools: ServerTools | None = None,
        on_tool_call: Callable[[ToolCallEvent, str], None] | None = None,
    ) -> None:
        """``spawn`` runs a delegation's coroutine (the session's task factory; default: a loop task)."""
        if max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        self._settings = settings
        self._source = source
        self._send = send
        self._on_text = on_text
        self._on_round_text = on_round_text
        self._on_done = on_done
        self.conversation = conversation if conversation is not None else ConversationLog()
        self._prompt = prompt or PromptOptions()
        self.function_timeout_s = function_timeout_s
        self.max_rounds = max_rounds
        self.max_output_chars = max_output_chars
        self._ids = ids
        self._clock = clock
        self._spawn = spawn
        self._server_tools = server_tools
        self._on_tool_call = on_tool_call  # (event, metrics label): client_function or the MCP tool's name
        self._issued: dict[str, float] = {}  # client calls shown in the streaming round -> when (monotonic)
        self._early: dict[str, str] = {}  # their outputs that came before the round ended
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[DelegationDone]] = set()
        self._waiting: _Waiting | None = None
        self._running: str | None = None  # the delegation whose round is streaming
        self._expired: set[str] = set()  # calls kame stopped waiting for

    # ------------------------------------------------------------------ delegations

    def new_ids(self) -> tuple[str, str]:
        """A delegation id and its first response's id (``session.delegation.created`` carries both)."""
        return self._ids("dlg"), self._ids("resp")

    def start(self, delegation_id: str, response_id: str) -> asyncio.Task[DelegationDone]:
        """Run a delegation after those already queued (the wire sent its ``delegation.created``)."""
        coro = self._serialized(delegation_id, response_id)
        task: asyncio.Task[DelegationDone]
        if self._spawn is not None:
            task = self._spawn(coro)
        else:
            task = loop_task(coro, f"kame-responses-{delegation_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def busy(self) -> bool:
        """A delegation is running or queued."""
        return bool(self._tasks)

    async def aclose(self) -> None:
        """Cancel every delegation (session end); nothing more is sent."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ------------------------------------------------------------------ client commands

    def item_create(self, item: object) -> None:
        """``response.item.create``: a function's output, or a message for the back-end's conversation."""
        if not isinstance(item, Mapping):
            raise ResponsesError("invalid_type", "item must be an object", param="item")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "function_call_output":
            self._function_output(item)
        elif kind == "message":
            self.conversation.add(_client_message(item))
        else:
            raise ResponsesError(
                "invalid_value",
                f"item.type {kind!r}: kame's back-end conversation takes function_call_output and message items",
                param="item.type",
            )

    def response_create(self) -> Literal["resumed", "new"]:
        """``response.create``: continue the round waiting for outputs, or ask for a new delegation.

        ``new``: nothing waits; the wire creates a delegation (its
        ``session.delegation.created``) and calls :meth:`start`.
        """
        waiting = self._waiting
        if waiting is not None:
            if waiting.missing:
                raise ResponsesError(
                    "function_call_outputs_required",
                    f"response.create: waiting for function_call_output of {', '.join(waiting.missing)}",
                )
            waiting.resume = True
            waiting.wake.set()
            return "resumed"
        if self._running is not None:
            raise ResponsesError(
                "response_in_progress",
                f"response.create: delegation {self._running} is still streaming; send it after its response ends",
            )
        return "new"

    def _function_output(self, item: Mapping[str, Any]) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ResponsesError("missing_required_parameter", "item.call_id is required", param="item.call_id")
        output = function_output(_output_text(item.get("output")), self.max_output_chars, OUTPUT_ERRORS)
        if call_id in self._issued and not self.conversation.has_call(call_id):
            # The client answered before the round ended (kame was still running MCP calls): kept for it.
            if call_id in self._early:
                raise ResponsesError(
                    "duplicate_call_output", f"function call {call_id} already has an output", param="item.call_id"
                )
            self._early[call_id] = output
            self._tool_finished(call_id, "ok")
            return
        if call_id in self._expired:
            raise ResponsesError(
                "call_expired",
                f"function_call_output for {call_id} came after kame stopped waiting "
                f"({self.function_timeout_s:g} s); the back-end was told the function returned nothing",
                param="item.call_id",
            )
        if not self.conversation.has_call(call_id):
            raise ResponsesError("unknown_call_id", f"no function call {call_id} in this session", param="item.call_id")
        if self.conversation.has_output(call_id):
            raise ResponsesError(
                "duplicate_call_output", f"function call {call_id} already has an output", param="item.call_id"
            )
        self.conversation.add(CallOutput(call_id, output))
        waiting = self._waiting
        if waiting is not None and call_id in waiting.calls:
            waiting.answered.add(call_id)
            waiting.wake.set()
            self._tool_finished(call_id, "ok")

    def _tool_started(self, call_id: str, name: str, label: str) -> None:
        self._issued[call_id] = time.monotonic()
        self._tool_event(ToolCallEvent("started", name, call_id, False, ""), label)

    def _tool_finished(
        self, call_id: str, outcome: ToolOutcome, name: str = "", label: str = "client_function"
    ) -> None:
        started = self._issued.get(call_id)
        duration = None if started is None else time.monotonic() - started
        self._tool_event(ToolCallEvent("finished", name, call_id, False, "", outcome, duration), label)

    def _tool_event(self, event: ToolCallEvent, label: str) -> None:
        if self._on_tool_call is not None:
            try:
                self._on_tool_call(event, label)
            except Exception:
                log.exception("responses delegation: the tool observer failed")

    # ------------------------------------------------------------------ running

    async def _serialized(self, delegation_id: str, response_id: str) -> DelegationDone:
        async with self._lock:
            try:
                done = await self._run(delegation_id, response_id)
            except asyncio.CancelledError:
                _guard(self._on_done, DelegationDone(delegation_id, "cancelled", "", 0, None))
                raise
            except Exception:  # a bug here ends this delegation only; the next one runs
                log.exception("responses delegation %s failed", delegation_id)
                done = DelegationDone(delegation_id, "failed", "", 0, None)
            finally:
                self._running = None
                self._waiting = None
            _guard(self._on_done, done)
            return done

    async def _run(self, delegation_id: str, response_id: str) -> DelegationDone:
        """The delegation's rounds through the one tool loop (:func:`~kame.backend.tool_loop.run_rounds`)."""
        plan = _DelegationRounds(self, delegation_id, response_id)
        events = run_rounds(plan, self.max_rounds - 1)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    if isinstance(event, TextDelta):
                        self._emit(delegation_id, plan.stream.text_delta(event.text))
                        _guard(self._on_text, TextOut(delegation_id, event.round, event.text, event.after_tools))
                    elif isinstance(event, LoopDone):
                        assert plan.done is not None
                        return plan.done
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not plan.streaming:
                raise  # a bug past the back-end's stream: the delegation fails (``_serialized``)
            return plan.failed(exc)
        raise AssertionError("unreachable: the loop always ends with LoopDone")  # pragma: no cover

    async def _run_server_tools(
        self,
        delegation_id: str,
        stream: ResponseStream,
        calls: list[tuple[ServerTool, CallRecord]],
        internal: list[tuple[CallRecord, str]],
    ) -> None:
        """Run the MCP calls of a round concurrently, shown as ``mcp_call`` items of its response."""
        assert self._server_tools is not None
        tools = self._server_tools
        items = []
        for tool, record in calls:
            item_id, events = stream.mcp_call_begin(tool.server_label, tool.tool, record.arguments)
            self._emit(delegation_id, events)
            items.append(item_id)

        async def one(tool: ServerTool, record: CallRecord) -> tuple[bool, str]:
            started = time.monotonic()
            self._tool_event(ToolCallEvent("started", tool.tool, record.call_id, False, ""), tool.tool)
            try:
                ok, text = await tools.call(tool, record.call_id, record.arguments)
                outcome: ToolOutcome = "ok" if ok else "error"
                self._tool_event(
                    ToolCallEvent(
                        "finished", tool.tool, record.call_id, False, "", outcome, time.monotonic() - started
                    ),
                    tool.tool,
                )
                return ok, text
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken tool fails its call, never the delegation
                log.warning("responses delegation %s: MCP call %s failed: %r", delegation_id, tool.name, exc)
                self._tool_event(
                    ToolCallEvent(
                        "finished", tool.tool, record.call_id, False, "", "error", time.monotonic() - started
                    ),
                    tool.tool,
                )
                return False, f"the tool failed ({type(exc).__name__})"

        results = await asyncio.gather(*(one(tool, record) for tool, record in calls))
        for item_id, (_tool, record), (ok, text) in zip(items, calls, results, strict=True):
            self._emit(
                delegation_id, stream.mcp_call_end(item_id, output=text if ok else None, error=None if ok else text)
            )
            internal.append((record, text if ok else f"Error: {text}"))

    async def _await_client(self, delegation_id: str, calls: dict[str, str], answered: set[str]) -> None:
        """Wait for every output and ``response.create``; past the timeout, go on without them."""
        waiting = _Waiting(delegation_id, calls, set(answered))
        self._waiting = waiting
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.function_timeout_s
        try:
            while not (waiting.resume and not waiting.missing):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                waiting.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiting.wake.wait(), remaining)
        finally:
            self._waiting = None
        missing = waiting.missing
        if missing:
            for call_id in missing:
                self._expired.add(call_id)
                self._tool_finished(call_id, "timeout", calls[call_id])
                self.conversation.add(
                    CallOutput(call_id, f"No result: the function did not answer within {self.function_timeout_s:g} s.")
                )
            self._info(
                "kame.function_timeout",
                f"no function_call_output for {', '.join(missing)} within {self.function_timeout_s:g} s; "
                "the back-end answers without it",
            )
        elif not waiting.resume:
            self._info(
                "kame.response_create_timeout",
                f"every function answered but no response.create came within {self.function_timeout_s:g} s; "
                "the back-end answers now",
            )

    # ------------------------------------------------------------------ sending

    def _emit(self, delegation_id: str, events: Sequence[Event]) -> None:
        for event in events:
            self._send(response_event(event, delegation_id))

    def _info(self, code: str, message: str) -> None:
        self._send({"type": "info", "code": code, "message": message})


class _DelegationRounds(RoundPlan):
    """One delegation's rounds as the tool loop runs them; each round is one response to the client.

    A round's request is the session's conversation with the client's
    functions and the enabled MCP tools (none on the last round). Of its
    calls, kame runs the MCP ones and refuses those never offered (both
    answered in the round); the client's are shown, and the round boundary
    (after the response ended) waits for their outputs. A failed back-end
    ends the response ``failed`` (:meth:`failed`), a cut-short one
    ``incomplete`` with its calls left open.
    """

    def __init__(self, owner: ResponsesDelegator, delegation_id: str, response_id: str) -> None:
        self.d = owner
        self.delegation_id = delegation_id
        self.response_id = response_id  #: the first round's (``session.delegation.created`` named it)
        self.round_no = 0
        self.previous: str | None = None
        self.total: Usage | None = None
        self.after_tools = False
        self.streaming = False  #: the round's back-end stream is open: a failure now fails the response
        self.stream: ResponseStream  # the round's response (made by :meth:`request`)
        self.settings: ResponsesDelegationSettings | None = None
        self.end = RoundEnd()
        self.offered: set[str] = set()  # the client's functions offered in this round
        self.by_name: dict[str, ServerTool] = {}  # the MCP tools offered in this round
        self.internal: list[tuple[CallRecord, str]] = []  # calls kame answered itself (MCP, refused)
        self.done: DelegationDone | None = None

    # ------------------------------------------------------------------ the loop's hooks

    def request(self, round_no: int, last: bool) -> AsyncGenerator[Any, None]:
        settings = self.d._settings()
        self.stream = ResponseStream(
            model=settings.model,
            response_id=self.response_id if round_no == 0 else None,
            tool_choice=settings.tool_choice.response_tool_choice(),
            parallel_tool_calls=settings.parallel_tool_calls,
            max_output_tokens=settings.max_output_tokens,
            previous_response_id=self.previous,
            ids=self.d._ids,
            clock=self.d._clock,
        )
        self.previous = self.stream.response_id
        self.round_no, self.settings, self.end, self.internal = round_no, settings, RoundEnd(), []
        self.d._running = self.delegation_id
        return self._items(round_no, last, settings)

    def assembler(self, round_no: int) -> ToolCallAssembler:
        assert self.settings is not None
        return ToolCallAssembler(single=not self.settings.parallel_tool_calls)

    def note(self, round_no: int, item: Any) -> bool:
        if not isinstance(item, RoundEnd):
            return False
        self.end = item
        if item.notice:
            self.d._info("kame.backend_notice", item.notice)
        if item.tools_notice:
            self.d._info("kame.tools_refused", item.tools_notice)
        return True

    def go_on(self, round_no: int, calls: Sequence[ToolCall]) -> bool:
        return incomplete_reason(self.end.finish_reason) is None

    def resolve(self, round_no: int, calls: Sequence[ToolCall]) -> AsyncIterator[CallFinished]:
        return self._resolve(calls)

    async def record(
        self, round_no: int, calls: Sequence[ToolCall], finished: Sequence[CallFinished], text: str
    ) -> bool:
        shown, early = self._end("completed")
        if shown:
            await self.d._await_client(self.delegation_id, {c.call_id: c.name for c in shown}, set(early))
        self.d._issued.clear()
        self.d._early.clear()
        self.after_tools = (
            self.after_tools or bool(shown) or any(not o.startswith("Refused:") for _, o in self.internal)
        )
        return self.after_tools

    def finish(self, round_no: int, text: str, calls: Sequence[ToolCall]) -> tuple[Mapping[str, Any], ...]:
        # (On the last round nothing is offered: a call there is refused and no round follows.)
        reason = incomplete_reason(self.end.finish_reason)
        self._show(calls, reason)
        self._end("completed" if reason is None else "incomplete")
        self.d._issued.clear()
        return ()  # the history is the session's conversation log

    def failed(self, exc: Exception) -> DelegationDone:
        """The back-end's stream failed (or the handling of its text): the response ends ``failed``."""
        kind = getattr(exc, "kind", "internal")
        message = str(exc) if hasattr(exc, "kind") else "internal error while streaming the back-end"
        if not hasattr(exc, "kind"):
            log.exception("responses delegation %s: back-end round failed", self.delegation_id)
        self.d._emit(self.delegation_id, self.stream.fail(failure_code(kind), message, error_type=kind))
        self.streaming = False
        self._end("failed")
        self.d._issued.clear()
        assert self.done is not None
        return self.done

    # ------------------------------------------------------------------ a round

    async def _items(
        self, round_no: int, last: bool, settings: ResponsesDelegationSettings
    ) -> AsyncGenerator[Any, None]:
        """Offer, ask, and stream the round (its response starts when the request is made)."""
        d = self.d
        client = () if last else tuple(settings.offered_functions())
        server: list[ServerTool] = []
        if not last and d._server_tools is not None and settings.mcp_servers:
            try:
                client_names = {f.name for f in client}
                server = [t for t in await d._server_tools.offered(settings) if t.name not in client_names]
            except Exception:  # noqa: BLE001 - MCP servers down: the round goes on with the client's functions
                log.warning("responses delegation %s: MCP tools unavailable", self.delegation_id, exc_info=True)
        functions = client + tuple(t.function for t in server)
        self.by_name = {t.name: t for t in server}
        choice = settings.tool_choice
        tool_choice: str | None = None
        if functions:
            forced = choice.forced
            tool_choice = choice.mode
            if forced and forced.startswith("function:"):
                tool_choice = forced.removeprefix("function:")
            elif forced:
                tool_choice = next((t.name for t in server if t.key == forced), "required")
            if round_no > 0 and tool_choice != "none":
                tool_choice = "auto"  # forcing a call again after its output would loop
        request = RoundRequest(
            messages=build_backend_messages(
                d.conversation,
                instructions=settings.instructions,
                max_words=d._prompt.max_words,
                language=d._prompt.language,
                tools=bool(functions),
                max_chars=d._prompt.max_chars,
                continuing=round_no > 0,
            ),
            functions=functions,
            tool_choice=tool_choice,
            max_tokens=settings.max_output_tokens,
            backend=settings.target.backend,
            model=settings.target.model,
        )
        d._emit(self.delegation_id, self.stream.start())
        self.offered = {f.name for f in client}
        self.streaming = True
        gen = d._source(request)
        try:
            async for item in gen:
                yield item
        finally:
            await _aclose(gen)
        self.streaming = False

    def _show(self, calls: Sequence[ToolCall], reason: IncompleteReason | None) -> list[tuple[ServerTool, CallRecord]]:
        """Sort the round's calls: the client's are shown, unoffered ones refused; the MCP ones to run.

        Calls open only now, when their names are whole (some servers split
        names), in index order. A round cut short (``reason``) leaves them
        open: they close ``incomplete`` and no client runs them.
        """
        d, stream = self.d, self.stream
        mine: list[tuple[ServerTool, CallRecord]] = []
        for index, call in enumerate(calls):
            name, arguments = call.name, call.arguments
            if name in self.by_name:
                if reason is None:
                    mine.append((self.by_name[name], CallRecord(d._ids("call"), name, arguments)))
                continue
            if name not in self.offered:
                if reason is not None:
                    continue
                # Never shown to the client (it could not run it); the back-end is told and tries again.
                self.internal.append((CallRecord(d._ids("call"), name or "unnamed", arguments), _refusal(name)))
                log.info("responses delegation %s: refused a call of %r (not offered)", self.delegation_id, name)
                continue
            d._emit(self.delegation_id, stream.call_begin(index, None, name))
            d._emit(self.delegation_id, stream.call_arguments(index, arguments))
            if reason is None:
                d._emit(self.delegation_id, stream.call_end(index))
                d._tool_started(stream.call_id_of(index), name, "client_function")
        return mine

    async def _resolve(self, calls: Sequence[ToolCall]) -> AsyncIterator[CallFinished]:
        """Show the client's calls and run kame's; their results go into the conversation at :meth:`record`."""
        mine = self._show(calls, None)
        if mine:
            await self.d._run_server_tools(self.delegation_id, self.stream, mine, self.internal)
        return
        yield  # pragma: no cover - makes this an async generator

    def _end(self, status: Literal["completed", "incomplete", "failed"]) -> tuple[list[Any], dict[str, str]]:
        """The round's response ends ``status``; the round goes into the conversation.

        Returns the client's calls it showed and the outputs the client
        already sent for them. Sets :attr:`done` to how the delegation ends
        if no round follows.
        """
        d, stream = self.d, self.stream
        usage = None if status == "failed" else self.end.usage
        if status == "completed":
            d._emit(self.delegation_id, stream.complete(usage))
        elif status == "incomplete":
            reason = incomplete_reason(self.end.finish_reason)
            assert reason is not None
            d._emit(self.delegation_id, stream.incomplete(reason, usage))
        d._running = None
        if usage is not None:
            self.total = usage if self.total is None else self.total + usage
        if status != "failed" and stream.text.strip():
            _guard(d._on_round_text, RoundText(self.delegation_id, self.round_no, stream.text, self.after_tools))
        calls = stream.summary().calls
        records = [CallRecord(c.call_id, c.name, c.arguments) for c in calls] + [r for r, _ in self.internal]
        d.conversation.add(BackendTurn(stream.text, tuple(records)))
        for record, output in self.internal:
            d.conversation.add(CallOutput(record.call_id, output))
        early = {c.call_id: d._early.pop(c.call_id) for c in calls if c.call_id in d._early}
        for call_id, output in early.items():
            d.conversation.add(CallOutput(call_id, output))
        self.done = DelegationDone(self.delegation_id, status, stream.text, self.round_no + 1, self.total)
        return calls, early


def _guard(callback: Callable[[Any], None], value: Any) -> None:
    """Call a consumer's hook; its bug is logged, never allowed to end the delegation."""
    try:
        callback(value)
    except Exception:
        log.exception("responses delegation: a %s hook failed", type(value).__name__)


def _refusal(name: str) -> str:
    return (
        f"Refused: no function named {name!r} is available; answer without it."
        if name
        else ("Refused: a function call without a name; answer without it.")
    )


def _client_message(item: Mapping[str, Any]) -> ClientMessage:
    role = item.get("role")
    if role not in ("user", "assistant", "developer", "system"):
        raise ResponsesError(
            "invalid_value", "item.role must be user, assistant, developer or system", param="item.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, Sequence):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") not in ("input_text", "output_text", "text"):
                raise ResponsesError(
                    "invalid_value", "kame's back-end takes text content only", param=f"item.content[{i}]"
                )
            parts.append(str(part.get("text", "")))
        text = "".join(parts)
    else:
        raise ResponsesError("invalid_type", "item.content must be a string or an array", param="item.content")
    return ClientMessage(role, text)


def _output_text(output: object) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, Sequence):
        parts = []
        for i, part in enumerate(output):
            if not isinstance(part, Mapping) or part.get("type") != "input_text":
                raise ResponsesError(
                    "invalid_value", "kame's back-end takes text outputs only", param=f"item.output[{i}]"
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ResponsesError("invalid_type", "item.output must be a string or an array of input_text", param="item.output")


async def _aclose(gen: Any) -> None:
    aclose = getattr(gen, "aclose", None)
    if aclose is not None:
        await aclose()
