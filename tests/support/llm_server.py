"""A real, scriptable OpenAI-compatible chat-completions server for tests.

It speaks HTTP/1.1 on 127.0.0.1 (one response per connection, chunked SSE
for streams) from its own event loop in a background thread, so sync tests,
``asyncio.run`` tests and tests that start other servers can all use it.

Each request is answered by a :class:`Reply` (queued with :meth:`LlmServer.push`,
chosen per model with :meth:`LlmServer.set_for_model`, or the default) and
recorded as a :class:`RecordedRequest`: body, headers, times, and whether the
client went away before the stream finished (seen as EOF on the socket while
the server was still sending or waiting).

Use the ``llm_server`` fixture (``from llm_server import llm_server``) or the
:func:`running_llm_server` context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass
class ToolCallScript:
    """A function call the server streams in the chat-completions ``tool_calls`` format.

    The first delta of the call carries ``index``, ``id``, ``type`` and the
    name; the arguments JSON follows in ``argument_chunks`` pieces (one
    delta each), as OpenAI streams them.
    """

    name: str
    arguments: Any = field(default_factory=dict)  # a dict (dumped) or JSON text as is
    id: str | None = None  # default: call_<request>_<index>
    argument_chunks: int = 3

    def arguments_text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass
class Reply:
    """How the server answers one ``POST /v1/chat/completions``.

    The text goes out as ``chunks`` if given, else split into words (each
    word keeps its leading space). ``hang_after_chunks`` N sends N text
    chunks and then goes silent until the client leaves (0: no text at all;
    the role-only first delta is still sent unless ``role_chunk`` is False);
    ``hang_before_headers`` never even sends headers.
    """

    text: str = "Hello there, how can I help you today?"
    chunks: list[str] | None = None
    headers_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    hang_before_headers: bool = False
    hang_after_chunks: int | None = None
    #: The reply waits (before its headers) until the test sets this: a scenario that must see its own
    #: event before the back-end answers (a race the client would otherwise lose on a loaded machine).
    release: threading.Event | None = None
    status: int = 200
    error_message: str = "scripted error"
    echo_auth_in_error: bool = False  # put the received Authorization header in the error text
    retry_after: str | None = None
    malformed: str | None = None  # a raw line sent (as an SSE event) after ``malformed_after`` chunks
    malformed_after: int = 0
    error_event: str | None = None  # a ``data: {"error": ...}`` event after all chunks
    send_done: bool = True
    role_chunk: bool = True  # OpenAI sends an empty first delta with the role
    content_type: str = "text/event-stream"
    tool_calls: list[ToolCallScript] = field(default_factory=list)  # streamed after the text
    tool_call_delay_s: float = 0.0  # pause between the text and the first call
    interleave_calls: bool = False  # send the calls' argument pieces round-robin (index order varies)
    calls_whole_without_index: bool = False  # each call in one delta with no "index" (as some servers do)
    #: Token usage sent in a last chunk when the request asks for it (``stream_options.include_usage``),
    #: as OpenAI does; None: counted (prompt: words of all messages; completion: chunks sent).
    usage: dict[str, Any] | None = None

    def pieces(self) -> list[str]:
        if self.chunks is not None:
            return list(self.chunks)
        return re.findall(r"\s*\S+", self.text) or [self.text]


@dataclass
class RecordedRequest:
    """What the server saw of one request (times are ``time.monotonic()``)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float
    reply: Reply | None = None
    chunks_sent: int = 0
    first_chunk_at: float | None = None
    chunk_sent_at: list[float] = field(default_factory=list)  # monotonic time each text chunk was written
    completed: bool = False
    disconnected: bool = False
    disconnected_at: float | None = None
    ended_at: float | None = None
    ended: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def model(self) -> str | None:
        return self.body.get("model") if isinstance(self.body, dict) else None

    @property
    def last_user_message(self) -> str | None:
        if not isinstance(self.body, dict):
            return None
        for msg in reversed(self.body.get("messages") or []):
            if msg.get("role") == "user":
                return str(msg.get("content"))
        return None

    @property
    def tool_names(self) -> list[str]:
        """Names of the function tools the request offered."""
        if not isinstance(self.body, dict):
            return []
        return [t.get("function", {}).get("name") for t in self.body.get("tools") or []]

    @property
    def tool_messages(self) -> list[dict[str, Any]]:
        """The ``tool`` messages (results) the request carried."""
        if not isinstance(self.body, dict):
            return []
        return [m for m in self.body.get("messages") or [] if m.get("role") == "tool"]

    def wait_ended(self, timeout: float = 5.0) -> bool:
        """Block until the handler finished (completed, failed or client gone)."""
        return self.ended.wait(timeout)


class _Disconnected(Exception):
    pass


class LlmServer:
    """The server; start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, models: list[str] | None = None) -> None:
        self.models = list(models or ["test-model"])
        self.models_status = 200
        self.models_delay_s = 0.0
        self.default_reply = Reply()
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Reply] = deque()
        self._by_model: dict[str, Reply] = {}
        #: called for each chat request (after the queue is empty); a Reply it returns wins over the rest
        self.responder: Callable[[RecordedRequest], Reply | None] | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self.port = 0

    # ------------------------------------------------------------------ control

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: Reply) -> None:
        """Answer the next requests with these replies, in order, then the default."""
        with self._lock:
            self._queue.extend(replies)

    def set_default(self, reply: Reply) -> None:
        self.default_reply = reply

    def set_for_model(self, model: str, reply: Reply) -> None:
        """Requests naming ``model`` get ``reply`` (after the queue is empty)."""
        with self._lock:
            self._by_model[model] = reply

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._by_model.clear()
            self.requests.clear()
        self.default_reply = Reply()
        self.models_status = 200
        self.models_delay_s = 0.0
        self.responder = None

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in list(self.requests) if r.path.endswith("/chat/completions")]

    def wait_for_requests(self, n: int, timeout: float = 5.0, *, chat_only: bool = True) -> list[RecordedRequest]:
        """Block until at least ``n`` (chat) requests arrived; return them."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.chat_requests() if chat_only else list(self.requests)
            if len(got) >= n or time.monotonic() >= deadline:
                return got
            time.sleep(0.005)

    async def await_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Async twin of :meth:`wait_for_requests` (does not block the caller's loop)."""
        deadline = time.monotonic() + timeout
        while len(self.chat_requests()) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return self.chat_requests()

    def start(self) -> LlmServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # pragma: no cover - start-up failure is reported below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="llm-test-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("llm test server did not start")
        if failure:
            raise RuntimeError(f"llm test server failed to start: {failure[0]!r}")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            if self._server is not None:
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = None
        self._thread = None

    # ------------------------------------------------------------------ serving

    def _pick_reply(self, rec: RecordedRequest) -> Reply:
        body = rec.body
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        responder = self.responder
        if responder is not None:
            chosen = responder(rec)
            if chosen is not None:
                return chosen
        with self._lock:
            model = body.get("model") if isinstance(body, dict) else None
            if model in self._by_model:
                return self._by_model[model]
        return self.default_reply

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        rec: RecordedRequest | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            rec = RecordedRequest(method, target.split("?")[0], headers, body, time.monotonic())
            self.requests.append(rec)
            # After the request the client sends nothing more (Connection: close),
            # so EOF on the socket means it has gone away.
            gone = asyncio.ensure_future(reader.read(1))
            try:
                if method == "GET" and rec.path.endswith("/models"):
                    await self._serve_models(writer)
                elif method == "POST" and rec.path.endswith("/chat/completions"):
                    await self._serve_chat(rec, writer, gone)
                else:
                    await self._send_json(writer, 404, {"error": {"message": f"no route {method} {rec.path}"}})
            finally:
                gone.cancel()
        except _Disconnected:
            if rec is not None:
                rec.disconnected = True
                rec.disconnected_at = time.monotonic()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            if rec is not None and not rec.completed:
                rec.disconnected = True
                rec.disconnected_at = time.monotonic()
        except asyncio.CancelledError:
            pass
        finally:
            if rec is not None:
                rec.ended_at = time.monotonic()
                rec.ended.set()
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _wait_or_gone(gone: asyncio.Future[bytes], delay: float | None) -> None:
        """Sleep ``delay`` seconds (None: forever), raising as soon as the client leaves."""
        if delay is not None and delay <= 0:
            if gone.done():
                raise _Disconnected
            return
        done, _ = await asyncio.wait({gone}, timeout=delay)
        if done:
            raise _Disconnected

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, payload: Any,
                         extra: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", "content-type: application/json",
                f"content-length: {len(data)}", "connection: close"]
        head += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()

    async def _serve_models(self, writer: asyncio.StreamWriter) -> None:
        if self.models_delay_s:
            await asyncio.sleep(self.models_delay_s)
        if self.models_status != 200:
            await self._send_json(writer, self.models_status, {"error": {"message": "models unavailable"}})
            return
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in self.models]
        await self._send_json(writer, 200, {"object": "list", "data": data})

    def _chunk(self, rec: RecordedRequest, cid: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
        payload = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                   "model": rec.model or "test-model",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(payload)}\n\n".encode()

    async def _serve_chat(self, rec: RecordedRequest, writer: asyncio.StreamWriter,
                          gone: asyncio.Future[bytes]) -> None:
        reply = self._pick_reply(rec)
        rec.reply = reply
        while reply.release is not None and not reply.release.is_set():
            await self._wait_or_gone(gone, 0.01)
        await self._wait_or_gone(gone, None if reply.hang_before_headers else reply.headers_delay_s)
        if reply.status != 200:
            message = reply.error_message
            if reply.echo_auth_in_error:
                message += f" (you sent: {rec.headers.get('authorization', '')})"
            extra = {"retry-after": reply.retry_after} if reply.retry_after else None
            await self._send_json(writer, reply.status, {"error": {"message": message, "type": "test_error"}}, extra)
            rec.completed = True
            return
        pieces = reply.pieces()
        cid = f"chatcmpl-{next(self._ids)}"
        if not (isinstance(rec.body, dict) and rec.body.get("stream")):
            await self._wait_or_gone(gone, reply.first_token_delay_s)
            await self._send_json(writer, 200, {
                "id": cid, "object": "chat.completion", "created": int(time.time()), "model": rec.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(pieces)},
                             "finish_reason": "stop"}]})
            rec.completed = True
            return

        async def send(data: bytes) -> None:
            if gone.done():
                raise _Disconnected
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        head = ["HTTP/1.1 200 OK", f"content-type: {reply.content_type}", "cache-control: no-cache",
                "transfer-encoding: chunked", "connection: close"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await writer.drain()
        if reply.role_chunk:
            await send(self._chunk(rec, cid, {"role": "assistant", "content": ""}))
        await self._wait_or_gone(gone, reply.first_token_delay_s)
        for i, piece in enumerate(pieces):
            if reply.malformed is not None and i == reply.malformed_after:
                await send(f"{reply.malformed}\n\n".encode())
            if reply.hang_after_chunks is not None and i == reply.hang_after_chunks:
                await self._wait_or_gone(gone, None)
            if i > 0:
                await self._wait_or_gone(gone, reply.chunk_delay_s)
            rec.chunk_sent_at.append(time.monotonic())  # stamped before the write: the client may be faster
            await send(self._chunk(rec, cid, {"content": piece}))
            rec.chunks_sent += 1
            if rec.first_chunk_at is None:
                rec.first_chunk_at = time.monotonic()
        if reply.malformed is not None and reply.malformed_after >= len(pieces):
            await send(f"{reply.malformed}\n\n".encode())
        if reply.hang_after_chunks is not None and reply.hang_after_chunks >= len(pieces):
            await self._wait_or_gone(gone, None)
        if reply.error_event is not None:
            await send(f"data: {json.dumps({'error': {'message': reply.error_event}})}\n\n".encode())
        if reply.tool_calls:
            await self._wait_or_gone(gone, reply.tool_call_delay_s)
            request_no = cid.rsplit("-", 1)[-1]
            for delta in self._tool_deltas(reply, request_no):
                await send(self._chunk(rec, cid, {"tool_calls": [delta]}))
                rec.chunks_sent += 1
                if rec.first_chunk_at is None:
                    rec.first_chunk_at = time.monotonic()
                if reply.chunk_delay_s:
                    await self._wait_or_gone(gone, reply.chunk_delay_s)
        await send(self._chunk(rec, cid, {}, finish="tool_calls" if reply.tool_calls else "stop"))
        options = rec.body.get("stream_options") if isinstance(rec.body, dict) else None
        if isinstance(options, dict) and options.get("include_usage"):
            await send(self._usage_chunk(rec, cid, reply))
        if reply.send_done:
            await send(b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        rec.completed = True


    @staticmethod
    def _usage_chunk(rec: RecordedRequest, cid: str, reply: Reply) -> bytes:
        usage = reply.usage
        if usage is None:
            messages = rec.body.get("messages") or []
            prompt = sum(len(str(m.get("content") or "").split()) for m in messages if isinstance(m, dict))
            usage = {"prompt_tokens": prompt, "completion_tokens": rec.chunks_sent,
                     "total_tokens": prompt + rec.chunks_sent}
        payload = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                   "model": rec.model or "test-model", "choices": [], "usage": usage}
        return f"data: {json.dumps(payload)}\n\n".encode()

    @staticmethod
    def _tool_deltas(reply: Reply, request_no: str) -> list[dict[str, Any]]:
        """The ``tool_calls`` delta entries of a reply's calls, in sending order."""
        per_call: list[list[dict[str, Any]]] = []
        if reply.calls_whole_without_index:
            return [{"id": call.id or f"call_{request_no}_{i}", "type": "function",
                     "function": {"name": call.name, "arguments": call.arguments_text()}}
                    for i, call in enumerate(reply.tool_calls)]
        for index, call in enumerate(reply.tool_calls):
            text = call.arguments_text()
            n = max(1, call.argument_chunks)
            size = max(1, -(-len(text) // n))
            parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
            call_id = call.id or f"call_{request_no}_{index}"
            deltas = [{"index": index, "id": call_id, "type": "function",
                       "function": {"name": call.name, "arguments": ""}}]
            deltas += [{"index": index, "function": {"arguments": part}} for part in parts]
            per_call.append(deltas)
        if not reply.interleave_calls:
            return [d for deltas in per_call for d in deltas]
        out: list[dict[str, Any]] = []
        for row in itertools.zip_longest(*per_call):
            out.extend(d for d in row if d is not None)
        return out


@contextlib.contextmanager
def running_llm_server(models: list[str] | None = None) -> Iterator[LlmServer]:
    """Start a server for the duration of a ``with`` block."""
    server = LlmServer(models).start()
    try:
        yield server
    finally:
        server.stop()
