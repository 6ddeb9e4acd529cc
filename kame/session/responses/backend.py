"""Responses delegation on kame's back-ends: the round source and the catalog, from the registry.

The driver (:mod:`.rounds`) asks for rounds through a ``RoundSource``;
here it is bound to :meth:`kame.backend.registry.BackendRegistry.stream_turn`,
so a delegation gets everything other back-end requests get: caps, the
circuit breaker, the fallback, metrics, ``allow_tools`` gating. The
client's functions are offered as :class:`~kame.backend.tools.ToolSpec`
objects (never read-only: only the request after the user's turn, the
delegation, is offered them), the client's ``model`` goes to the primary
back-end, and the finish reason and token usage come back through a
:class:`~kame.backend.tools.TurnReport`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kame.backend.errors import BackendRequestError
from kame.backend.mcp_tools import McpTool, McpToolbox
from kame.backend.registry import BackendRegistry
from kame.backend.speculation import ToolCallEvent
from kame.backend.tools import ToolCall, ToolSpec, TurnReport
from kame.redaction import client_safe
from kame.session.answers import OracleAnswer
from kame.session.function_tools import FunctionTool
from kame.session.responses.rounds import (
    DEFAULT_FUNCTION_TIMEOUT_S,
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_MAX_ROUNDS,
    RoundEnd,
    RoundRequest,
    RoundSource,
    ServerTool,
    ServerTools,
)
from kame.session.responses.settings import BackendCatalog, ResponsesDelegationSettings
from kame.session.responses.source import ResponsesAnswerSource, SourceHooks, UseResponses
from kame.session.responses.stream import Usage

log = logging.getLogger(__name__)
_EMPTY_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}


def tool_spec(function: FunctionTool) -> ToolSpec:
    """A client function as the tool loop's spec (read-only never: it runs on the client, once)."""
    return ToolSpec(
        function.name,
        function.description or "",
        dict(function.parameters) if function.parameters is not None else dict(_EMPTY_SCHEMA),
        read_only=False,
    )


def registry_source(registry: BackendRegistry) -> RoundSource:
    """A round source that streams each round from the registry's tool-capable back-ends.

    Two things a provider may refuse are asked for once and then dropped for
    that back-end: usage (``stream_options.include_usage``: a 400 before any
    output asks again without it; responses then carry no usage) and the
    client's model name (a 404 before any output, the provider does not
    serve it: asked again with the back-end's own model, and a notice).
    Function tools a server refuses are the registry's business (it asks
    again without them, and sends none from then on); the session is told
    once per back-end (``RoundEnd.tools_notice``).
    """
    no_usage: set[str] = set()
    no_model: set[tuple[str, str]] = set()
    tools_told: set[str] = set()

    async def source(request: RoundRequest) -> AsyncIterator[Any]:
        specs = [tool_spec(f) for f in request.functions]
        notice: str | None = None
        for _attempt in range(3):
            report = TurnReport() if request.backend not in no_usage else None
            model = request.model if (request.backend, request.model or "") not in no_model else None
            stream = registry.stream_turn(
                request.backend,
                request.messages,
                tools=specs or None,
                tool_choice=request.tool_choice if specs else None,
                max_tokens=request.max_tokens,
                model=model,
                report=report,
            )
            produced = False
            try:
                async with stream:
                    async for item in stream:
                        produced = True
                        yield item
            except BackendRequestError as exc:
                if produced:
                    raise
                if model is not None and exc.status_code == 404:
                    log.info("back-end %s does not serve model %r: using its own", request.backend, model)
                    no_model.add((request.backend, model))
                    notice = (
                        f"back-end {request.backend!r} does not serve model {model!r}; it answers with its own model"
                    )
                    continue
                if report is not None and exc.status_code == 400:
                    log.info("back-end %s refused stream_options.include_usage: asking without it", request.backend)
                    no_usage.add(request.backend)
                    continue
                raise
            tools_notice: str | None = None
            if stream.tools_refused is not None and request.backend not in tools_told:
                tools_told.add(request.backend)
                tools_notice = (
                    f"back-end {request.backend!r} refuses function tools ({client_safe(stream.tools_refused, 200)}): "
                    "it answers without them"
                )
            if report is None:
                yield RoundEnd(None, None, notice, tools_notice)
            else:
                yield RoundEnd(report.finish_reason, usage_of(report), notice, tools_notice)
            return

    return source


def usage_of(report: TurnReport) -> Usage | None:
    """The round's usage, when the back-end reported any."""
    if report.prompt_tokens is None and report.completion_tokens is None:
        return None
    return Usage(
        report.prompt_tokens or 0,
        report.completion_tokens or 0,
        report.cached_tokens or 0,
        report.reasoning_tokens or 0,
    )


def registry_catalog(
    registry: BackendRegistry, mcp_servers: Mapping[str, Sequence[str]] | None = None
) -> BackendCatalog:
    """What a Responses delegation may name on this server.

    A client may choose the model of an OpenAI-compatible back-end (kind
    ``openai``); a scripted one has no model. ``mcp_servers``: the
    operator's MCP servers and their allowed tools.
    """
    names = registry.names
    kinds = {name: getattr(registry.get(name), "kind", "") for name in names}
    return BackendCatalog(
        backends=tuple(names),
        default=registry.default_name,
        tools_allowed=frozenset(n for n in names if registry.tools_allowed(n)),
        model_override=frozenset(n for n in names if kinds[n] == "openai"),
        mcp_servers=dict(mcp_servers or {}),
    )


def mcp_catalog(toolbox: McpToolbox) -> dict[str, list[str]]:
    """The operator's MCP servers and their allow-lists (what ``delegation.responses`` may enable)."""
    return {name: list(server.tools) for name, server in toolbox.cfg.mcp_servers.items()}


class McpServerTools:
    """The MCP servers a Responses delegation enabled, as :class:`~.rounds.ServerTools`.

    kame runs these calls itself (the client sees them as ``mcp_call``
    items); timeouts, output caps and secret redaction are the toolbox's
    (docs/tools.md). A server that is down contributes no tools.
    """

    def __init__(self, toolbox: McpToolbox) -> None:
        self.toolbox = toolbox
        self._tools: dict[str, McpTool] = {}

    async def offered(self, settings: ResponsesDelegationSettings) -> list[ServerTool]:
        servers = [ref.server_label for ref in settings.mcp_servers]
        if not servers:
            return []
        allowed = {ref.server_label: ref.allowed_tools for ref in settings.mcp_servers}
        out: list[ServerTool] = []
        for tool in await self.toolbox.tools(servers):
            names = allowed.get(tool.server)
            if names is not None and tool.tool not in names:
                continue
            if not settings.tool_choice.offers(f"mcp:{tool.server}:{tool.tool}"):
                continue
            spec = tool.spec
            self._tools[spec.name] = tool
            function = FunctionTool(spec.name, spec.description or None, dict(spec.parameters))
            out.append(ServerTool(spec.name, tool.server, tool.tool, function))
        return out

    async def call(self, tool: ServerTool, call_id: str, arguments: str) -> tuple[bool, str]:
        found = self._tools.get(tool.name)
        if found is None:
            return False, f"no MCP tool named {tool.name!r} is enabled"
        result = await self.toolbox.executor([found]).execute(ToolCall(call_id, tool.name, arguments), found.spec)
        return result.ok, result.output


@dataclass(frozen=True)
class ResponsesOffer:
    """Responses delegation as a server offers it, bound to its back-ends (docs/protocol.md section 5).

    A wire gets this, not the registry: what a client may name
    (``catalog``), the rounds (``source``), the MCP tools kame runs itself
    and the limits, so nothing under ``server/wires/`` holds a back-end.
    """

    catalog: BackendCatalog
    source: RoundSource
    server_tools: ServerTools | None = None
    on_tool_call: Callable[[ToolCallEvent, str], None] | None = None  #: tool metrics (event, label)
    function_timeout_s: float = DEFAULT_FUNCTION_TIMEOUT_S  #: ``tools.client_call_timeout_s``
    max_rounds: int = DEFAULT_MAX_ROUNDS  #: ``tools.max_rounds`` + 1 (the last one answers without tools)
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS  #: ``tools.max_client_output_chars``

    def answer_source(
        self,
        use: UseResponses,
        *,
        oracle_reset: Callable[[OracleAnswer], None],
        oracle_push: Callable[[Sequence[int]], None] | None = None,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]] | None = None,
    ) -> ResponsesAnswerSource:
        """The answer source a wire's ``use`` asks for, on these back-ends and the session's oracle and tasks."""
        hooks = SourceHooks(
            source=self.source,
            oracle_reset=oracle_reset,
            oracle_push=oracle_push,
            spawn=spawn,
            server_tools=self.server_tools,
            on_tool_call=self.on_tool_call,
            function_timeout_s=self.function_timeout_s,
            max_rounds=self.max_rounds,
            max_output_chars=self.max_output_chars,
        )
        return ResponsesAnswerSource.start(use, hooks)


def responses_offer(
    registry: BackendRegistry,
    toolbox: McpToolbox | None = None,
    on_tool_call: Callable[[ToolCallEvent, str], None] | None = None,
    *,
    function_timeout_s: float = DEFAULT_FUNCTION_TIMEOUT_S,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> ResponsesOffer:
    """Responses delegation on this registry and these MCP servers."""
    mcp = mcp_catalog(toolbox) if toolbox is not None else {}
    return ResponsesOffer(
        catalog=registry_catalog(registry, mcp),
        source=registry_source(registry),
        server_tools=McpServerTools(toolbox) if toolbox is not None else None,
        on_tool_call=on_tool_call,
        function_timeout_s=function_timeout_s,
        max_rounds=max_rounds,
        max_output_chars=max_output_chars,
    )
