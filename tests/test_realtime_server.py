"""/v1/realtime on the real CPU demo server (Whisper tiny.en ASR, two scripted back-ends), driven by the
official OpenAI SDK's realtime client and by kame.client.realtime_client.

The SDK speaks an espeak question at real time, sees its own transcript, the reply audio and the
``kame.*`` events of the scripted back-end's answer, then switches back-end mid-session and asks again.
Every audio delta must belong to a response and an item announced before it (what strict clients
check). Authentication, origin and query checks run against the same server.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kame.client.realtime_client import RealtimeClient
from tests.support.moshi_client import ServerProcess
from tests.support.servers import SECURED_TOKEN
from tests.support.speech import silence, synthesize

TOKEN = SECURED_TOKEN


@pytest.fixture(scope="module")
def server(secured_server: ServerProcess) -> Iterator[ServerProcess]:
    """The shared ``secured`` server (tests/support/servers.py): two scripted back-ends (alpha, beta), a token, an origin allow-list."""
    yield secured_server
    assert TOKEN not in secured_server.logs()


def rt_url(server: ServerProcess) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/realtime"


def pcm16(pcm: np.ndarray) -> bytes:
    return (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()


class Recorder:
    """Everything an SDK connection received, with a strict-client check of response/item ids."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.audio_bytes = 0
        self.violations: list[str] = []
        self._open: dict[str, str] = {}  # response id -> item id, while open
        self._items: set[str] = set()
        self._parts: set[str] = set()

    def add(self, event: Any) -> None:
        t = event.type
        if t == "response.created":
            self._open[event.response.id] = ""
        elif t == "response.output_item.added":
            if event.response_id not in self._open:
                self.violations.append(f"item added to unknown response {event.response_id}")
            self._open[event.response_id] = event.item.id
        elif t == "conversation.item.added":
            self._items.add(event.item.id)
        elif t == "response.content_part.added":
            self._parts.add(event.item_id)
        elif t in ("response.output_audio.delta", "response.output_audio_transcript.delta"):
            if self._open.get(event.response_id) != event.item_id or event.item_id not in self._items:
                self.violations.append(f"{t} for a response/item not announced: {event.response_id}/{event.item_id}")
            elif event.item_id not in self._parts:
                self.violations.append(f"{t} before response.content_part.added")
            if t == "response.output_audio.delta":
                self.audio_bytes += len(base64.b64decode(event.delta))
        elif t == "response.done" and self._open.pop(event.response.id, None) is None:
            self.violations.append(f"response.done for unknown response {event.response.id}")
        if t not in ("response.output_audio.delta", "kame.output_audio.delta", "response.output_audio_transcript.delta"):
            self.events.append(event)

    def of(self, *types: str) -> list[Any]:
        return [e for e in self.events if e.type in types]

    def extra(self, event: Any, key: str) -> Any:
        """A field of a kame.* event (the SDK keeps unknown events' fields as extras)."""
        return getattr(event, key, None) if not isinstance(event, dict) else event.get(key)


async def _speak(conn: Any, pcm: np.ndarray, chunk: int = 960) -> None:
    """input_audio_buffer.append at real time, in 40 ms pieces (absolute schedule)."""
    data = pcm16(pcm)
    step = chunk * 2
    start = time.monotonic()
    for k, i in enumerate(range(0, len(data), step)):
        delay = start + k * chunk / 24000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())


async def _collect(conn: Any, rec: Recorder, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            event = await asyncio.wait_for(conn.recv(), 0.5)
        except asyncio.TimeoutError:
            continue
        rec.add(event)


def test_openai_sdk_speaks_hears_gets_answers_and_switches_backend(server: ServerProcess) -> None:
    from openai import AsyncOpenAI

    q1 = np.concatenate([silence(0.3), synthesize("What is the capital of France?"), silence(2.5)])
    q2 = np.concatenate([synthesize("Tell me about turtles."), silence(2.5)])

    async def main() -> tuple[Recorder, int, Any, Any, Any]:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=TOKEN)
        rec = Recorder()
        async with client.realtime.connect(model="kame-test") as conn:
            created = await asyncio.wait_for(conn.recv(), 10)
            await conn.session.update(
                session={"type": "realtime", "instructions": "Answer briefly.", "kame": {"text_topk": 25}}
            )
            updated = await asyncio.wait_for(conn.recv(), 5)
            stop = asyncio.Event()
            collector = asyncio.create_task(_collect(conn, rec, stop))
            await _speak(conn, q1)
            await conn.session.update(session={"type": "realtime", "kame": {"backend": "beta"}})
            await _speak(conn, q2)
            # an event with no meaning on a websocket gets an error and the session goes on
            await conn.send({"type": "output_audio_buffer.clear"})  # WebRTC and SIP only: an error
            await _speak(conn, silence(0.5))
            stop.set()
            await collector
        return rec, len(pcm16(q1)) + len(pcm16(q2)) + len(pcm16(silence(0.5))), created, updated, conn

    rec, sent_bytes, created, updated, _ = asyncio.run(main())
    assert created.type == "session.created"
    assert created.session.model == "kame-test"
    assert created.session.audio.input.format.type == "audio/pcm"
    assert updated.type == "session.updated" and updated.session.instructions == "Answer briefly."
    assert rec.violations == []
    # the user's own words come back as a transcript of one user item
    started = rec.of("input_audio_buffer.speech_started")
    completed = rec.of("conversation.item.input_audio_transcription.completed")
    assert len(started) >= 2 and len(completed) >= 2, [e.type for e in rec.events][:80]
    first = completed[0]
    assert first.item_id == started[0].item_id
    assert "capital" in first.transcript.lower() or "france" in first.transcript.lower(), first.transcript
    assert any("turtle" in c.transcript.lower() for c in completed[1:]), [c.transcript for c in completed]
    assert rec.of("input_audio_buffer.speech_stopped") and rec.of("conversation.item.input_audio_transcription.delta")
    # the scripted back-ends' answers reach Moshi as oracle text: alpha first, beta after the switch
    requests = rec.of("kame.backend.request_started")
    backends = [rec.extra(e, "backend") for e in requests]
    assert "alpha" in backends and "beta" in backends, backends
    assert backends.index("beta") > backends.index("alpha")
    switched = [e for e in rec.of("session.updated") if e.session.model_extra["kame"]["backend"] == "beta"]
    assert switched
    oracle = [str(rec.extra(e, "text")) for e in rec.of("kame.oracle.reset", "kame.oracle.text")]
    assert any(t.startswith("Alpha thinks") for t in oracle), oracle[:5]
    assert any(t.startswith("Beta answers") for t in oracle), oracle[-5:]
    assert rec.of("kame.backend.first_token")
    # reply audio: responses with transcripts, about as much audio as was sent
    assert rec.of("response.done") and rec.of("response.output_audio_transcript.done")
    assert rec.audio_bytes > 0.5 * sent_bytes
    errors = rec.of("error")
    assert [e.error.code for e in errors] == ["unsupported_event"]


def test_token_query_and_subprotocol_and_refusals(server: ServerProcess) -> None:
    async def open_with(**kwargs: Any) -> RealtimeClient:
        c = await RealtimeClient.connect(rt_url(server), **kwargs)
        await c.wait_for_type("session.created", 10)
        return c

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        c = await open_with(token=TOKEN, token_via="query")
        out["query"] = c.session is not None
        await c.close()
        c = await open_with(token=TOKEN, token_via="subprotocol")
        out["subprotocol"] = (c.session is not None, c.subprotocol)
        await c.close()
        for name, kwargs in {
            "missing": {},
            "wrong": {"token": "nope"},
            "origin": {"token": TOKEN, "origin": "http://evil.example"},
            "bad_param": {"token": TOKEN, "query": {"backend": "gamma"}},
        }.items():
            c = await open_with(**kwargs)
            out[name] = (await c.wait_closed(5), c.session, [e["error"]["code"] for e in c.errors], c.errors)
        return out

    auth = {"Authorization": f"Bearer {TOKEN}"}
    rejected0 = server.metric("kame_sessions_rejected_total", 'reason="unauthorized"', auth)
    realtime0 = server.metric("kame_protocol_sessions_total", 'protocol="realtime"', auth)
    out = asyncio.run(main())
    assert out["query"] is True
    assert out["subprotocol"] == (True, "realtime")
    assert out["missing"][0] == (1008, "unauthorized") and out["missing"][1] is None
    assert out["wrong"][0] == (1008, "unauthorized")
    assert out["origin"][0] == (1008, "origin not allowed")
    assert out["bad_param"][0] == (1008, "invalid query parameter")
    assert out["bad_param"][2] == ["invalid_value"] and "gamma" in out["bad_param"][3][0]["error"]["message"]
    # deltas on the shared server (the absolute ">= 3" counted the earlier test's session too): the two
    # refused for their token, and the two sessions this test started (query, subprotocol)
    assert server.metric("kame_sessions_rejected_total", 'reason="unauthorized"', auth) - rejected0 >= 2
    assert server.metric("kame_protocol_sessions_total", 'protocol="realtime"', auth) - realtime0 >= 2


def test_session_update_errors_and_reset_keep_the_session(server: ServerProcess) -> None:
    at_reset: list[float] = []  # audio sent and received when the reset was acknowledged

    async def main() -> RealtimeClient:
        c = await RealtimeClient.connect(rt_url(server), token=TOKEN)
        assert await c.wait_for_type("session.created", 10)
        sender = asyncio.create_task(c.send_silence(3.0))
        await c.send_event({"type": "session.update", "event_id": "u1", "session": {"kame": {"backend": "gamma"}}})
        await c.send_event({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}})
        await c.send_event({"type": "session.update",
                            "session": {"input_audio_format": "pcm16", "kame": {"oracle_policy": "freeze_when_speaking"}}})
        await asyncio.sleep(1.0)
        n = len(c.events)
        await c.send_event({"type": "kame.session.reset"})
        assert await c.wait_for_type("kame.session.reset", 5, start=n)
        at_reset.extend((c.stats.audio_sent_s, c.stats.audio_received_s))
        await sender
        await c.drain_output(2.0, until_complete=True)
        await c.close()
        return c

    c = asyncio.run(main())
    codes = [(e["error"]["code"], e["error"]["param"], e["error"]["event_id"]) for e in c.errors]
    assert codes == [
        ("unknown_backend", "session.kame.backend", "u1"),
        ("unsupported_audio_format", "session.audio.input.format", None),
    ]
    updated = c.of_type("session.updated")
    assert len(updated) == 1 and updated[0]["session"]["kame"]["oracle_policy"] == "freeze_when_speaking"
    assert updated[0]["session"]["kame"]["backend"] == "alpha"  # the failed update changed nothing
    # the stream went on through the reset: output kept coming for all the input sent after it. (Input the
    # engine had not stepped when the reset came belongs to the old state and goes with it: a few frames on
    # a loaded machine, so the whole session's input is not the measure.)
    sent_after, received_after = c.stats.audio_sent_s - at_reset[0], c.stats.audio_received_s - at_reset[1]
    assert sent_after > 1.0 and received_after >= 0.8 * sent_after, (sent_after, received_after)
    assert c.close_code == 1000
