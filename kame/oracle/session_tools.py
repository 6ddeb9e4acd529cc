"""The function tools one session's oracle loop may use.

A session's tools come from several sources (the operator's MCP servers it
enabled, the functions its client defines on ``/v1/realtime``), each with
its own executor: :class:`RoutedTools` keeps them by source and routes a
call by tool name. The oracle loop asks its LLM through the tool loop
(:class:`~kame.backend.tool_loop.ToolLoop`) when the session has tools and
its back-end may be sent them; which tools a request is offered, and how
calls are shared between superseded requests, is
:class:`~kame.backend.speculation.SpeculativeCalls`'s business.
``include_arguments``: put call arguments into ``tool.*`` events (only when
the session records; arguments may hold personal data).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kame.backend.config import BackendConfig, ToolsConfig
from kame.backend.mcp_tools import McpToolbox, UnknownMcpServer
from kame.backend.speculation import SpeculativeCalls, ToolCallEvent, ToolObserver
from kame.backend.tool_loop import ToolExecutor, ToolLoopLimits
from kame.backend.tools import ToolCall, ToolResult, ToolSpec, refused


class RoutedTools:
    """Tools by source (``mcp``, ``client``, ...); a call goes to its source's executor (a ToolExecutor).

    A name defined by two sources goes to the first source that defined it.
    """

    def __init__(self) -> None:
        self._sources: dict[str, tuple[list[ToolSpec], ToolExecutor]] = {}

    def set(self, source: str, specs: Sequence[ToolSpec], executor: ToolExecutor) -> None:
        """Replace one source's tools (the next request sees the new set)."""
        if specs:
            self._sources[source] = (list(specs), executor)
        else:
            self._sources.pop(source, None)

    def source_of(self, name: str) -> str | None:
        for source, (specs, _) in self._sources.items():
            if any(s.name == name for s in specs):
                return source
        return None

    @property
    def specs(self) -> list[ToolSpec]:
        seen: set[str] = set()
        out: list[ToolSpec] = []
        for specs, _ in self._sources.values():
            for spec in specs:
                if spec.name not in seen:
                    seen.add(spec.name)
                    out.append(spec)
        return out

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        source = self.source_of(call.name)
        if source is None:
            return refused(call, f"no tool named {call.name!r} is available in this session")
        return await self._sources[source][1].execute(call, spec)


@dataclass
class SessionTools:
    calls: SpeculativeCalls
    routes: RoutedTools
    limits: ToolLoopLimits = field(default_factory=ToolLoopLimits)
    include_arguments: bool = False

    @classmethod
    def create(
        cls,
        limits: ToolLoopLimits | None = None,
        *,
        cache_ttl_s: float = 30.0,
        observer: ToolObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        include_arguments: bool = False,
    ) -> SessionTools:
        limits = limits or ToolLoopLimits()
        routes = RoutedTools()
        calls = SpeculativeCalls(routes, call_timeout_s=limits.call_timeout_s, cache_ttl_s=cache_ttl_s,
                                 observer=observer, clock=clock)
        return cls(calls, routes, limits, include_arguments)

    @property
    def specs(self) -> list[ToolSpec]:
        return self.routes.specs

    async def aclose(self) -> None:
        await self.calls.aclose()


SourceObserver = Callable[[ToolCallEvent, str], None]


class ToolCatalog:
    """Server-wide: the MCP servers and the tool settings; builds each session's :class:`SessionTools`.

    ``observer(event, source)`` sees every real execution of every session
    (``source``: ``mcp`` or ``client``), for metrics. Clients enable MCP
    servers by configured name only (:class:`~kame.backend.mcp_tools.UnknownMcpServer`
    otherwise).
    """

    def __init__(
        self,
        cfg: ToolsConfig,
        environ: Mapping[str, str],
        *,
        observer: SourceObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.observer = observer
        self.clock = clock
        self.mcp = McpToolbox(cfg, environ, clock=clock) if cfg.mcp_servers else None
        self.limits = ToolLoopLimits(
            max_rounds=cfg.max_rounds, call_timeout_s=cfg.call_timeout_s, max_output_chars=cfg.max_output_chars
        )

    @property
    def mcp_server_names(self) -> list[str]:
        return self.mcp.names if self.mcp is not None else []

    def new_session(self, *, include_arguments: bool = False) -> SessionTools:
        tools = SessionTools.create(
            self.limits, cache_ttl_s=self.cfg.cache_ttl_s, clock=self.clock, include_arguments=include_arguments
        )
        if self.observer is not None:
            observer = self.observer

            def observe(event: ToolCallEvent) -> None:
                observer(event, tools.routes.source_of(event.name) or "unknown")

            tools.calls.observer = observe
        return tools

    def mcp_servers_for(self, backend: BackendConfig | None, requested: Sequence[str] | None = None) -> list[str]:
        """The MCP servers a session gets (raises UnknownMcpServer for a name not configured)."""
        if self.mcp is None:
            if requested:
                raise UnknownMcpServer(requested[0], [])
            return []
        return self.mcp.servers_for(backend, requested)

    async def enable_mcp(self, tools: SessionTools, servers: Sequence[str]) -> list[ToolSpec]:
        """List these servers' allowed tools and make them the session's ``mcp`` source (unreachable ones: none)."""
        if self.mcp is None or not servers:
            tools.routes.set("mcp", [], _NoTools())
            return []
        found = await self.mcp.tools(servers)
        tools.routes.set("mcp", [t.spec for t in found], self.mcp.executor(found))
        return [t.spec for t in found]

    async def aclose(self) -> None:
        if self.mcp is not None:
            await self.mcp.aclose()


class _NoTools:
    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        return refused(call, "no such tool")
