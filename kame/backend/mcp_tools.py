"""Server-side tools from operator-configured MCP servers, through the official ``mcp`` SDK.

The operator configures servers (``tools.mcp_servers``) with an allow-list, read-only tools, a timeout
and an output cap; sessions may enable them by name but can never add a server or a URL.
:class:`McpConnection` (one per server, shared by all sessions) connects lazily in its own task (the
SDK's context managers must be entered and left in one task) and reconnects with a backoff; a crashed
or hung server fails its calls (results the LLM reads), never a session. :class:`McpToolbox` picks a
session's servers and gives their :class:`~kame.backend.tools.ToolSpec` list and a routing
:class:`~kame.backend.tool_loop.ToolExecutor`. Secrets (``env_from``, ``bearer_token_env``) are read
when connecting and redacted from every error, log line and tool output; the child's stderr goes to a
private temporary file, and only the variables named in the config reach the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kame.backend.config import BackendConfig, McpServerConfig, ToolsConfig
from kame.backend.errors import error_detail
from kame.backend.tools import ToolCall, ToolResult, ToolSpec, cap_output, failed, refused, timed_out

log = logging.getLogger(__name__)


class UnknownMcpServer(KeyError):
    """A session asked for an MCP server that is not configured."""

    def __init__(self, name: str, valid: Iterable[str]) -> None:
        names = ", ".join(valid) or "(none configured)"
        super().__init__(f"unknown MCP server {name!r}; configured: {names}")
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])


class McpUnavailable(Exception):
    """Connecting to (or listing the tools of) an MCP server failed; the message is redacted."""


@dataclass(frozen=True)
class McpTool:
    """One allowed tool of one server, as offered to the LLM."""

    server: str
    tool: str  #: the name on the MCP server
    spec: ToolSpec  #: the name the LLM sees may differ (prefixed on a clash)


def text_of_result(result: Any) -> str:
    """A tool result as text for the LLM: text blocks joined, other blocks named, else structured content."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'content'} omitted]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


class McpConnection:
    """One configured MCP server, connected on demand, shared by every session."""

    def __init__(
        self,
        name: str,
        cfg: McpServerConfig,
        environ: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.monotonic,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self._environ = environ
        self._clock = clock
        self._max_backoff_s = max_backoff_s
        self._session: Any = None
        self._tools: list[Any] | None = None
        self._owner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""
        self.connects = 0
        self.closed = False

    # ------------------------------------------------------------------ secrets

    def _child_env(self) -> dict[str, str]:
        env = dict(self.cfg.env)
        for child, source in self.cfg.env_from.items():
            value = self._environ.get(source)
            if value is not None:
                env[child] = value
        return env

    def _secrets(self) -> list[str]:
        names = list(self.cfg.env_from.values()) + ([self.cfg.bearer_token_env] if self.cfg.bearer_token_env else [])
        return [v for n in names if (v := self._environ.get(n))] + [v for v in self.cfg.env.values() if len(v) >= 8]

    def redact(self, text: str) -> str:
        return error_detail(text, self._secrets())

    # ------------------------------------------------------------------ connection

    @property
    def connected(self) -> bool:
        return self._session is not None

    async def _connect(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._session is not None:
                return
            if self.closed:
                raise McpUnavailable(f"MCP server {self.name!r}: closed")
            now = self._clock()
            if now < self._retry_at:
                raise McpUnavailable(
                    f"MCP server {self.name!r} unavailable ({self._last_error}); retry in {self._retry_at - now:.1f} s"
                )
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            self._stop = asyncio.Event()
            self._owner = loop.create_task(self._own(self._ready, self._stop), name=f"kame-mcp-{self.name}")
            try:
                await asyncio.wait_for(asyncio.shield(self._ready), self.cfg.connect_timeout_s)
            except asyncio.TimeoutError:
                self._fail_connect(f"no answer within {self.cfg.connect_timeout_s:g} s")
                await self._stop_owner()
                raise McpUnavailable(f"MCP server {self.name!r}: {self._last_error}") from None
            except McpUnavailable as exc:
                self._fail_connect(str(exc))
                await self._stop_owner()
                raise McpUnavailable(f"MCP server {self.name!r}: {self._last_error}") from None
            self._failures = 0
            self.connects += 1

    def _fail_connect(self, why: str) -> None:
        self._failures += 1
        self._last_error = self.redact(why)
        backoff = min(self._max_backoff_s, 0.5 * 2 ** (self._failures - 1))
        self._retry_at = self._clock() + backoff
        log.warning("MCP server %s: cannot connect (%s); next try in %.1f s", self.name, self._last_error, backoff)

    async def _own(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        """Owner task: enter the SDK's contexts, publish the session, wait, leave them in the same task."""
        from mcp.client.session import ClientSession

        errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # the child's stderr: never in our logs
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._enter_transport(stack, errlog)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listing = await session.list_tools()
                self._tools = list(listing.tools)
                self._session = session
                if not ready.done():
                    ready.set_result(None)
                await stop.wait()
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # noqa: BLE001 - a broken server fails its calls, never the session
            why = _describe(exc)
            if not ready.done():
                ready.set_exception(McpUnavailable(why))
            else:
                log.warning("MCP server %s: connection lost (%s)", self.name, self.redact(why))
        finally:
            self._session = None
            errlog.close()
            if not ready.done():
                ready.set_exception(McpUnavailable("connection closed"))

    async def _enter_transport(self, stack: contextlib.AsyncExitStack, errlog: Any) -> tuple[Any, Any]:
        if self.cfg.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=self.cfg.command, args=list(self.cfg.args), env=self._child_env(), cwd=self.cfg.cwd
            )
            streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            headers = {}
            if self.cfg.bearer_token_env and (token := self._environ.get(self.cfg.bearer_token_env)):
                headers["Authorization"] = f"Bearer {token}"
            client = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(self.cfg.timeout_s, read=300.0))
            )
            assert self.cfg.url is not None
            streams = await stack.enter_async_context(streamable_http_client(self.cfg.url, http_client=client))
        return streams[0], streams[1]

    async def _stop_owner(self) -> None:
        owner, self._owner = self._owner, None
        if self._stop is not None:
            self._stop.set()
        if owner is not None and not owner.done():
            try:
                await asyncio.wait_for(asyncio.shield(owner), 5.0)
            except (asyncio.TimeoutError, Exception):
                owner.cancel()
                with contextlib.suppress(BaseException):
                    await owner
        self._session = None

    async def _broken(self, why: str) -> None:
        """The connection failed under a call: drop it; the next call reconnects (with backoff)."""
        self._fail_connect(why)
        await self._stop_owner()

    # ------------------------------------------------------------------ use

    async def list_tools(self) -> list[McpTool]:
        """The allowed tools of this server (connects if needed; raises :class:`McpUnavailable`)."""
        await self._connect()
        allowed = set(self.cfg.tools)
        read_only = set(self.cfg.read_only)
        out = []
        for tool in self._tools or []:
            if tool.name not in allowed:
                continue
            schema = dict(getattr(tool, "input_schema", None) or {"type": "object", "properties": {}})
            schema.pop("title", None)
            try:
                spec = ToolSpec(tool.name, tool.description or "", schema, read_only=tool.name in read_only)
            except ValueError as exc:
                log.warning("MCP server %s: tool %r not offered (%s)", self.name, tool.name, exc)
                continue
            out.append(McpTool(self.name, tool.name, spec))
        return out

    async def call(self, call: ToolCall, tool: str) -> ToolResult:
        """Run one call; every failure becomes a result (secrets redacted)."""
        try:
            arguments = call.parsed_arguments()
        except ValueError:
            return failed(call, "the arguments are not a JSON object")
        if tool not in self.cfg.tools:
            return refused(call, f"tool {tool!r} is not allowed on MCP server {self.name!r}")
        try:
            await self._connect()
        except McpUnavailable as exc:
            return failed(call, self.redact(str(exc)))
        session = self._session
        if session is None:
            return failed(call, f"MCP server {self.name!r}: not connected")
        try:
            result = await asyncio.wait_for(session.call_tool(tool, arguments), self.cfg.timeout_s)
        except asyncio.TimeoutError:
            log.warning("MCP server %s: %s timed out after %g s", self.name, tool, self.cfg.timeout_s)
            return timed_out(call, self.cfg.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            why = self.redact(_describe(exc))
            if "closed" in why.lower() or isinstance(exc, (OSError, EOFError)):
                await self._broken(why)
            log.warning("MCP server %s: %s failed (%s)", self.name, tool, why)
            return failed(call, f"MCP server {self.name!r}: {why}")
        text = cap_output(self.redact_output(text_of_result(result)), self.cfg.max_output_chars)
        if getattr(result, "is_error", False):
            return ToolResult(call.id, call.name, "error", text or "the tool reported an error")
        return ToolResult(call.id, call.name, "ok", text)

    def redact_output(self, text: str) -> str:
        """Tool output with the server's secrets removed (not shortened: the cap comes after)."""
        for secret in self._secrets():
            text = text.replace(secret, "***")
        return text

    async def aclose(self) -> None:
        self.closed = True
        await self._stop_owner()


class McpExecutor:
    """Routes the calls of one session's MCP tools to their servers (a ToolExecutor)."""

    def __init__(self, tools: Sequence[McpTool], connections: Mapping[str, McpConnection]) -> None:
        self._by_name = {t.spec.name: t for t in tools}
        self._connections = connections

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        tool = self._by_name.get(call.name)
        if tool is None:
            return refused(call, f"no MCP tool named {call.name!r} is enabled for this session")
        return await self._connections[tool.server].call(call, tool.tool)


class _RedactingFilter(logging.Filter):
    """Removes the servers' secrets from what the ``mcp`` SDK logs (it quotes a server's bad output lines)."""

    def __init__(self, secrets: Callable[[], list[str]]) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self._secrets()
        if not secrets:
            return True
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
            record.exc_info = None
            record.exc_text = None
        for secret in secrets:
            text = text.replace(secret, "***")
        record.msg, record.args = text, ()
        return True


def _sdk_loggers() -> list[logging.Logger]:
    import mcp.client.session  # noqa: F401  (their loggers exist once imported)
    import mcp.client.stdio  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401

    names = [n for n in logging.root.manager.loggerDict if n == "mcp" or n.startswith("mcp.")]
    return [logging.getLogger(n) for n in names]


class McpToolbox:
    """Every configured MCP server of one kame server."""

    def __init__(
        self,
        cfg: ToolsConfig,
        environ: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.connections = {
            name: McpConnection(name, server, environ, clock=clock) for name, server in cfg.mcp_servers.items()
        }
        self._filter = _RedactingFilter(lambda: [v for c in self.connections.values() for v in c._secrets()])
        self._loggers = _sdk_loggers() if self.connections else []
        for logger in self._loggers:
            logger.addFilter(self._filter)

    @property
    def names(self) -> list[str]:
        return list(self.connections)

    def servers_for(self, backend: BackendConfig | None, requested: Sequence[str] | None = None) -> list[str]:
        """A session's servers: server-wide ``enabled`` ones, its back-end's, and those it asked for by name."""
        chosen = [n for n, c in self.cfg.mcp_servers.items() if c.enabled]
        for name in [*(backend.mcp_servers if backend is not None else []), *(requested or [])]:
            if name not in self.connections:
                raise UnknownMcpServer(name, self.connections)
            if name not in chosen:
                chosen.append(name)
        return chosen

    async def tools(self, servers: Sequence[str]) -> list[McpTool]:
        """The allowed tools of these servers; a server that cannot be reached contributes none."""
        results = await asyncio.gather(*(self.connections[s].list_tools() for s in servers), return_exceptions=True)
        found: list[McpTool] = []
        for server, result in zip(servers, results):
            if isinstance(result, BaseException):
                if not isinstance(result, McpUnavailable):
                    log.warning("MCP server %s: listing failed (%s)", server, type(result).__name__)
                continue
            found.extend(result)
        counts: dict[str, int] = {}
        for t in found:
            counts[t.spec.name] = counts.get(t.spec.name, 0) + 1
        out = []
        for t in found:  # two servers with one tool name: both get the server's name in front
            if counts[t.spec.name] > 1:
                spec = ToolSpec(f"{t.server}__{t.tool}"[:64], t.spec.description, t.spec.parameters, t.spec.read_only)
                t = McpTool(t.server, t.tool, spec)
            out.append(t)
        return out

    def executor(self, tools: Sequence[McpTool]) -> McpExecutor:
        return McpExecutor(tools, self.connections)

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.connections.values()), return_exceptions=True)
        for logger in self._loggers:
            logger.removeFilter(self._filter)


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # an exception group (anyio task groups wrap the cause)
    if isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
        return _describe(inner[0])
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
