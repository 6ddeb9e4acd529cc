"""The one parser and validator of a client's function tools and their outputs, for every wire and source. No I/O.

``/v1/realtime``'s ``session.tools`` (:mod:`kame.server.wires.realtime.functions`) and the Live API's
``delegation.responses.tools`` (:mod:`kame.session.responses.config`) are checked here, with one set of
limits (the larger of the two sets the wires had, so nothing a client sent before is refused now), and so
are the outputs a client sends back (Realtime's ``function_call_output``, Live's ``response.item.create``).
Each protocol names its faults in its own words (``invalid_value`` vs ``invalid_type``, ...): a wire passes
its :class:`ToolErrors`; what is checked, and the limits, are the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kame.backend.tools import ToolDefinitionError, ToolSpec
from kame.session.commands import CommandRefused

#: Function tools in one list.
MAX_TOOLS = 128
#: Characters of one tool's description.
MAX_DESCRIPTION_CHARS = 4096
#: Characters of one tool's parameters schema, as JSON.
MAX_SCHEMA_CHARS = 32768
#: Characters of one function output a client sends back (the default of ``tools.max_client_output_chars``).
MAX_OUTPUT_CHARS = 32768


@dataclass(frozen=True)
class ToolErrors:
    """How a protocol names the faults of a client's tools: its codes, and the exception its wire turns into an
    ``error`` event (``raise_(code, message, param)``)."""

    error: Callable[[str, str, str | None], CommandRefused]
    wrong_type: str = "invalid_value"  #: a field of the wrong JSON type
    too_long: str = "invalid_value"  #: a string (description, schema) beyond its limit
    too_many: str = "invalid_value"  #: a list beyond its limit
    missing: str = "missing_required_parameter"  #: a required field absent (or not a string)
    #: Where a bad name or a schema that is not an object is blamed: the tool (Realtime) or its field (Live).
    schema_on_tool: bool = False

    def raise_(self, code: str, message: str, param: str | None) -> CommandRefused:
        return self.error(code, message, param)


@dataclass(frozen=True)
class FunctionTool:
    """One function tool the client defines and runs itself."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None  #: None: no parameters (an empty object schema)
    strict: bool | None = None
    read_only: bool = False  #: kame's extension: no side effects, may run while the user still talks

    def spec(self) -> ToolSpec:
        """The back-end's tool (:class:`~kame.backend.tools.ToolSpec`)."""
        parameters = dict(self.parameters) if self.parameters is not None else {"type": "object", "properties": {}}
        return ToolSpec(self.name, self.description or "", parameters, read_only=self.read_only)

    def chat_tool(self) -> dict[str, Any]:
        """The chat-completions ``tools`` entry."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = (
            dict(self.parameters) if self.parameters is not None else {"type": "object", "properties": {}}
        )
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}

    def as_config(self) -> dict[str, Any]:
        """The Live ``FunctionTool`` shape (for ``session.started`` / ``.updated``)."""
        out: dict[str, Any] = {"type": "function", "name": self.name}
        if self.description is not None:
            out["description"] = self.description
        if self.parameters is not None:
            out["parameters"] = dict(self.parameters)
        if self.strict is not None:
            out["strict"] = self.strict
        return out


def tool_list(value: object, param: str, errors: ToolErrors) -> Sequence[Any]:
    """A list of tools (at most :data:`MAX_TOOLS`)."""
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise errors.raise_(errors.wrong_type, f"{param} must be a list of tools", param)
    if len(value) > MAX_TOOLS:
        raise errors.raise_(errors.too_many, f"{param}: at most {MAX_TOOLS} tools", param)
    return value


def function_tool(tool: Mapping[str, Any], where: str, errors: ToolErrors, *, read_only: bool = False) -> FunctionTool:
    """One ``{"type": "function", ...}`` tool: its name, description, parameters and ``strict``."""
    name = tool.get("name")
    if not isinstance(name, str):
        raise errors.raise_(errors.missing, f"{where}.name must be a string", f"{where}.name")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise errors.raise_(errors.wrong_type, f"{where}.description must be a string", f"{where}.description")
    if description is not None and len(description) > MAX_DESCRIPTION_CHARS:
        raise errors.raise_(errors.too_long, f"{where}.description: a string of at most {MAX_DESCRIPTION_CHARS} "
                            "characters", f"{where}.description")
    parameters = tool.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise errors.raise_(errors.wrong_type, f"{where}.parameters must be a JSON Schema object",
                                f"{where}.parameters")
        try:
            size = len(json.dumps(parameters))
        except (TypeError, ValueError):
            raise errors.raise_("invalid_value", f"{where}.parameters is not valid JSON", f"{where}.parameters") from None
        if size > MAX_SCHEMA_CHARS:
            raise errors.raise_(errors.too_long, f"{where}.parameters: a JSON Schema object of at most "
                                f"{MAX_SCHEMA_CHARS} characters", f"{where}.parameters")
    strict = tool.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise errors.raise_(errors.wrong_type, f"{where}.strict must be a boolean", f"{where}.strict")
    out = FunctionTool(name, description, dict(parameters) if parameters is not None else None, strict, read_only)
    try:
        out.spec()  # the name and the schema's type, as every provider wants them
    except ToolDefinitionError as exc:
        schema = parameters is not None and parameters.get("type", "object") != "object"
        param = where if errors.schema_on_tool else f"{where}.parameters" if schema else f"{where}.name"
        raise errors.raise_("invalid_value", f"{where}: {exc}", param) from None
    return out


class Named(Protocol):
    @property
    def name(self) -> str: ...


def unique(tools: Sequence[Named], param: str, errors: ToolErrors) -> None:
    """Two tools of one list never share a name."""
    names = [t.name for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise errors.raise_("invalid_value", f"{param}: duplicate function name(s) {', '.join(dupes)}", param)


def function_output(output: str, max_chars: int, errors: ToolErrors, param: str = "item.output") -> str:
    """A function's output as the client sent it back (at most ``max_chars`` characters)."""
    if len(output) > max_chars:
        raise errors.raise_("output_too_large", f"{param}: {len(output)} characters; at most {max_chars}", param)
    return output
