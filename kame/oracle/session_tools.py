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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kame.backend.speculation import SpeculativeCalls, ToolObserver
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
