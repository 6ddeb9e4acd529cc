"""Resume on the Live API (``/v1/live/sessions``): the official ``openai`` SDK's ``client.live.connect()``,
opted in with ``?kame_events=1``, loses its TCP connection in the middle of a Responses-delegation reply
(a forwarder in front of the server drops it: tests/support/resume.py) and comes back with
``?resume=HANDLE`` within ``server.resume_grace_s``.

Real parts: ``kame serve`` (CPU demo, tiny model) with a token, its back-end a real OpenAI-compatible HTTP
server on loopback (tests/support/llm_server.py) reached through the real ``openai`` client. Checked: the
same session id; the back-end's next request holds the turn before the drop; a Live client that did not
opt in sees no ``kame.session.*`` resume message. Not covered: a Live session does not move to another
replica on a drain (docs/protocol.md, "Resuming a session").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.llm_server import LlmServer, RecordedRequest, Reply
from tests.support.moshi_client import ServerProcess
from tests.support.resume import CuttableLink, history_text

TOKEN = "resume-live-token"
GRACE_S = 4.0
CONFIG = """device: cpu
asr:
  kind: none
frontend:
  checkpoint: "tiny:0"
  batch_size: 2
backends:
  llm:
    base_url: "{llm}"
    model: plain-model
    api_key_env: ""
    breaker: {enabled: false}
default_backend: llm
"""
START = {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {"model": "llm"}}}
SILENCE_80MS = base64.b64encode(np.zeros(1920, dtype="<i2").tobytes()).decode()


@pytest.fixture(scope="module")
def llm() -> Iterator[LlmServer]:
    srv = LlmServer(models=["plain-model"]).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server(llm: LlmServer, kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("resume_live")
    config = tmp / "kame.yaml"
    config.write_text(CONFIG.replace("{llm}", llm.base_url))
    proc = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp / "kame.log", config=str(config), label="resume_live",
                         env={"KAME_AUTH_TOKEN": TOKEN, "KAME_SERVER__RESUME_GRACE_S": str(GRACE_S),
                              "KAME_SERVER__IDLE_TIMEOUT_S": "20"})
    proc.start(timeout=240.0)
    yield proc
    proc.stop()


class LiveConn:
    """The SDK's Live connection with every server event it received, as JSON (audio deltas counted)."""

    def __init__(self, manager: Any, conn: Any) -> None:
        self.manager = manager
        self.conn = conn
        self.events: list[dict[str, Any]] = []
        self.audio_deltas = 0
        self.closed = False
        self._new = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, port: int, query: dict[str, str]) -> LiveConn:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=TOKEN)
        manager = client.live.connect(extra_query=query)
        return cls(manager, await manager.__aenter__())

    async def _read(self) -> None:
        try:
            while True:
                event = json.loads(await self.conn.recv_bytes())
                if event.get("type") == "session.output_audio.delta":
                    self.audio_deltas += 1
                else:
                    self.events.append(event)
                self._new.set()
        except Exception:  # noqa: BLE001 - the connection closed or was cut
            pass
        finally:
            self.closed = True
            self._new.set()

    async def wait_for(self, etype: str, timeout: float = 20.0, after: int = 0, **fields: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for event in self.events[after:]:
                if event.get("type") == etype and all(event.get(k) == v for k, v in fields.items()):
                    return event
            assert not self.closed, f"closed before {etype}; got {[e['type'] for e in self.events]}"
            left = deadline - loop.time()
            assert left > 0, f"no {etype} within {timeout} s; got {[e['type'] for e in self.events]}"
            self._new.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    async def completed(self, after: int = 0, timeout: float = 20.0) -> dict[str, Any]:
        """The next Responses round that completed (its nested ``response.completed``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for event in self.events[after:]:
                if event.get("type") == "response.event" and event["event"]["type"] == "response.completed":
                    return event
            await asyncio.sleep(0.05)
        raise AssertionError(f"no completed response; got {[e['type'] for e in self.events]}")

    async def ask(self, text: str) -> None:
        """A user message into the Responses conversation and a new delegation on it."""
        await self.conn.response.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        await self.conn.response.create()

    async def stream_silence(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for k in range(int(seconds / 0.08)):
            delay = start + k * 0.08 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.conn.session.input_audio.append(audio=SILENCE_80MS)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.manager.__aexit__(None, None, None)
        self._reader.cancel()


def health(server: ServerProcess) -> dict[str, int]:
    status, body = server.get("/health")
    assert status == 200
    return dict(json.loads(body)["sessions"])


async def wait_free(server: ServerProcess, free: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while health(server)["free"] != free:
        assert loop.time() < deadline, f"slots not freed: {health(server)}"
        await asyncio.sleep(0.2)


async def asked_with(llm: LlmServer, words: str, timeout: float = 20.0) -> RecordedRequest:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        for rec in llm.chat_requests():
            if words in (rec.last_user_message or ""):
                return rec
        assert loop.time() < deadline, f"no request asking {words!r}: {[r.last_user_message for r in llm.chat_requests()]}"
        await asyncio.sleep(0.1)


def test_a_live_client_dropped_mid_reply_resumes_the_same_session(server: ServerProcess, llm: LlmServer) -> None:
    llm.reset()
    llm.set_default(Reply(text="Nice to meet you Ada, I will remember your name for the rest of our talk.",
                          first_token_delay_s=0.1, chunk_delay_s=0.15))
    link = CuttableLink(server.port).start()

    async def main() -> None:
        first = await LiveConn.open(link.port, {"kame_events": "1"})
        await first.conn.session.start(session=START)
        started = await first.wait_for("session.started")
        offered = await first.wait_for("kame.session.resumable")
        assert offered["expires_in_s"] == GRACE_S and len(offered["handle"]) >= 32
        assert first.events.index(started) < first.events.index(offered), "the handle comes after session.started"
        await first.ask("Hello, my name is Ada Lovelace.")
        feeding = asyncio.create_task(first.stream_silence(30))
        await asked_with(llm, "my name is Ada Lovelace", timeout=15)
        await asyncio.sleep(0.6)  # mid-reply: the back-end is still streaming its words
        link.cut()
        feeding.cancel()
        await asyncio.sleep(0.5)
        assert health(server)["active"] == 1  # held, not ended

        second = await LiveConn.open(link.port, {"kame_events": "1", "resume": offered["handle"]})
        again = await second.wait_for("session.started")
        assert again["session"]["id"] == started["session"]["id"]
        assert again["session"]["delegation"]["type"] == "responses"
        resumed = await second.wait_for("kame.session.resumed")
        assert resumed["voice"] == "continued" and resumed["session_id"] == started["session"]["id"]
        assert resumed["lost"], "what was lost is said"
        fresh = await second.wait_for("kame.session.resumable")
        assert fresh["handle"] != offered["handle"]
        feeding = asyncio.create_task(second.stream_silence(20))
        await second.completed()  # the reply interrupted by the drop finished while away or after

        llm.set_default(Reply(text="Your name is Ada.", first_token_delay_s=0.05))
        await second.ask("What is my name?")
        asked = await asked_with(llm, "What is my name?")
        assert "my name is Ada Lovelace" in history_text(asked.body)
        assert second.audio_deltas > 0, "the voice goes on"
        feeding.cancel()
        errors = [e for e in second.events if e["type"] == "error"]
        assert not errors, errors

        # a second session.start on the resumed connection changes nothing
        n = len(second.events)
        await second.conn.session.start(session=START)
        refused = await second.wait_for("error", after=n)
        assert refused["error"]["code"] == "session_already_started"

        # the old handle is dead
        replay = await LiveConn.open(link.port, {"kame_events": "1", "resume": offered["handle"]})
        error = await replay.wait_for("error")
        assert "resume handle" in error["error"]["message"]
        await second.close()
        await replay.close()
        await wait_free(server, 2, GRACE_S + 10)

    try:
        asyncio.run(main())
    finally:
        link.stop()


def test_a_standard_live_client_gets_no_resume_messages_and_ends_when_dropped(server: ServerProcess) -> None:
    link = CuttableLink(server.port).start()

    async def main() -> None:
        await wait_free(server, 2, 10)
        conn = await LiveConn.open(link.port, {})
        await conn.conn.session.start(session={"model": "gpt-live-1"})
        await conn.wait_for("session.started")
        await conn.stream_silence(0.8)
        assert not [e for e in conn.events if e["type"].startswith("kame.session.")], conn.events
        link.cut()
        await wait_free(server, 2, 10)  # not held: it ended as before
        await conn.close()

    try:
        asyncio.run(main())
    finally:
        link.stop()


def test_kames_live_client_resumes_with_its_handle(server: ServerProcess) -> None:
    """kame's Python Live client (kame.client.live_client, issue 60 point 2): opted in, it keeps the handle the
    server gave and opens the same session with it after its connection is cut."""
    from kame.client.live_client import LiveClient

    link = CuttableLink(server.port).start()

    async def main() -> None:
        await wait_free(server, 2, 10)
        url = f"http://127.0.0.1:{link.port}"
        first = await LiveClient.connect(url, token=TOKEN, kame_events=True)
        started = await first.start({"model": "gpt-live-1"})
        assert started is not None and started["type"] == "session.started"
        assert await first.wait_for_type("kame.session.resumable") is not None
        handle = first.resume_handle
        assert handle
        link.cut()
        await asyncio.sleep(0.5)
        second = await LiveClient.connect(url, token=TOKEN, resume=handle)
        again = await second.wait_for_type("session.started")
        assert again is not None and again["session"]["id"] == started["session"]["id"]
        assert await second.wait_for_type("kame.session.resumed") is not None
        assert await second.wait_for_type("kame.session.resumable") is not None
        assert second.resume_handle not in (None, handle)
        await second.close()
        await wait_free(server, 2, GRACE_S + 10)

    try:
        asyncio.run(main())
    finally:
        link.stop()
