"""Client-executed functions on ``/v1/realtime``, in the Realtime API's shapes. No I/O.

* ``session.update`` carries ``tools`` (function tools:
  ``{"type": "function", "name", "description", "parameters"}``, plus a
  ``kame`` extension ``{"read_only": true}`` for a function without side
  effects, which kame may call while the user is still talking) and
  ``tool_choice`` (``auto``, ``none``, ``required`` or
  ``{"type": "function", "name": ...}``): :func:`parse_tools`,
  :func:`parse_tool_choice`.
* A call is an output item of the response in progress, which then ends
  (or of a response of its own when none is open):
  :func:`function_call_items` gives ``response.output_item.added`` (a
  ``function_call`` item with ``call_id`` and ``name``),
  ``conversation.item.added``, ``response.function_call_arguments.delta`` /
  ``.done``, ``response.output_item.done`` and ``conversation.item.done``.
* The client answers with ``conversation.item.create`` holding a
  ``function_call_output`` (``call_id``, ``output``) and may send
  ``response.create`` (which then continues the tool loop): :func:`decode_function_output`,
  :func:`output_accepted`. Waiting for the output is the session's
  :class:`~kame.backend.client_functions.ClientFunctions` (wire-independent).

Errors are :class:`FunctionProtocolError` (code, message, param); the wire
turns them into ``error`` events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kame.backend.tools import ToolSpec
from kame.session.commands import CommandRefused
from kame.session.function_tools import (
    MAX_OUTPUT_CHARS,
    FunctionTool,
    ToolErrors,
    function_output,
    function_tool,
    tool_list,
)

Event = dict[str, Any]

__all__ = ["MAX_OUTPUT_CHARS", "FunctionProtocolError", "parse_tools", "parse_tool_choice", "decode_function_output"]


class FunctionProtocolError(CommandRefused):
    """A client's tools, tool_choice or function output that cannot be accepted."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(code, message, param=param)


#: ``/v1/realtime``'s names for the faults of a client's tools (:mod:`kame.session.function_tools` checks them).
ERRORS = ToolErrors(FunctionProtocolError, schema_on_tool=True)


# --------------------------------------------------------------------------- session.update


def parse_tools(value: Any, param: str = "session.tools") -> list[ToolSpec]:
    """``session.tools`` -> function tools (``[]`` or null: none)."""
    if value is None:
        return []
    tools: list[FunctionTool] = []
    for i, tool in enumerate(tool_list(value, param, ERRORS)):
        where = f"{param}[{i}]"
        if not isinstance(tool, Mapping):
            raise FunctionProtocolError("invalid_value", f"{where} must be an object", where)
        kind = tool.get("type", "function")
        if kind == "mcp":
            raise FunctionProtocolError(
                "unsupported_tool_type",
                f"{where}: MCP servers cannot be added by a client; the operator configures them "
                "(enable one by name with session.kame.mcp_servers)",
                f"{where}.type",
            )
        if kind != "function":
            raise FunctionProtocolError(
                "unsupported_tool_type", f"{where}.type: only \"function\" tools are supported", f"{where}.type"
            )
        found = function_tool(tool, where, ERRORS, read_only=_read_only(tool.get("kame"), f"{where}.kame"))
        if any(t.name == found.name for t in tools):
            raise FunctionProtocolError("invalid_value", f"{where}.name: {found.name!r} is defined twice", f"{where}.name")
        tools.append(found)
    return [t.spec() for t in tools]


def _read_only(ext: Any, param: str) -> bool:
    if ext is None:
        return False
    if not isinstance(ext, Mapping):
        raise FunctionProtocolError("invalid_value", f"{param} must be an object", param)
    unknown = [k for k in ext if k != "read_only"]
    if unknown:
        raise FunctionProtocolError("unknown_parameter", f"{param}: unknown key {str(unknown[0])[:40]!r}", param)
    value = ext.get("read_only", False)
    if not isinstance(value, bool):
        raise FunctionProtocolError("invalid_value", f"{param}.read_only must be true or false", f"{param}.read_only")
    return value


def parse_tool_choice(value: Any, tools: Sequence[ToolSpec], param: str = "session.tool_choice") -> str:
    """``auto`` | ``none`` | ``required`` | ``{"type": "function", "name": N}`` -> kame's choice string."""
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return str(value)
    if isinstance(value, Mapping) and value.get("type") == "function":
        name = value.get("name")
        if isinstance(name, str) and any(t.name == name for t in tools):
            return name
        raise FunctionProtocolError("invalid_value", f"{param}.name: not one of session.tools", f"{param}.name")
    raise FunctionProtocolError(
        "invalid_value", f"{param}: auto, none, required or {{\"type\": \"function\", \"name\": ...}}", param
    )


def session_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` of the session object."""
    return [
        {"type": "function", "name": s.name, "description": s.description, "parameters": dict(s.parameters),
         "kame": {"read_only": s.read_only}}
        for s in specs
    ]


def session_tool_choice(choice: str) -> str | dict[str, str]:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "name": choice}


# --------------------------------------------------------------------------- a call as its own response


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _response(response_id: str, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": None,
        "output": output,
        "output_modalities": ["audio"],
        "conversation_id": None,
        "max_output_tokens": "inf",
        "metadata": None,
        "usage": None,
    }


def function_call_items(
    response_id: str,
    output_index: int,
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    previous_item_id: str | None = None,
    deltas: Sequence[str] | None = None,
) -> tuple[list[Event], dict[str, Any]]:
    """The events of one function-call output item of a response, in wire order, and the item as
    ``response.done`` shows it."""
    started = function_call_item(item_id, call_id, name, "", "in_progress")
    done = function_call_item(item_id, call_id, name, arguments, "completed")
    where = {"response_id": response_id, "item_id": item_id, "output_index": output_index, "call_id": call_id}
    events: list[Event] = [
        {"type": "response.output_item.added", "response_id": response_id, "output_index": output_index, "item": started},
        {"type": "conversation.item.added", "previous_item_id": previous_item_id, "item": dict(started)},
    ]
    for delta in deltas if deltas is not None else ([arguments] if arguments else []):
        events.append({"type": "response.function_call_arguments.delta", **where, "delta": delta})
    events += [
        {"type": "response.function_call_arguments.done", **where, "name": name, "arguments": arguments},
        {"type": "response.output_item.done", "response_id": response_id, "output_index": output_index, "item": done},
        {"type": "conversation.item.done", "previous_item_id": previous_item_id, "item": dict(done)},
    ]
    return events, done


def function_call_response(
    response_id: str,
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    previous_item_id: str | None = None,
    deltas: Sequence[str] | None = None,
) -> list[Event]:
    """Every event of a response whose only output is one function call, in wire order."""
    events, done = function_call_items(response_id, 0, item_id, call_id, name, arguments, previous_item_id, deltas)
    return [
        {"type": "response.created", "response": _response(response_id, "in_progress", [])},
        *events,
        {"type": "response.done", "response": _response(response_id, "completed", [dict(done)])},
    ]


# --------------------------------------------------------------------------- the client's answer


@dataclass(frozen=True)
class FunctionOutput:
    """A ``conversation.item.create`` with a ``function_call_output`` item."""

    call_id: str
    output: str
    item_id: str | None = None
    previous_item_id: str | None = None
    event_id: str | None = None


def decode_function_output(obj: Mapping[str, Any], max_output_chars: int = MAX_OUTPUT_CHARS) -> FunctionOutput:
    """``conversation.item.create`` -> :class:`FunctionOutput`; only function outputs can be added."""
    event_id = obj.get("event_id") if isinstance(obj.get("event_id"), str) else None
    item = obj.get("item")
    if not isinstance(item, Mapping):
        raise FunctionProtocolError("missing_required_parameter", "conversation.item.create needs an item object", "item")
    if item.get("type") != "function_call_output":
        raise FunctionProtocolError(
            "unsupported_item_type",
            "only function_call_output items can be added: the rest of the conversation is the live audio",
            "item.type",
        )
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise FunctionProtocolError("missing_required_parameter", "item.call_id must be a string", "item.call_id")
    output = item.get("output")
    if not isinstance(output, str):
        raise FunctionProtocolError("invalid_value", "item.output must be a string", "item.output")
    function_output(output, max_output_chars, ERRORS)
    item_id = item.get("id") if isinstance(item.get("id"), str) else None
    previous = obj.get("previous_item_id") if isinstance(obj.get("previous_item_id"), str) else None
    return FunctionOutput(call_id[:128], output, item_id and item_id[:128], previous, event_id and event_id[:128])


def function_output_item(item_id: str, call_id: str, output: str) -> dict[str, Any]:
    return {"id": item_id, "object": "realtime.item", "type": "function_call_output", "status": "completed",
            "call_id": call_id, "output": output}


def output_accepted(item_id: str, previous_item_id: str | None, call_id: str, output: str) -> list[Event]:
    item = function_output_item(item_id, call_id, output)
    return [
        {"type": "conversation.item.added", "previous_item_id": previous_item_id, "item": item},
        {"type": "conversation.item.done", "previous_item_id": previous_item_id, "item": dict(item)},
    ]
