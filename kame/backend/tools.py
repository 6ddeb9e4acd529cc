"""Function tools of a back-end request: definitions, streamed calls, results.

Everything here is pure data plus one pure assembler, so the tool loop
(:mod:`kame.backend.tool_loop`), the wires and the tests share one
vocabulary:

* :class:`ToolSpec` - a function the LLM may call (name, description,
  JSON-Schema parameters) and whether it is *read-only*: a read-only tool
  has no side effect, so kame may call it speculatively on a partial
  transcript and share its result between requests.
* :class:`ToolCallDelta` - one piece of a streamed call as a back-end
  yields it (the chat-completions ``tool_calls`` delta: index, id, name,
  argument chunk); :class:`ToolCallAssembler` joins the pieces of one LLM
  turn into complete :class:`ToolCall` objects (several per turn).
* :class:`ToolResult` - what came back (``ok``, ``error``, ``refused``,
  ``timeout``); every outcome becomes a ``tool`` message, so the LLM is told
  when a call failed and answers anyway.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

ToolOutcome = Literal["ok", "error", "refused", "timeout"]
TOOL_OUTCOMES: tuple[ToolOutcome, ...] = ("ok", "error", "refused", "timeout")

#: OpenAI's rule for function names (also what most providers accept).
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_OBJECT: Mapping[str, Any] = {"type": "object", "properties": {}}


class ToolDefinitionError(ValueError):
    """A tool definition that no provider would accept (bad name, parameters not an object schema)."""


@dataclass(frozen=True)
class ToolSpec:
    """A function the LLM may call.

    ``parameters`` is the JSON Schema of the arguments object, sent to the
    provider as is. ``read_only``: calling it changes nothing in the world,
    so it may run while the user is still talking (see
    :mod:`kame.backend.speculation`); everything else waits for the end of
    the user's turn and runs at most once.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(_EMPTY_OBJECT))
    read_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r}: 1-64 letters, digits, '_' or '-' (what providers accept)"
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type", "object") != "object":
            raise ToolDefinitionError(f"tool {self.name}: parameters must be a JSON Schema of type object")

    def as_openai(self) -> dict[str, Any]:
        """The chat-completions ``tools`` entry."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """One complete call the LLM asked for. ``arguments`` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments object; raises :class:`ValueError` if the model wrote something else."""
        text = self.arguments.strip() or "{}"
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("the arguments are not a JSON object")
        return value

    @property
    def key(self) -> tuple[str, str]:
        """(name, canonical arguments): two calls with the same key do the same thing."""
        try:
            canonical = json.dumps(self.parsed_arguments(), sort_keys=True, separators=(",", ":"))
        except ValueError:
            canonical = self.arguments.strip()
        return (self.name, canonical)

    def as_openai(self) -> dict[str, Any]:
        """The entry of an assistant message's ``tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed call: the first piece of index ``i`` usually has id and name.

    ``index`` None: the server did not say (some OpenAI-compatible servers
    send each call whole, without an index); a new id then starts a new
    call, a piece without an id continues the last one.
    """

    index: int | None
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class TurnOptions(TypedDict, total=False):
    """The keyword arguments of every ``stream_turn`` (the back-ends', the registry's), defined once.

    ``tools`` the LLM may call and ``tool_choice`` among them; ``max_tokens``, ``temperature``; ``model``
    replaces the configured model for this one request; ``report`` (a :class:`TurnReport`) receives the
    turn's finish reason and token usage. Each defaults to None.
    """

    tools: Sequence[ToolSpec] | None
    tool_choice: str | None
    max_tokens: int | None
    temperature: float | None
    model: str | None
    report: TurnReport | None


@dataclass
class TurnReport:
    """What a back-end learnt about one streamed turn, filled in while it streams.

    Pass one to ``stream_turn(report=...)`` to get the ``finish_reason`` of
    the turn and the token usage (an OpenAI-compatible back-end then asks
    for it with ``stream_options.include_usage``; None: the server sent
    none). The Live API's Responses delegation reports both to its client.
    """

    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    model: str | None = None  #: the model the request named


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call, addressed to the call by ``call_id``."""

    call_id: str
    name: str
    outcome: ToolOutcome
    output: str

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def content_for_llm(self) -> str:
        """The ``tool`` message content: the output itself, or a JSON error the model can read."""
        if self.outcome == "ok":
            return self.output
        return json.dumps({"error": self.outcome, "message": self.output})

    def for_call(self, call_id: str) -> ToolResult:
        """The same result addressed to another call (a shared or cached call)."""
        return ToolResult(call_id, self.name, self.outcome, self.output)


def refused(call: ToolCall, why: str) -> ToolResult:
    return ToolResult(call.id, call.name, "refused", why)


def failed(call: ToolCall, why: str) -> ToolResult:
    return ToolResult(call.id, call.name, "error", why)


def timed_out(call: ToolCall, seconds: float) -> ToolResult:
    return ToolResult(call.id, call.name, "timeout", f"no result within {seconds:g} s")


def cap_output(text: str, max_chars: int | None) -> str:
    """``text`` cut to ``max_chars`` with a marker the LLM understands."""
    if max_chars is None or len(text) <= max_chars:
        return text
    marker = f" [... cut: {len(text) - max_chars} more characters]"
    return text[:max_chars] + marker


class ToolCallAssembler:
    """Joins the ``tool_calls`` deltas of one streamed LLM turn into calls.

    Deltas of the same ``index`` belong to one call: the id and name come
    with the first (some servers repeat them, some send the name in pieces),
    argument chunks are concatenated in order. Calls come out in index
    order. A call that never got an id is given one (``call_<n>``) so its
    result can still be addressed; one without a name is returned with an
    empty name and is refused by the loop.

    ``single``: only the first call counts (a request with
    ``parallel_tool_calls`` false: the deltas of any later call are dropped).
    """

    def __init__(self, id_prefix: str = "call", *, single: bool = False) -> None:
        self._ids: dict[int, str] = {}
        self._names: dict[int, str] = {}
        self._args: dict[int, list[str]] = {}
        self._prefix = id_prefix
        self._single = single

    def add(self, delta: ToolCallDelta) -> None:
        i = delta.index if delta.index is not None else self._implicit_index(delta.id)
        if self._single and self._args and i not in self._args:
            return
        self._args.setdefault(i, [])
        if delta.id:
            self._ids.setdefault(i, delta.id)
        if delta.name:
            previous = self._names.get(i, "")
            # A repeated full name is not a new piece; a split name is.
            if previous != delta.name:
                self._names[i] = previous + delta.name
        if delta.arguments:
            self._args[i].append(delta.arguments)

    def _implicit_index(self, call_id: str | None) -> int:
        if call_id:
            for i, known in self._ids.items():
                if known == call_id:
                    return i
            return max(self._args, default=-1) + 1
        return max(self._args, default=0)

    def __bool__(self) -> bool:
        return bool(self._args)

    def calls(self) -> list[ToolCall]:
        out = []
        for n, i in enumerate(sorted(self._args)):
            call_id = self._ids.get(i) or f"{self._prefix}_{n}"
            out.append(ToolCall(call_id, self._names.get(i, ""), "".join(self._args[i]) or "{}"))
        return out


# ---------------------------------------------------------------------- messages of a tool round


@dataclass(frozen=True)
class AssistantToolCalls:
    """The assistant's turn that asked for calls (with the text it said first, if any)."""

    calls: tuple[ToolCall, ...]
    content: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": self.content or None,
            "tool_calls": [c.as_openai() for c in self.calls],
        }


@dataclass(frozen=True)
class ToolMessage:
    """A result sent back to the LLM."""

    result: ToolResult

    def as_dict(self) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": self.result.call_id, "content": self.result.content_for_llm()}


RoundMessage = AssistantToolCalls | ToolMessage


def round_messages(calls: Sequence[ToolCall], results: Sequence[ToolResult], text: str = "") -> list[dict[str, Any]]:
    """The two-part history a tool round adds: the assistant's calls, then one ``tool`` message per call."""
    by_id = {r.call_id: r for r in results}
    out = [AssistantToolCalls(tuple(calls), text).as_dict()]
    for call in calls:
        result = by_id.get(call.id) or failed(call, "no result")
        out.append(ToolMessage(result).as_dict())
    return out


def tool_choice_value(choice: str | None, tools: Sequence[ToolSpec]) -> str | dict[str, Any] | None:
    """The chat-completions ``tool_choice`` for kame's names: auto, none, required or a tool name."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if any(t.name == choice for t in tools):
        return {"type": "function", "function": {"name": choice}}
    raise ToolDefinitionError(f"tool_choice {choice!r}: not one of the offered tools")
