"""Responses delegation on kame's back-ends: the round source and the catalog, from the registry.

The driver (:mod:`.responses_run`) asks for rounds through a ``RoundSource``;
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

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from kame.backend.registry import BackendRegistry
from kame.backend.tools import ToolSpec, TurnReport
from kame.server.wires.live.responses_config import BackendCatalog, FunctionSpec
from kame.server.wires.live.responses_run import RoundEnd, RoundRequest, RoundSource
from kame.server.wires.live.responses_stream import Usage

_EMPTY_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}


def tool_spec(function: FunctionSpec) -> ToolSpec:
    """A client function as the tool loop's spec (read-only never: it runs on the client, once)."""
    return ToolSpec(
        function.name,
        function.description or "",
        dict(function.parameters) if function.parameters is not None else dict(_EMPTY_SCHEMA),
        read_only=False,
    )


def registry_source(registry: BackendRegistry) -> RoundSource:
    """A round source that streams each round from the registry's tool-capable back-ends."""

    async def source(request: RoundRequest) -> AsyncIterator[Any]:
        specs = [tool_spec(f) for f in request.functions]
        report = TurnReport()
        stream = registry.stream_turn(
            request.backend,
            request.messages,
            tools=specs or None,
            tool_choice=request.tool_choice if specs else None,
            max_tokens=request.max_tokens,
            model=request.model,
            report=report,
        )
        async with stream:
            async for item in stream:
                yield item
        yield RoundEnd(report.finish_reason, usage_of(report))

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
