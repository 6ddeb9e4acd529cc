"""A raw Realtime (or Live API) client for the resume tests (tests/calls/test_resume_*.py): OpenAI's events
over the ``websockets`` library, so that a test can cut the TCP connection under it (``abort``) the way a phone on a
train loses it, then reconnect with the handle."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np

SILENCE_80MS = base64.b64encode(np.zeros(1920, dtype="<i2").tobytes()).decode()


class RealtimeConn:
    """One websocket to ``/v1/realtime`` with the events it received (audio deltas counted, not kept)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.audio_deltas = 0
        self.closed: tuple[int | None, str] | None = None
        self._reader = asyncio.create_task(self._read())
        self._new = asyncio.Event()

    @classmethod
    async def open(cls, url: str, token: str | None) -> RealtimeConn:
        from websockets.asyncio.client import connect

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=20)
        return cls(ws)

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for raw in self.ws:
                event = json.loads(raw)
                if event.get("type") in ("response.output_audio.delta", "kame.output_audio.delta"):
                    self.audio_deltas += 1
                else:
                    self.events.append(event)
                self._new.set()
        except ConnectionClosed:
            pass
        finally:
            self.closed = (self.ws.close_code, self.ws.close_reason or "")
            self._new.set()

    async def wait_for(self, etype: str, timeout: float = 20.0, after: int = 0) -> dict[str, Any]:
        """The first event of ``etype`` at index ``after`` or later."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for event in self.events[after:]:
                if event.get("type") == etype:
                    return event
            if self.closed is not None:
                raise AssertionError(f"closed {self.closed} before {etype}; got {[e['type'] for e in self.events]}")
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"no {etype} within {timeout} s; got {[e['type'] for e in self.events]}")
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def wait_closed(self, timeout: float = 10.0) -> tuple[int | None, str]:
        await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        assert self.closed is not None
        return self.closed

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def say_text(self, text: str) -> None:
        """A user message and a response request (the back-end is asked with the conversation so far)."""
        await self.send({"type": "conversation.item.create",
                         "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        await self.send({"type": "response.create"})

    async def stream_silence(self, seconds: float) -> None:
        """Input audio at real time (what drives the voice's steps)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        for k in range(int(seconds / 0.08)):
            delay = start + k * 0.08 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.send({"type": "input_audio_buffer.append", "audio": SILENCE_80MS})

    def abort(self) -> None:
        """The TCP connection lost without a close frame (the client side only)."""
        self.ws.transport.abort()

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()


def history_text(body: Any) -> str:
    """Every message of a chat-completions request, as one string."""
    return "\n".join(str(m.get("content")) for m in (body.get("messages") or []) if isinstance(m, dict))


async def resume(url: str, token: str | None, timeout: float = 20.0, first: str = "session.created") -> RealtimeConn:
    """Reconnect with a handle (``url`` holds ``resume=``) until a replica takes the session (its ``first``
    event: ``session.started`` on the Live API): one that is draining or full answers 1001 or 1013 and the
    client tries again, as kame's clients do."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    refusals: list[tuple[int | None, str]] = []
    while loop.time() < deadline:
        from websockets.exceptions import InvalidHandshake

        try:
            conn = await RealtimeConn.open(url, token)
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
            refusals.append((None, str(exc)))
            await asyncio.sleep(0.3)
            continue
        while conn.closed is None and not conn.events:
            await asyncio.sleep(0.02)
        if conn.events and conn.events[0].get("type") == first:
            return conn
        closed = await conn.wait_closed()
        refusals.append(closed)
        if closed[0] not in (1001, 1013):
            raise AssertionError(f"resume refused: {closed} {conn.events}")
        await asyncio.sleep(0.3)
    raise AssertionError(f"no replica resumed the session: {refusals}")


class CuttableLink:
    """A TCP forwarder on loopback in front of a server, in its own thread: ``cut()`` drops every connection
    through it at once (both sides reset, no close frame), the way a phone on a train or a laptop changing
    Wi-Fi loses its connection; new connections go through again."""

    def __init__(self, target_port: int) -> None:
        import threading

        from tests.support.moshi_client import free_port

        self.target_port = target_port
        self.port = free_port()
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CuttableLink:
        self._thread.start()
        assert self._ready.wait(5), "the forwarder did not start"
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        def abort_all() -> None:
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()

        self.cuts += 1
        self._loop.call_soon_threadsafe(abort_all)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
