"""One back-end tool round as a Responses API event stream, for ``response.event``. No I/O.

GPT-Live clients in Responses delegation expect the back-end's work as nested Responses streaming
events, each in a Live ``response.event`` envelope; each round of kame's tool loop is shown as one
Responses *response* (the event sequence: docs/protocol.md). Clients (Pipecat) run every
``function_call`` item that ends ``completed``, so an item cut short by an error is closed as
``incomplete`` and never runs. Lifecycle snapshots carry no output, instructions or tools, as the Live
API documents: the granular events are the content.

The builder is a small state machine fed by whoever drives the tool loop; it returns plain dicts, and
:func:`response_event` wraps one in the Live envelope. Event ids are stamped by the wire's encoder.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Event = dict[str, Any]

#: Terminal status of a response.
FinalStatus = Literal["completed", "incomplete", "failed"]
#: ``incomplete_details.reason`` values of the Responses API that kame produces.
IncompleteReason = Literal["max_output_tokens", "content_filter"]
#: ``error.code`` values of the Responses API's ``ResponseError`` that kame produces.
FailureCode = Literal["server_error", "rate_limit_exceeded"]

#: kame back-end error kinds (``BackendError.kind``) that mean "try later", not "broken".
_RATE_LIMIT_KINDS = frozenset({"rate_limited", "busy", "circuit_open"})


def new_id(prefix: str) -> str:
    """An id shaped like OpenAI's (``resp_``, ``msg_``, ``fc_``, ``call_`` + hex)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def failure_code(kind: str) -> FailureCode:
    """The Responses ``error.code`` for a kame back-end error kind (``BackendError.kind``)."""
    return "rate_limit_exceeded" if kind in _RATE_LIMIT_KINDS else "server_error"


def incomplete_reason(finish_reason: str | None) -> IncompleteReason | None:
    """``incomplete_details.reason`` for a chat-completions ``finish_reason`` (None: the round is complete)."""
    if finish_reason == "length":
        return "max_output_tokens"
    if finish_reason == "content_filter":
        return "content_filter"
    return None


def response_event(event: Event, delegation_id: str | None, *, client_event_id: str | None = None) -> Event:
    """The Live ``response.event`` envelope around one nested Responses event (``event_id`` added on send)."""
    out: Event = {"type": "response.event", "delegation_id": delegation_id, "event": event}
    if client_event_id is not None:
        out["client_event_id"] = client_event_id
    return out


@dataclass(frozen=True)
class Usage:
    """Token counts of one round, as the back-end reported them (chat-completions ``usage``)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @classmethod
    def from_chat(cls, usage: Any) -> Usage | None:
        """From a chat-completions ``usage`` object or dict (None when the server sent none)."""
        if usage is None:
            return None

        def get(obj: Any, key: str) -> Any:
            return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

        prompt = get(usage, "prompt_tokens") or 0
        completion = get(usage, "completion_tokens") or 0
        prompt_details = get(usage, "prompt_tokens_details")
        completion_details = get(usage, "completion_tokens_details")
        cached = (get(prompt_details, "cached_tokens") or 0) if prompt_details is not None else 0
        reasoning = (get(completion_details, "reasoning_tokens") or 0) if completion_details is not None else 0
        return cls(int(prompt), int(completion), int(cached), int(reasoning))

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )

    def as_response_usage(self) -> dict[str, Any]:
        """The Responses API's ``ResponseUsage`` shape."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(frozen=True)
class FunctionCall:
    """A function call the back-end made in a round, complete (what the client runs)."""

    call_id: str
    name: str
    arguments: str
    item_id: str


@dataclass
class _Item:
    item_id: str
    output_index: int
    kind: Literal["message", "function_call", "mcp_call"]
    text: str = ""  # message text, or the call's arguments so far
    call_id: str = ""
    name: str = ""
    index: int = -1  # the chat-completions tool-call index of a function call
    open: bool = True
    status: str = "in_progress"
    server_label: str = ""  # an mcp_call's server
    output: str | None = None  # an mcp_call's output
    error: str | None = None  # an mcp_call's error text


@dataclass
class RoundSummary:
    """What a finished round produced (the tool loop and the conversation log read it)."""

    response_id: str
    status: FinalStatus
    text: str
    calls: list[FunctionCall] = field(default_factory=list)
    usage: Usage | None = None


class ResponseStream:
    """The nested Responses events of one tool round (one response).

    Feed it in stream order: :meth:`start`, then :meth:`text`,
    :meth:`call_begin` / :meth:`call_arguments` / :meth:`call_end` as the
    back-end's chunks arrive, then exactly one of :meth:`complete`,
    :meth:`incomplete` or :meth:`fail`. Each method returns the events to
    send, in order. Calls are keyed by the chat-completions tool-call
    ``index``; several may be open at once (their events carry their own
    ``item_id`` / ``output_index``). Text after a call opens a new message
    item, so the items keep the order in which the back-end produced them.
    """

    def __init__(
        self,
        *,
        model: str,
        response_id: str | None = None,
        tool_choice: str | dict[str, Any] = "auto",
        parallel_tool_calls: bool = True,
        max_output_tokens: int | None = None,
        previous_response_id: str | None = None,
        ids: Callable[[str], str] = new_id,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.response_id = response_id or ids("resp")
        self.model = model
        self._tool_choice = tool_choice
        self._parallel = parallel_tool_calls
        self._max_output_tokens = max_output_tokens
        self._previous = previous_response_id
        self._ids = ids
        self._clock = clock
        self._created_at = clock()
        self._seq = 0
        self._items: list[_Item] = []
        self._message: _Item | None = None  # the message item text goes to, while open
        self._calls: dict[int, _Item] = {}  # open function calls by tool-call index
        self._call_ids: set[str] = set()
        self._state: Literal["new", "streaming", "done"] = "new"
        self.status: FinalStatus | None = None
        self.usage: Usage | None = None

    # ------------------------------------------------------------------ reading

    @property
    def done(self) -> bool:
        return self._state == "done"

    @property
    def text(self) -> str:
        """All message text of this round so far, in order."""
        return "".join(i.text for i in self._items if i.kind == "message")

    @property
    def calls(self) -> list[FunctionCall]:
        """The function calls closed as ``completed`` so far, in output order (the client may run each).

        A call cut short by the round's end is ``incomplete`` and is not one;
        a call closed before a later failure is (the client has been told
        it may run it).
        """
        return [
            FunctionCall(i.call_id, i.name, i.text, i.item_id)
            for i in self._items
            if i.kind == "function_call" and i.status == "completed"
        ]

    def summary(self) -> RoundSummary:
        if self.status is None:
            raise RuntimeError("the round has not ended")
        return RoundSummary(self.response_id, self.status, self.text, self.calls, self.usage)

    # ------------------------------------------------------------------ feeding

    def start(self) -> list[Event]:
        """``response.created`` and ``response.in_progress``."""
        if self._state != "new":
            raise RuntimeError("response already started")
        self._state = "streaming"
        snapshot = self._snapshot("in_progress")
        return [self._ev("response.created", response=snapshot), self._ev("response.in_progress", response=snapshot)]

    def text_delta(self, delta: str) -> list[Event]:
        """Message text from the back-end (empty deltas are dropped)."""
        self._check_streaming()
        if not delta:
            return []
        events: list[Event] = []
        if self._message is None:
            item = self._new_item("message", self._ids("msg"))
            self._message = item
            events.append(self._ev("response.output_item.added", output_index=item.output_index, item=self._item(item)))
            events.append(
                self._ev(
                    "response.content_part.added",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    content_index=0,
                    part=_text_part(""),
                )
            )
        item = self._message
        item.text += delta
        events.append(
            self._ev(
                "response.output_text.delta",
                item_id=item.item_id,
                output_index=item.output_index,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return events

    def call_begin(self, index: int, call_id: str | None, name: str) -> list[Event]:
        """A function call starts (chat-completions: the first ``tool_calls`` delta of ``index``).

        ``call_id`` is the back-end's tool-call id; a missing or repeated one
        (some local servers send none) is replaced by a fresh ``call_...`` id.
        """
        self._check_streaming()
        if index in self._calls:
            raise ValueError(f"tool call {index} already started")
        if not name:
            raise ValueError("a function call needs a name")
        events = self._close_message("completed")
        cid = call_id if call_id and call_id not in self._call_ids else self._ids("call")
        self._call_ids.add(cid)
        item = self._new_item("function_call", self._ids("fc"), call_id=cid, name=name)
        item.index = index
        self._calls[index] = item
        events.append(self._ev("response.output_item.added", output_index=item.output_index, item=self._item(item)))
        return events

    def call_id_of(self, index: int) -> str:
        """The ``call_id`` the client sees for tool call ``index`` (open or closed)."""
        for item in self._items:
            if item.kind == "function_call" and item.index == index:
                return item.call_id
        raise KeyError(index)

    def call_arguments(self, index: int, delta: str) -> list[Event]:
        """An argument chunk of an open call."""
        self._check_streaming()
        item = self._open_call(index)
        if not delta:
            return []
        item.text += delta
        return [
            self._ev(
                "response.function_call_arguments.delta",
                item_id=item.item_id,
                output_index=item.output_index,
                delta=delta,
            )
        ]

    def call_end(self, index: int) -> list[Event]:
        """The call's arguments are complete: ``.arguments.done`` and ``output_item.done`` (status completed)."""
        self._check_streaming()
        item = self._open_call(index)
        return self._close_call(index, item, "completed")

    def mcp_call_begin(self, server_label: str, name: str, arguments: str) -> tuple[str, list[Event]]:
        """A call of an MCP tool that kame runs itself (the client does nothing with it): its item id and events."""
        self._check_streaming()
        events = self._close_message("completed")
        item = self._new_item("mcp_call", self._ids("mcp"), name=name)
        item.server_label = server_label
        item.text = arguments
        where = {"item_id": item.item_id, "output_index": item.output_index}
        events.append(self._ev("response.output_item.added", output_index=item.output_index, item=self._item(item)))
        events.append(self._ev("response.mcp_call_arguments.done", **where, arguments=arguments))
        events.append(self._ev("response.mcp_call.in_progress", **where))
        return item.item_id, events

    def mcp_call_end(self, item_id: str, *, output: str | None = None, error: str | None = None) -> list[Event]:
        """The MCP call returned ``output``, or failed with ``error`` (text safe for clients)."""
        self._check_streaming()
        item = next((i for i in self._items if i.item_id == item_id and i.kind == "mcp_call" and i.open), None)
        if item is None:
            raise ValueError(f"no open mcp_call {item_id}")
        item.open = False
        item.output, item.error = output, error
        item.status = "completed" if error is None else "failed"
        where = {"item_id": item.item_id, "output_index": item.output_index}
        kind = "response.mcp_call.completed" if error is None else "response.mcp_call.failed"
        return [
            self._ev(kind, **where),
            self._ev("response.output_item.done", output_index=item.output_index, item=self._item(item, item.status)),
        ]

    def complete(self, usage: Usage | None = None) -> list[Event]:
        """The round ended normally: open items close as completed, then ``response.completed``."""
        return self._finish("completed", usage=usage)

    def incomplete(self, reason: IncompleteReason, usage: Usage | None = None) -> list[Event]:
        """The back-end stopped early: open items close as incomplete, then ``response.incomplete``."""
        return self._finish("incomplete", usage=usage, incomplete=reason)

    def fail(self, code: FailureCode, message: str, *, error_type: str | None = None) -> list[Event]:
        """The round broke (back-end error, timeout): open items close as incomplete, then ``response.failed``.

        ``message`` must already be safe for clients (kame's ``BackendError``
        messages are: they never carry keys). ``error_type`` keeps kame's own
        error kind (``timeout``, ``unavailable``, ...).
        """
        return self._finish("failed", error={"code": code, "message": message, "type": error_type})

    # ------------------------------------------------------------------ internals

    def _check_streaming(self) -> None:
        if self._state == "new":
            raise RuntimeError("call start() first")
        if self._state == "done":
            raise RuntimeError("the response has ended")

    def _open_call(self, index: int) -> _Item:
        item = self._calls.get(index)
        if item is None:
            raise ValueError(f"tool call {index} is not open")
        return item

    def _new_item(
        self,
        kind: Literal["message", "function_call", "mcp_call"],
        item_id: str,
        *,
        call_id: str = "",
        name: str = "",
    ) -> _Item:
        item = _Item(item_id=item_id, output_index=len(self._items), kind=kind, call_id=call_id, name=name)
        self._items.append(item)
        return item

    def _close_message(self, status: str) -> list[Event]:
        item = self._message
        if item is None:
            return []
        self._message = None
        item.open = False
        item.status = status
        where = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
        return [
            self._ev("response.output_text.done", **where, text=item.text, logprobs=[]),
            self._ev("response.content_part.done", **where, part=_text_part(item.text)),
            self._ev("response.output_item.done", output_index=item.output_index, item=self._item(item, status)),
        ]

    def _close_call(self, index: int, item: _Item, status: str) -> list[Event]:
        del self._calls[index]
        item.open = False
        item.status = status
        return [
            self._ev(
                "response.function_call_arguments.done",
                item_id=item.item_id,
                output_index=item.output_index,
                arguments=item.text,
            ),
            self._ev("response.output_item.done", output_index=item.output_index, item=self._item(item, status)),
        ]

    def _finish(
        self,
        status: FinalStatus,
        *,
        usage: Usage | None = None,
        incomplete: IncompleteReason | None = None,
        error: dict[str, Any] | None = None,
    ) -> list[Event]:
        self._check_streaming()
        item_status = "completed" if status == "completed" else "incomplete"
        # Close in output order, so the done events read like the added ones.
        closing: list[tuple[int, _Item]] = sorted(
            [(item.output_index, item) for item in self._calls.values()]
            + ([(self._message.output_index, self._message)] if self._message is not None else [])
            + [(i.output_index, i) for i in self._items if i.kind == "mcp_call" and i.open],
            key=lambda pair: pair[0],
        )
        events: list[Event] = []
        for _, item in closing:
            if item.kind == "message":
                events.extend(self._close_message(item_status))
            elif item.kind == "mcp_call":
                item.open, item.status = False, "incomplete"
                events.append(
                    self._ev(
                        "response.output_item.done", output_index=item.output_index, item=self._item(item, "incomplete")
                    )
                )
            else:
                events.extend(self._close_call(item.index, item, item_status))
        self._state = "done"
        self.status = status
        self.usage = usage
        snapshot = self._snapshot(status, usage=usage, incomplete=incomplete, error=error)
        events.append(self._ev(f"response.{status}", response=snapshot))
        return events

    def _ev(self, type_: str, **fields: Any) -> Event:
        event: Event = {"type": type_, "sequence_number": self._seq}
        event.update(fields)
        self._seq += 1
        return event

    def _item(self, item: _Item, status: str = "in_progress") -> dict[str, Any]:
        if item.kind == "message":
            content = [] if item.open and status == "in_progress" else [_text_part(item.text)]
            return {
                "id": item.item_id,
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": content,
            }
        if item.kind == "mcp_call":
            out: dict[str, Any] = {
                "id": item.item_id,
                "type": "mcp_call",
                "server_label": item.server_label,
                "name": item.name,
                "arguments": item.text,
                "status": status,
                "output": item.output,
                "error": None,
            }
            if item.error is not None:
                out["error"] = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": item.error}]}
            return out
        return {
            "id": item.item_id,
            "type": "function_call",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.text,
            "status": status,
        }

    def _snapshot(
        self,
        status: str,
        *,
        usage: Usage | None = None,
        incomplete: IncompleteReason | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self._created_at,
            "completed_at": self._clock() if status == "completed" else None,
            "status": status,
            "model": self.model,
            # Snapshots carry no input, instructions, tools or output (see the module docstring).
            "instructions": None,
            "tools": [],
            "output": [],
            "tool_choice": self._tool_choice,
            "parallel_tool_calls": self._parallel,
            "max_output_tokens": self._max_output_tokens,
            "previous_response_id": self._previous,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
            "usage": usage.as_response_usage() if usage is not None else None,
            "metadata": {},
        }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
