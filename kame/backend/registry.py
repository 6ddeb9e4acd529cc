"""Named back-ends with caps, circuit breakers, fallbacks and metrics.

Clients (sessions, HTTP requests) pick a back-end by NAME only; URLs and
keys stay in the server's configuration. Each :meth:`BackendRegistry.stream`
call goes through:

1. the global caps (``llm``), then, per back-end tried:
2. the breaker (open: skip to the fallback),
3. the back-end's own caps (no slot within ``max_wait_s``: skip to the fallback),
4. the request; an error before the first chunk also moves on to the fallback.

A server that refuses a request because of its function tools (HTTP 400
from vLLM without ``--enable-auto-tool-choice``, see
:mod:`kame.backend.tool_refusal`) marks that back-end tool-less for the
process: one warning, one ``tools_refused`` event to the observers, the same
request asked again at once without tools (the turn is still answered), and
every later request sent without them (no retry on every turn: KAME asks
again every few words). :meth:`BackendRegistry.tools_refused` tells callers.

Only one fallback hop is taken (the fallback's own fallback is not used).
Once a chunk has been yielded the answer is committed to that back-end: a
later error is raised to the consumer, who is already speaking it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kame.backend.base import (
    BackendHealth,
    LlmBackend,
    MessageLike,
    ToolCapableBackend,
    has_tool_rounds,
    normalize_messages,
    normalize_turn_messages,
)
from kame.backend.breaker import CircuitBreaker, Ticket
from kame.backend.config import BackendConfig, LlmConfig
from kame.backend.errors import (
    BackendBusy,
    BackendCircuitOpen,
    BackendError,
    BackendToolsNotAllowed,
    BackendToolsRefused,
    UnknownBackend,
)
from kame.backend.limits import Busy, Caps
from kame.backend.resolve import ResolvedBackends, resolve_backends
from kame.backend.stats import BackendEvent, Observer, StatsCollector
from kame.backend.tools import ToolCallDelta

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from kame.backend.tools import TurnOptions
    from kame.config import KameConfig

log = logging.getLogger(__name__)


def build_backend(name: str, cfg: BackendConfig, environ: Mapping[str, str]) -> LlmBackend:
    """The back-end object for one resolved config."""
    if cfg.kind == "scripted":
        from kame.backend.scripted import ScriptedBackend

        return ScriptedBackend(name, cfg)
    from kame.backend.openai_backend import OpenAIBackend

    return OpenAIBackend(name, cfg, environ)


@dataclass
class _Entry:
    name: str
    cfg: BackendConfig
    backend: LlmBackend
    caps: Caps
    breaker: CircuitBreaker


_Stream = TypeVar("_Stream", bound="ReplyStream")


class ReplyStream:
    """The text chunks of one answer, plus who gave it.

    Iterate it (``async for chunk in reply``); stop it early with
    :meth:`aclose`, by leaving ``async with`` or by cancelling the task
    that iterates: each closes the HTTP stream at once.
    """

    def __init__(self, requested: str) -> None:
        self.requested = requested
        self.backend: str | None = None  # the back-end whose answer this is (set with the first chunk)
        self.fell_back = False
        self.ttft_s: float | None = None
        #: the server's reason when this answer went without the tools it was asked with (refused)
        self.tools_refused: str | None = None
        self._gen: AsyncGenerator[Any, None] | None = None

    def _attach(self: _Stream, gen: AsyncGenerator[Any, None]) -> _Stream:
        self._gen = gen
        return self

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> str:
        assert self._gen is not None
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()

    async def __aenter__(self) -> ReplyStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def text(self) -> str:
        """The whole answer (for tests and non-streaming callers)."""
        async with self:
            return "".join([chunk async for chunk in self])


class TurnStream(ReplyStream):
    """One LLM turn with tools: text chunks (``str``) and :class:`ToolCallDelta` pieces."""

    async def __anext__(self) -> str | ToolCallDelta:  # type: ignore[override]
        assert self._gen is not None
        return await self._gen.__anext__()

    def __aiter__(self) -> TurnStream:
        return self


class BackendRegistry:
    """All configured back-ends of one server; create with :meth:`from_config`."""

    def __init__(
        self,
        resolved: ResolvedBackends,
        *,
        environ: Mapping[str, str] | None = None,
        llm: LlmConfig | None = None,
        observers: Iterable[Observer] = (),
        clock: Callable[[], float] = time.monotonic,
        backends: Mapping[str, LlmBackend] | None = None,
    ) -> None:
        """``backends`` may supply ready objects by name (tests); the rest are built from config."""
        environ = os.environ if environ is None else environ
        llm = llm or LlmConfig()
        self.default_name = resolved.default
        self.stats = StatsCollector()
        self._observers: list[Observer] = [self.stats, *observers]
        self._clock = clock
        self._global_caps = Caps(
            max_concurrent=llm.max_concurrent_requests,
            max_requests_per_s=llm.max_requests_per_s,
            burst=llm.burst,
            max_wait_s=llm.max_wait_s,
            clock=clock,
        )
        self._entries: dict[str, _Entry] = {}
        self._tools_refused: dict[str, str] = {}  # back-end -> the server's reason
        for name, cfg in resolved.backends.items():
            backend = (backends or {}).get(name) or build_backend(name, cfg, environ)
            self._entries[name] = _Entry(name, cfg, backend, self._caps_of(cfg), self._breaker_of(name, cfg))

    @classmethod
    def from_config(
        cls,
        cfg: KameConfig,
        environ: Mapping[str, str] | None = None,
        *,
        observers: Iterable[Observer] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> BackendRegistry:
        """Resolve ``cfg.backends`` + ``KAME_LLM_*`` from ``environ`` (default ``os.environ``) and build them."""
        environ = os.environ if environ is None else environ
        resolved = resolve_backends(cfg, environ)
        return cls(resolved, environ=environ, llm=cfg.llm, observers=observers, clock=clock)

    def _caps_of(self, cfg: BackendConfig) -> Caps:
        c = cfg.caps
        return Caps(
            max_concurrent=c.max_concurrent,
            max_requests_per_s=c.max_requests_per_s,
            burst=c.burst,
            max_wait_s=c.max_wait_s,
            clock=self._clock,
        )

    def _breaker_of(self, name: str, cfg: BackendConfig) -> CircuitBreaker:
        b = cfg.breaker

        def changed(state: str) -> None:
            level = logging.WARNING if state == "open" else logging.INFO
            log.log(level, "back-end %s: circuit breaker %s", name, state.replace("_", "-"))
            self._emit(BackendEvent("breaker", name, breaker_state=state))

        return CircuitBreaker(
            failure_threshold=b.failure_threshold,
            cooldown_s=b.cooldown_s,
            backoff_factor=b.backoff_factor,
            max_cooldown_s=b.max_cooldown_s,
            enabled=b.enabled,
            clock=self._clock,
            on_change=changed,
        )

    # ------------------------------------------------------------------ lookup

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def resolve_name(self, name: str | None) -> str:
        """``name`` itself if configured, the default for None; else :class:`UnknownBackend`."""
        if name is None:
            if self.default_name is None:
                raise UnknownBackend(None, self._entries)
            return self.default_name
        if name not in self._entries:
            raise UnknownBackend(name, self._entries)
        return name

    def get(self, name: str | None) -> LlmBackend:
        """The raw back-end object (no caps, breaker or fallback)."""
        return self._entries[self.resolve_name(name)].backend

    def _emit(self, event: BackendEvent) -> None:
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # an exporter bug must not break answers
                log.exception("back-end observer failed on %s", event.kind)

    # ------------------------------------------------------------------ streaming

    def stream(
        self,
        name: str | None,
        messages: Sequence[MessageLike],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> ReplyStream:
        """Start an answer from back-end ``name`` (None: the default).

        Raises :class:`UnknownBackend` at once for a bad name; everything else
        (:class:`~kame.backend.errors.BackendError` subclasses) surfaces while iterating.
        """
        resolved = self.resolve_name(name)
        msgs = normalize_messages(messages)
        reply = ReplyStream(resolved)
        opts = {"max_tokens": max_tokens, "temperature": temperature}
        return reply._attach(self._run(reply, resolved, msgs, opts))

    def config_of(self, name: str | None) -> BackendConfig | None:
        """The resolved config of back-end ``name`` (None: the default), or None if it is not configured."""
        try:
            return self._entries[self.resolve_name(name)].cfg
        except (KeyError, UnknownBackend):
            return None

    def tools_allowed(self, name: str | None) -> bool:
        """May requests with function tools go to back-end ``name`` (its ``allow_tools``)?

        The configuration's answer: a back-end whose server refused tools
        still says True here (sessions may declare functions; they are just
        not offered), see :meth:`tools_refused`.
        """
        entry = self._entries[self.resolve_name(name)]
        return entry.cfg.tools_allowed() and isinstance(entry.backend, ToolCapableBackend)

    def tools_refused(self, name: str | None) -> str | None:
        """The server's reason if back-end ``name`` refused function tools in this process (then its
        requests go without them), else None."""
        try:
            return self._tools_refused.get(self.resolve_name(name))
        except UnknownBackend:
            return None

    def _mark_tools_refused(self, entry: _Entry, requested: str, exc: BackendToolsRefused) -> None:
        if entry.name in self._tools_refused:
            return  # a concurrent request was refused first: one log line, one event
        self._tools_refused[entry.name] = exc.reason or str(exc)
        log.warning(
            "back-end %s: the server (%s) refuses function tools: %s; its requests go without tools from now on "
            "(start the server with tool calling on, e.g. vLLM --enable-auto-tool-choice --tool-call-parser, "
            "and restart kame; or set backends.%s.allow_tools: false)",
            entry.name, exc.server, exc.reason or "(no message)", entry.name,
        )
        self._emit(BackendEvent("tools_refused", entry.name, requested=requested, error=exc.reason or exc.kind))

    def stream_turn(self, name: str | None, messages: Sequence[Any], **options: Unpack[TurnOptions]) -> TurnStream:
        """Like :meth:`stream`, for one turn of the tool loop (``messages`` may hold tool rounds).

        With ``tools`` the request only goes to back-ends that allow tools:
        :class:`BackendToolsNotAllowed` (raised here, nothing sent) if the
        chosen one does not; a fallback that does not is skipped. ``model``
        replaces the back-end's model (the primary only: a fallback keeps
        its own); ``report`` receives the turn's finish reason and usage.
        """
        resolved = self.resolve_name(name)
        msgs = normalize_turn_messages(messages)
        tools, model, report = options.get("tools"), options.get("model"), options.get("report")
        if (tools or has_tool_rounds(msgs)) and not self.tools_allowed(resolved):
            raise BackendToolsNotAllowed(resolved, "this back-end may not be sent tools (allow_tools is off)")
        reply = TurnStream(resolved)
        opts: dict[str, Any] = {
            "max_tokens": options.get("max_tokens"),
            "temperature": options.get("temperature"),
            "tools": list(tools) if tools else None,
            "tool_choice": options.get("tool_choice") if tools else None,
        }
        if model is not None:
            opts["model"] = model
        if report is not None:
            opts["report"] = report
        reply._attach(self._run(reply, resolved, msgs, opts, turn=True))
        return reply

    async def _run(
        self,
        reply: ReplyStream,
        name: str,
        msgs: list[dict[str, Any]],
        opts: dict[str, Any],
        turn: bool = False,
    ) -> AsyncGenerator[Any, None]:
        primary = self._entries[name]
        chain = [primary]
        if primary.cfg.fallback is not None:
            fallback = self._entries[primary.cfg.fallback]
            # With tools (or a history with tool rounds), only a back-end that may take them.
            if not turn or not (opts.get("tools") or has_tool_rounds(msgs)) or self.tools_allowed(fallback.name):
                chain.append(fallback)
        try:
            await self._global_caps.acquire()
        except Busy as exc:
            self._emit(BackendEvent("busy", name, requested=name, error="busy"))
            raise BackendBusy(name, f"all back-ends together are at their cap ({exc.what})") from None
        try:
            last_error: BackendError | None = None
            for index, entry in enumerate(chain):
                if index > 0:
                    reply.fell_back = True
                    log.info("back-end %s: using fallback %s (%s)", name, entry.name, last_error)
                    self._emit(BackendEvent("fallback", entry.name, requested=name))
                ticket = entry.breaker.try_acquire()
                if ticket is None:
                    last_error = BackendCircuitOpen(entry.name, entry.breaker.retry_in_s())
                    self._emit(BackendEvent("busy", entry.name, requested=name, error=last_error.kind))
                    continue
                try:
                    await entry.caps.acquire()
                except Busy as exc:
                    entry.breaker.neutral(ticket)
                    last_error = BackendBusy(entry.name, f"at its cap ({exc.what})")
                    self._emit(BackendEvent("busy", entry.name, requested=name, error=last_error.kind))
                    continue
                except BaseException:
                    entry.breaker.neutral(ticket)
                    raise
                attempt_opts = opts if index == 0 else {k: v for k, v in opts.items() if k != "model"}
                if attempt_opts.get("tools") and entry.name in self._tools_refused:
                    attempt_opts = _without_tools(attempt_opts)
                    reply.tools_refused = self._tools_refused[entry.name]
                attempt = self._attempt(
                    reply, entry, ticket, name, msgs, attempt_opts, last=index == len(chain) - 1, turn=turn
                )
                try:
                    async for chunk in attempt:
                        yield chunk
                    return
                except _TryNext as nxt:
                    last_error = nxt.error
                finally:
                    await attempt.aclose()
                    entry.caps.release()
            assert last_error is not None
            raise last_error
        finally:
            self._global_caps.release()

    async def _attempt(
        self,
        reply: ReplyStream,
        entry: _Entry,
        ticket: Ticket,
        requested: str,
        msgs: list[dict[str, Any]],
        opts: dict[str, Any],
        last: bool,
        turn: bool = False,
    ) -> AsyncGenerator[Any, None]:
        """One request to one back-end, with its breaker and metrics bookkeeping."""
        started = self._clock()
        chunks = 0
        outcome = "cancelled"
        self._emit(BackendEvent("request", entry.name, requested=requested))
        gen: AsyncGenerator[Any, None]
        backend = entry.backend
        try:
            while True:
                if turn and isinstance(backend, ToolCapableBackend):
                    gen = backend.stream_turn(msgs, **opts)
                else:
                    gen = backend.stream(msgs, max_tokens=opts.get("max_tokens"), temperature=opts.get("temperature"))
                try:
                    async for chunk in gen:
                        if chunks == 0:
                            reply.backend = entry.name
                            reply.ttft_s = self._clock() - started
                            self._emit(
                                BackendEvent("first_token", entry.name, requested=requested, ttft_s=reply.ttft_s)
                            )
                        chunks += 1
                        yield chunk
                except BackendToolsRefused as exc:
                    if chunks or not opts.get("tools"):
                        raise
                    # This turn is answered now, without tools; later requests skip them (see the module doc).
                    self._mark_tools_refused(entry, requested, exc)
                    opts = _without_tools(opts)
                    reply.tools_refused = self._tools_refused[entry.name]
                    continue
                finally:
                    await gen.aclose()  # close the HTTP stream now, not at GC
                break
            outcome = "done"
        except BackendError as exc:
            outcome = "error"
            self._failed(entry, ticket, requested, exc.kind, exc)
            if chunks or last:
                raise
            raise _TryNext(exc) from None
        except Exception as exc:  # a bug in a back-end: count it, never hide it
            outcome = "error"
            self._failed(entry, ticket, requested, "internal", exc)
            raise
        finally:
            duration = self._clock() - started
            if outcome == "done":
                entry.breaker.success(ticket)
                self._emit(BackendEvent("done", entry.name, requested=requested, duration_s=duration, chunks=chunks))
            elif outcome == "cancelled":
                # Superseded: a first chunk proved the back-end alive; before it we learnt nothing.
                (entry.breaker.success if chunks else entry.breaker.neutral)(ticket)
                self._emit(
                    BackendEvent("cancelled", entry.name, requested=requested, duration_s=duration, chunks=chunks)
                )

    def _failed(self, entry: _Entry, ticket: Ticket, requested: str, kind: str, exc: BaseException) -> None:
        entry.breaker.failure(ticket)
        log.warning("%s", exc if isinstance(exc, BackendError) else f"back-end {entry.name!r}: {exc!r}")
        self._emit(BackendEvent("error", entry.name, requested=requested, error=kind))

    # ------------------------------------------------------------------ health

    async def check(self, name: str | None) -> BackendHealth:
        """Reachability of one back-end (never raises for a configured name)."""
        return await self._entries[self.resolve_name(name)].backend.check()

    async def check_all(self) -> dict[str, BackendHealth]:
        results = await asyncio.gather(*(e.backend.check() for e in self._entries.values()))
        return dict(zip(self._entries, results))

    def describe(self) -> list[dict[str, Any]]:
        """What ``GET /v1/backends`` shows: names and state, never URLs or keys."""
        out = []
        for name, e in self._entries.items():
            breaker = e.breaker.snapshot()
            out.append(
                {
                    "name": name,
                    "kind": e.cfg.kind,
                    "description": e.cfg.description,
                    "preset": e.cfg.preset,
                    "model": getattr(e.backend, "model", None) or e.cfg.model,
                    "default": name == self.default_name,
                    "fallback": e.cfg.fallback,
                    "breaker": {
                        "state": breaker.state,
                        "consecutive_failures": breaker.consecutive_failures,
                        "retry_in_s": round(breaker.retry_in_s, 3),
                        "times_opened": breaker.times_opened,
                    },
                    "caps": e.caps.snapshot(),
                    "tools": "refused" if name in self._tools_refused else ("on" if self.tools_allowed(name) else "off"),
                    "stats": self.stats.get(name).as_dict(),
                }
            )
        return out

    def breaker_state(self, name: str) -> str:
        return self._entries[self.resolve_name(name)].breaker.state

    async def aclose(self) -> None:
        for e in self._entries.values():
            try:
                await e.backend.aclose()
            except Exception:
                log.exception("back-end %s: error while closing", e.name)


def _without_tools(opts: dict[str, Any]) -> dict[str, Any]:
    """The options of one request with its function tools (and tool choice) taken out."""
    return {**opts, "tools": None, "tool_choice": None}


class _TryNext(Exception):
    """Internal: the attempt failed before its first chunk; try the fallback."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(str(error))
        self.error = error
