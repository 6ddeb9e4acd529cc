"""The function tools one session's oracle loop may use.

The oracle loop asks its LLM through the tool loop
(:class:`~kame.backend.tool_loop.ToolLoop`) when the session has tools and
its back-end may be sent them; which tools a request is offered, and how
calls are shared between superseded requests, is
:class:`~kame.backend.speculation.SpeculativeCalls`'s business.
``include_arguments``: put call arguments into ``tool.*`` events (only when
the session records; arguments may hold personal data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kame.backend.speculation import SpeculativeCalls
from kame.backend.tool_loop import ToolLoopLimits
from kame.backend.tools import ToolSpec


@dataclass
class SessionTools:
    specs: list[ToolSpec]
    calls: SpeculativeCalls
    limits: ToolLoopLimits = field(default_factory=ToolLoopLimits)
    include_arguments: bool = False

    def set_specs(self, specs: Sequence[ToolSpec]) -> None:
        """Replace the session's tools (the next request sees the new set)."""
        self.specs = list(specs)

    async def aclose(self) -> None:
        await self.calls.aclose()
