"""Any OpenAI-compatible chat-completions server, through the ``openai`` package.

Timeouts: the connect timeout is the HTTP client's; the first-token and
total timeouts are enforced here with asyncio deadlines around every await,
because the HTTP read timeout only bounds the gap between two network reads
(a server that trickles keep-alives would never trip it).

The API key is read from the environment on every request and sent as a
per-request ``Authorization`` header, so it never sits in a config object,
a client object or a log line, and a rotated key is picked up at once.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Mapping, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

import openai
from openai import AsyncOpenAI, Omit, Timeout

from kame.backend.base import BackendHealth, MessageLike, normalize_messages, normalize_turn_messages
from kame.backend.config import BackendConfig
from kame.backend.errors import (
    BackendAuthError,
    BackendError,
    BackendMalformedStream,
    BackendRateLimited,
    BackendRequestError,
    BackendServerError,
    BackendTimeout,
    BackendToolsRefused,
    BackendUnavailable,
    error_detail,
)
from kame.backend.presets import apply_preset
from kame.backend.tool_refusal import tools_refusal
from kame.backend.tools import ToolCallDelta, ToolSpec, TurnReport, tool_choice_value

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from kame.backend.tools import TurnOptions

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Placeholder given to the SDK client; every request overrides (or omits) Authorization.
_NO_KEY = "kame-key-is-sent-per-request"
#: Headers the SDK would otherwise fill from OPENAI_ORG_ID / OPENAI_PROJECT_ID for every server.
_SDK_ENV_HEADERS = ("OpenAI-Organization", "OpenAI-Project")

if sys.version_info >= (3, 11):

    async def _await_within(aw: Awaitable[T], timeout: float) -> T:
        async with asyncio.timeout(timeout):
            return await aw

else:  # pragma: no cover - Python 3.10

    async def _await_within(aw: Awaitable[T], timeout: float) -> T:
        return await asyncio.wait_for(aw, timeout)


def _server_message(exc: openai.APIError) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(body.get("message"), str):
            return body["message"]
        if isinstance(inner, str):
            return inner
    if isinstance(body, str):
        return body
    return ""


def _retry_after(exc: openai.APIStatusError) -> float | None:
    raw = exc.response.headers.get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


class OpenAIBackend:
    """Streams chat completions from one OpenAI-compatible endpoint."""

    kind = "openai"

    def __init__(self, name: str, cfg: BackendConfig, environ: Mapping[str, str]) -> None:
        cfg = apply_preset(cfg)
        if cfg.kind != "openai" or not cfg.base_url:
            raise ValueError(f"back-end {name!r}: an openai back-end needs base_url (or a preset)")
        self.name = name
        self.cfg = cfg
        self._environ = environ
        self._discovered_model: str | None = None
        t = cfg.timeouts
        self._client = AsyncOpenAI(
            api_key=_NO_KEY,
            base_url=cfg.base_url,
            max_retries=cfg.max_retries,
            timeout=Timeout(t.total_s, connect=t.connect_s),
            default_headers=dict(cfg.headers),
        )

    def __repr__(self) -> str:
        return f"OpenAIBackend(name={self.name!r}, base_url={self.cfg.base_url!r}, model={self.cfg.model!r})"

    # ------------------------------------------------------------------ key

    @property
    def model(self) -> str | None:
        return self.cfg.model or self._discovered_model

    def _key(self) -> str | None:
        """The key, read now from the first of the configured variables that is set."""
        for env_name in self.cfg.key_env_names():
            value = self._environ.get(env_name)
            if value:
                return value
        return None

    def _secrets(self) -> list[str]:
        return [v for n in self.cfg.key_env_names() if (v := self._environ.get(n))]

    def _headers(self, key: str | None) -> dict[str, Any]:
        headers: dict[str, Any] = {h: Omit() for h in _SDK_ENV_HEADERS if h not in self.cfg.headers}
        headers["Authorization"] = f"Bearer {key}" if key else Omit()
        return headers

    def _missing_key_hint(self) -> str:
        names = self.cfg.key_env_names()
        if not names or self._key():
            return ""
        return " (no API key: " + " / ".join(f"${n}" for n in names) + " not set)"

    # ------------------------------------------------------------------ errors

    def _map_api_error(self, exc: openai.APIError, phase: str, *, offered_tools: bool = False) -> BackendError:
        detail = error_detail(_server_message(exc), self._secrets())
        suffix = f": {detail}" if detail else ""
        if offered_tools and isinstance(exc, openai.APIStatusError):
            server = tools_refusal(exc.status_code, detail)
            if server is not None:
                return BackendToolsRefused(
                    self.name,
                    f"HTTP {exc.status_code} the server refuses function tools{suffix}",
                    reason=detail,
                    server=server,
                    status_code=exc.status_code,
                )
        if isinstance(exc, openai.APITimeoutError):
            limit = self.cfg.timeouts.connect_s if phase == "connect" else self.cfg.timeouts.total_s
            return BackendTimeout(self.name, phase, limit)
        if isinstance(exc, openai.APIConnectionError):
            cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "connection error"
            return BackendUnavailable(self.name, f"cannot reach the server ({cause})")
        if isinstance(exc, openai.APIStatusError):
            code = exc.status_code
            if code == 429:
                return BackendRateLimited(
                    self.name, f"HTTP 429 rate limited{suffix}", retry_after_s=_retry_after(exc)
                )
            if code in (401, 403):
                return BackendAuthError(
                    self.name, f"HTTP {code} not authorized{self._missing_key_hint()}{suffix}", status_code=code
                )
            if code >= 500:
                return BackendServerError(self.name, f"HTTP {code} server error{suffix}", status_code=code)
            return BackendRequestError(self.name, f"HTTP {code} request rejected{suffix}", status_code=code)
        if isinstance(exc, openai.APIResponseValidationError):
            return BackendMalformedStream(self.name, f"unreadable response{suffix}")
        # An error object inside the SSE stream ({"error": {...}}).
        return BackendServerError(self.name, f"error in stream{suffix or ': (no message)'}")

    # ------------------------------------------------------------------ streaming

    async def _model_name(self, deadline: float, key: str | None) -> str:
        if self.cfg.model:
            return self.cfg.model
        if self._discovered_model is None:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                page = await _await_within(
                    self._client.models.list(extra_headers=self._headers(key)), max(remaining, 0.001)
                )
            except asyncio.TimeoutError:
                raise BackendTimeout(self.name, "first_token", self.cfg.timeouts.first_token_s) from None
            ids = [m.id for m in page.data if getattr(m, "id", None)]
            if not ids:
                raise BackendRequestError(self.name, "no model configured and GET /models lists none")
            self._discovered_model = ids[0]
            log.info("back-end %s: using model %s (first of GET /models)", self.name, ids[0])
        return self._discovered_model

    def _items_of(self, chunk: Any) -> list[str | ToolCallDelta]:
        """The text and tool-call pieces of one ``chat.completion.chunk``."""
        try:
            choices = chunk.choices
            if not isinstance(choices, list):
                raise TypeError
            if not choices:
                return []  # e.g. a usage-only chunk
            delta = choices[0].delta
            content = getattr(delta, "content", None) if delta is not None else None
            raw_calls = getattr(delta, "tool_calls", None) if delta is not None else None
            items: list[str | ToolCallDelta] = []
            if isinstance(content, str) and content:
                items.append(content)
            for tc in raw_calls or ():
                function = getattr(tc, "function", None)
                index = getattr(tc, "index", None)
                args = getattr(function, "arguments", None) if function is not None else None
                items.append(
                    ToolCallDelta(
                        index=index if isinstance(index, int) else None,
                        id=getattr(tc, "id", None) or None,
                        name=(getattr(function, "name", None) or None) if function is not None else None,
                        arguments=args if isinstance(args, str) else "",
                    )
                )
        except (AttributeError, TypeError, IndexError):
            raise BackendMalformedStream(self.name, "a stream event is not a chat.completion.chunk") from None
        return items

    async def stream(
        self,
        messages: Sequence[MessageLike],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> AsyncGenerator[str, None]:
        """Stream the reply's text; see the module doc for timeouts and cancellation."""
        gen = self._stream_items(normalize_messages(messages), None, None, max_tokens, temperature, None, None)
        try:
            async for item in gen:
                if isinstance(item, str):
                    yield item
        finally:
            await gen.aclose()

    async def stream_turn(
        self, messages: Sequence[Any], **options: Unpack[TurnOptions]
    ) -> AsyncGenerator[str | ToolCallDelta, None]:
        """Stream one LLM turn with function tools: text chunks and tool-call deltas.

        ``messages`` may hold earlier tool rounds (assistant ``tool_calls``
        and ``tool`` messages). A tool-call delta counts as the first token.
        ``model`` replaces the configured model for this request; ``report``
        receives the finish reason and the token usage (requested with
        ``stream_options.include_usage``).
        """
        msgs = normalize_turn_messages(messages)
        o = options
        gen = self._stream_items(msgs, o.get("tools"), o.get("tool_choice"), o.get("max_tokens"), o.get("temperature"),
                                 o.get("model"), o.get("report"))
        try:
            async for item in gen:
                yield item
        finally:
            await gen.aclose()

    async def _stream_items(
        self,
        msgs: list[dict[str, Any]],
        tools: Sequence[ToolSpec] | None,
        tool_choice: str | None,
        max_tokens: int | None,
        temperature: float | None,
        model_override: str | None,
        report: TurnReport | None,
    ) -> AsyncGenerator[str | ToolCallDelta, None]:
        loop = asyncio.get_running_loop()
        t = self.cfg.timeouts
        start = loop.time()
        first_deadline, total_deadline = start + t.first_token_s, start + t.total_s
        key = self._key()
        got_first = False
        phase = "connect"
        stream: Any = None
        failure: BackendError | None = None

        async def within(aw: Awaitable[T]) -> T:
            if got_first or total_deadline < first_deadline:
                deadline, which, limit = total_deadline, "total", t.total_s
            else:
                deadline, which, limit = first_deadline, "first_token", t.first_token_s
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                return await _await_within(aw, remaining)
            except asyncio.TimeoutError:
                if asyncio.iscoroutine(aw):
                    aw.close()
                raise BackendTimeout(self.name, which, limit) from None

        try:
            model = model_override or await self._model_name(first_deadline, key)
            if report is not None:
                report.model = model
            body = dict(self.cfg.extra_body)
            kwargs: dict[str, Any] = {
                "model": model,
                "messages": msgs,
                "stream": True,
                "extra_headers": self._headers(key),
                "extra_body": body or None,
            }
            if tools:
                kwargs["tools"] = [spec.as_openai() for spec in tools]
                choice = tool_choice_value(tool_choice, tools)
                if choice is not None:
                    kwargs["tool_choice"] = choice
            mt = max_tokens if max_tokens is not None else self.cfg.max_tokens
            temp = temperature if temperature is not None else self.cfg.temperature
            if mt is not None:
                kwargs["max_tokens"] = mt
            if temp is not None:
                kwargs["temperature"] = temp
            if report is not None:
                kwargs["stream_options"] = {"include_usage": True}
            log.debug(
                "back-end %s: request model=%s messages=%d tools=%d", self.name, model, len(msgs), len(tools or ())
            )
            stream = await within(self._client.chat.completions.create(**kwargs))
            phase = "read"
            ctype = stream.response.headers.get("content-type", "")
            if not ctype.startswith("text/event-stream"):
                raise BackendMalformedStream(
                    self.name, f"expected text/event-stream, got {error_detail(ctype) or 'no content type'}"
                )
            while True:
                try:
                    chunk = await within(stream.__anext__())
                except StopAsyncIteration:
                    break
                if report is not None:
                    _note(report, chunk)
                for item in self._items_of(chunk):
                    got_first = True
                    yield item
        except openai.APIError as exc:
            failure = self._map_api_error(exc, phase, offered_tools=bool(tools))
        except ValueError:  # invalid JSON in an SSE event, or a chunk that fails validation
            failure = BackendMalformedStream(self.name, "invalid JSON in the event stream")
        finally:
            if stream is not None:
                with suppress(Exception):
                    await stream.close()
        if failure is not None:
            raise failure  # outside the except block: no chained SDK exception (it holds the request)

    # ------------------------------------------------------------------ health

    async def check(self) -> BackendHealth:
        """``GET {base_url}/models`` within ``timeouts.check_s``; never raises."""
        key = self._key()
        started = time.monotonic()
        limit = self.cfg.timeouts.check_s
        status, reason = "ok", "reachable"
        try:
            await _await_within(self._client.models.list(extra_headers=self._headers(key), timeout=limit), limit)
        except asyncio.TimeoutError:
            status, reason = "unreachable", f"no answer within {limit:g} s"
        except openai.APIError as exc:
            err = self._map_api_error(exc, "connect")
            if isinstance(err, BackendAuthError):
                status = "auth_error"
            elif isinstance(err, (BackendUnavailable, BackendTimeout)):
                status = "unreachable"
            else:
                status = "error"
            reason = str(err).split(": ", 1)[-1]
        except Exception as exc:  # a health check must not take the server down
            status, reason = "error", type(exc).__name__
        return BackendHealth(self.name, self.kind, status, reason, time.monotonic() - started)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self._client.close()


def _note(report: TurnReport, chunk: Any) -> None:
    """Finish reason and usage of a ``chat.completion.chunk`` into ``report`` (fields it lacks are left alone)."""
    choices = getattr(chunk, "choices", None)
    if isinstance(choices, list) and choices:
        reason = getattr(choices[0], "finish_reason", None)
        if isinstance(reason, str):
            report.finish_reason = reason
    usage = getattr(chunk, "usage", None)
    if usage is None:
        return
    for field_name, attr in (("prompt_tokens", "prompt_tokens"), ("completion_tokens", "completion_tokens")):
        value = getattr(usage, attr, None)
        if isinstance(value, int):
            setattr(report, field_name, value)
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
    if isinstance(cached, int):
        report.cached_tokens = cached
    reasoning = getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None)
    if isinstance(reasoning, int):
        report.reasoning_tokens = reasoning
