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

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kame.backend.client_functions import ClientCall, ClientFunctions
from kame.backend.config import BackendConfig, ToolsConfig
from kame.backend.mcp_tools import McpToolbox, UnknownMcpServer
from kame.backend.speculation import SpeculativeCalls, ToolCallEvent, ToolObserver
from kame.backend.tool_loop import ToolExecutor, ToolLoopLimits
from kame.backend.tools import ToolCall, ToolResult, ToolSpec, refused

log = logging.getLogger(__name__)


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
    #: auto, none, required or a tool name (a name not offered to a request counts as auto for it)
    tool_choice: str | None = None

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

    async def warm(self, backends: Mapping[str, BackendConfig]) -> None:
        """Connect the servers sessions will use (server-wide ones and the back-ends'), so the first session waits less."""
        if self.mcp is None:
            return
        names: list[str] = [n for n, c in self.cfg.mcp_servers.items() if c.enabled]
        for backend in backends.values():
            names += [n for n in backend.mcp_servers if n not in names]
        await self.mcp.tools(names)

    async def aclose(self) -> None:
        if self.mcp is not None:
            await self.mcp.aclose()


class SessionToolState:
    """One session's tools kept in line with its settings: the client's functions, its MCP servers, tool_choice.

    Owned by the session's pipeline. ``emit`` hands a call of a
    client-defined function to the wire (as a pipeline event);
    :meth:`deliver` brings the client's output back. MCP servers are listed
    in a task of their own (the first listing of a server starts it), so
    applying settings never waits; requests made before the listing ends
    simply do not see those tools yet.
    """

    def __init__(
        self,
        catalog: ToolCatalog,
        *,
        emit: Callable[[ClientCall], None],
        new_call_id: Callable[[], str],
        include_arguments: bool = False,
    ) -> None:
        self.catalog = catalog
        self.tools = catalog.new_session(include_arguments=include_arguments)
        self.client = ClientFunctions(emit, new_call_id)
        self._servers: list[str] | None = None
        self._listing: asyncio.Task[None] | None = None
        self.mcp_ready = asyncio.Event()

    def apply(
        self,
        *,
        functions: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        mcp_servers: Sequence[str] | None = None,
        backend: BackendConfig | None = None,
    ) -> None:
        """New settings (raises UnknownMcpServer for a server name that is not configured)."""
        servers = self.catalog.mcp_servers_for(backend, mcp_servers)
        self.tools.routes.set("client", list(functions), self.client)
        self.tools.tool_choice = tool_choice
        if servers != self._servers:
            self._servers = servers
            if self._listing is not None and not self._listing.done():
                self._listing.cancel()
            self.mcp_ready.clear()
            self._listing = asyncio.get_running_loop().create_task(self._list(servers), name="kame-mcp-list")

    async def _list(self, servers: list[str]) -> None:
        try:
            await self.catalog.enable_mcp(self.tools, servers)
        except Exception:  # noqa: BLE001 - a server that cannot be listed offers nothing
            log.exception("listing MCP tools failed")
        finally:
            self.mcp_ready.set()

    def deliver(self, call_id: str, output: str) -> None:
        """The client's output for one of its functions (raises UnknownCallId)."""
        self.client.deliver(call_id, output)

    async def aclose(self) -> None:
        if self._listing is not None and not self._listing.done():
            self._listing.cancel()
            with contextlib.suppress(BaseException):
                await self._listing
        self.client.cancel_all()
        await self.tools.aclose()


class _NoTools:
    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        return refused(call, "no such tool")
