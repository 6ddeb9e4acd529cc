"""Functions the client runs: the tool loop's executor that asks the client and waits. Wire-independent.

On ``/v1/realtime`` (and the Live API) the client defines functions and
executes them itself. :class:`ClientFunctions` is the
:class:`~kame.backend.tool_loop.ToolExecutor` for them: each call gets a
call id of kame's own (ids the LLM writes may repeat across requests), is
handed to ``emit`` (the wire turns it into its own events, e.g. a
function-call response), and waits until :meth:`ClientFunctions.deliver`
brings the client's output. The wait is bounded by the tool loop's
per-call timeout; a call given up is forgotten, so a late output is
refused as unknown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from kame.backend.tools import ToolCall, ToolResult, ToolSpec


@dataclass(frozen=True)
class ClientCall:
    """A call the client must run: ``call_id`` is what the client answers with."""

    call_id: str
    name: str
    arguments: str
    read_only: bool


class UnknownCallId(KeyError):
    """An output for a call that is not waiting (never made, already answered, or given up)."""

    def __init__(self, call_id: str) -> None:
        super().__init__(
            f"no function call is waiting for call_id {call_id[:64]!r} (unknown, already answered, or timed out)"
        )
        self.call_id = call_id

    def __str__(self) -> str:
        return str(self.args[0])


class ClientFunctions:
    """The executor of one session's client-defined functions."""

    def __init__(self, emit: Callable[[ClientCall], None], new_call_id: Callable[[], str]) -> None:
        self._emit = emit
        self._new_call_id = new_call_id
        self._pending: dict[str, asyncio.Future[str]] = {}

    @property
    def pending_call_ids(self) -> list[str]:
        return list(self._pending)

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        call_id = self._new_call_id()
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            self._emit(ClientCall(call_id, call.name, call.arguments, spec.read_only))
            output = await future
        finally:
            self._pending.pop(call_id, None)
        return ToolResult(call.id, call.name, "ok", output)

    def deliver(self, call_id: str, output: str) -> None:
        """The client's output; raises :class:`UnknownCallId` if no call waits for it."""
        future = self._pending.get(call_id)
        if future is None or future.done():
            raise UnknownCallId(call_id)
        future.set_result(output)

    def cancel_all(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self._pending.clear()
