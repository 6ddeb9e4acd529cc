"""The settings of a Responses conversation: the client's functions, tool choice, the back-end it runs on. No I/O.

These are what the answer source (:mod:`.rounds`) runs with; a
client's config is validated into them by :mod:`.config` (the Live wire
hands it ``delegation.responses`` and reports the result back).
:class:`ResponsesError` is how the answer source refuses a command: the
wire turns it into its protocol's ``error`` event and the session goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kame.session.commands import CommandRefused
from kame.session.function_tools import FunctionTool


class ResponsesError(CommandRefused):
    """A Responses-delegation command that cannot be honoured: one ``error`` event; the session goes on."""


class DelegationConfigError(ResponsesError):
    """``delegation.responses`` cannot be honoured: one ``error`` event, nothing applied."""


@dataclass(frozen=True)
class BackendCatalog:
    """What the server offers a Responses delegation (from the back-end registry and MCP settings).

    ``tools_allowed`` names the back-ends that may be sent tools (a
    per-back-end setting: requests with tools never go to one that may
    not); ``model_override`` those whose model a client may choose (kind
    openai; a scripted back-end has no model). ``mcp_servers`` maps each
    operator-configured MCP server to its allowed tool names.
    """

    backends: Sequence[str]
    default: str | None
    tools_allowed: frozenset[str] = frozenset()
    model_override: frozenset[str] = frozenset()
    mcp_servers: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendTarget:
    """The back-end a delegation runs on, and the model sent to it (None: the back-end's own)."""

    backend: str
    model: str | None


@dataclass(frozen=True)
class McpServerRef:
    """An operator-configured MCP server enabled for this session (None: all its allowed tools)."""

    server_label: str
    allowed_tools: tuple[str, ...] | None = None

    def as_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "mcp", "server_label": self.server_label}
        if self.allowed_tools is not None:
            out["allowed_tools"] = list(self.allowed_tools)
        return out


@dataclass(frozen=True)
class ToolChoiceSpec:
    """``tool_choice``, resolved: a mode, optionally a subset of tools, or one forced tool.

    Tools are named ``function:NAME`` or ``mcp:SERVER:NAME`` internally so
    that a client function and an MCP tool of the same name stay apart.
    """

    mode: Literal["auto", "none", "required"] = "auto"
    allowed: tuple[str, ...] | None = None  # allowed_tools: only these are offered
    forced: str | None = None  # one tool that must be called
    raw: Any = "auto"  # what the client sent (echoed in snapshots)

    def chat_tool_choice(self, mcp_function_name: Callable[[str], str] | None = None) -> str | dict[str, Any]:
        """The chat-completions ``tool_choice`` (a forced client function, or a mode).

        ``mcp_function_name`` maps ``mcp:SERVER:NAME`` to the function name the
        tool loop gives that MCP tool; without it a forced MCP tool becomes
        ``required`` (the only tool on offer is that one, see :meth:`offers`).
        """
        if self.forced is not None and self.forced.startswith("function:"):
            return {"type": "function", "function": {"name": self.forced.removeprefix("function:")}}
        if self.forced is not None and mcp_function_name is not None:
            return {"type": "function", "function": {"name": mcp_function_name(self.forced)}}
        if self.forced is not None:
            return "required"
        return self.mode

    def offers(self, key: str) -> bool:
        """Whether a tool (``function:NAME`` / ``mcp:SERVER:NAME``) is offered to the back-end at all."""
        if self.mode == "none" and self.forced is None:
            return False
        if self.forced is not None:
            return key == self.forced
        return self.allowed is None or key in self.allowed

    def response_tool_choice(self) -> str | dict[str, Any]:
        """``tool_choice`` of the Responses snapshots (``Response.tool_choice``)."""
        if self.forced is not None and self.forced.startswith("function:"):
            return {"type": "function", "name": self.forced.removeprefix("function:")}
        if self.forced is not None:
            _, server, name = self.forced.split(":", 2)
            return {"type": "mcp", "server_label": server, "name": name}
        if self.allowed is not None:
            tools: list[dict[str, Any]] = []
            for key in self.allowed:
                if key.startswith("function:"):
                    tools.append({"type": "function", "name": key.removeprefix("function:")})
                else:
                    _, server, name = key.split(":", 2)
                    tools.append({"type": "mcp", "server_label": server, "name": name})
            return {"type": "allowed_tools", "mode": "required" if self.mode == "required" else "auto", "tools": tools}
        return self.mode


@dataclass(frozen=True)
class ResponsesDelegationSettings:
    """A validated ``delegation.responses``, resolved against the server's back-ends."""

    model: str
    target: BackendTarget
    instructions: str | None = None
    functions: tuple[FunctionTool, ...] = ()
    mcp_servers: tuple[McpServerRef, ...] = ()
    tool_choice: ToolChoiceSpec = ToolChoiceSpec()
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    #: Fields accepted and not used (for an ``info``), with the client's values.
    ignored: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def function(self, name: str) -> FunctionTool | None:
        return next((f for f in self.functions if f.name == name), None)

    def offered_functions(self) -> list[FunctionTool]:
        """Client functions the back-end is offered (``tool_choice`` applied)."""
        return [f for f in self.functions if self.tool_choice.offers(f"function:{f.name}")]

    def chat_tools(self) -> list[dict[str, Any]]:
        """The chat-completions ``tools`` of the client functions on offer."""
        return [f.chat_tool() for f in self.offered_functions()]

    def as_config(self) -> dict[str, Any]:
        """``delegation.responses`` as ``session.started`` / ``.updated`` report it (ignored fields omitted)."""
        out: dict[str, Any] = {"model": self.model, "instructions": self.instructions}
        out["tools"] = [f.as_config() for f in self.functions] + [m.as_config() for m in self.mcp_servers]
        out["tool_choice"] = self.tool_choice.raw
        out["parallel_tool_calls"] = self.parallel_tool_calls
        out["max_output_tokens"] = self.max_output_tokens
        return out
