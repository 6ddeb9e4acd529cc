"""Golden event logs: one scripted session per wire, through the real app, compared with a file.

Each test serves the real application (``create_app``: admission, session
runtime, wire, pipeline, the tiny KAME model on its engine thread, the
back-end registry with the real `openai` client against tests/llm_server.py)
under uvicorn on loopback and plays one scripted session with a plain
websocket client. Every message the client receives is logged in order;
what only the model or the clock decides is normalised (ids by their first
appearance, times, audio payloads and Moshi's own text, which a random tiny
model makes up), and the log must equal ``tests/golden/<name>.jsonl``.

The recogniser is the one stand-in: a scripted transcriber that says
prepared words at prepared points of the audio, so the transcripts, and the
delegations they cause, are the same on every run. Refactorings of the
wires and the pipeline must leave these logs unchanged (issue 26); a change
of behaviour on purpose rewrites them with ``KAME_GOLDEN_UPDATE=1`` and the
diff goes into the commit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets

from kame.asr.config import AsrConfig
from kame.asr.events import Emission, EventType
from kame.asr.recognizer import Recognizer
from kame.asr.stream import AsrStream, EventCallback, ThreadedStream
from kame.asr.transcriber import Transcriber, TranscriberStats
from tests.support.llm_server import LlmServer, RecordedRequest, Reply, ToolCallScript, running_llm_server
from tests.support.moshi_client import free_port

GOLDEN = Path(__file__).resolve().parent / "golden"
RATE = 24000
FRAME = 1920
#: The scripted recogniser's words: (seconds of audio fed, what it says).
SCRIPT: list[tuple[float, Emission]] = [
    (0.40, Emission(EventType.SPEECH_STARTED, utterance=0)),
    (0.80, Emission(EventType.PARTIAL, text="what is the", stable="what is", utterance=0)),
    (1.20, Emission(EventType.PARTIAL, text="what is the weather in", stable="what is the weather", utterance=0)),
    (1.60, Emission(EventType.SPEECH_STOPPED, utterance=0)),
    (1.68, Emission(EventType.FINAL, text="what is the weather in Paris", utterance=0)),
]
#: The Responses session hears only the final (no partials: no speculative request, whose timing is the clock's).
FINAL_ONLY: list[tuple[float, Emission]] = [SCRIPT[0], SCRIPT[3], SCRIPT[4]]
SCRIPT_AUDIO_S = 2.4
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# --------------------------------------------------------------------------- the scripted recogniser


class ScriptedTranscriber(Transcriber):
    """Says the script's emissions once that much audio was pushed (nothing is decoded)."""

    def __init__(self, script: list[tuple[float, Emission]]) -> None:
        self.stats = TranscriberStats()
        self.script = list(script)
        self.samples = 0

    def push(self, pcm: np.ndarray) -> list[Emission]:
        self.samples += len(pcm)
        out: list[Emission] = []
        while self.script and self.samples >= self.script[0][0] * RATE:
            out.append(self.script.pop(0)[1])
        return out

    def pending(self) -> bool:
        return False

    def work(self) -> list[Emission]:
        return []

    def finish(self) -> list[Emission]:
        return []


class ScriptedRecognizer(Recognizer):
    kind = "whisper"
    script: list[tuple[float, Emission]] = SCRIPT

    def new_transcriber(self) -> Transcriber:
        return ScriptedTranscriber(self.script)

    def open_stream(self, *, on_event: EventCallback | None = None) -> AsrStream:
        return ThreadedStream(self.new_transcriber(), self._stream_name(), max_queued_s=self.cfg.max_queued_s,
                              max_events=self.cfg.max_events, on_event=on_event)


# --------------------------------------------------------------------------- the server



class GoldenServer:
    """The real app under uvicorn in a thread, with the scripted recogniser and a local LLM back-end."""

    def __init__(self, ckpt: Path, cache_dir: Path, llm: LlmServer) -> None:
        import uvicorn

        from kame.server.app.factory import create_app
        from kame.server.config import AppConfig

        cfg = AppConfig.model_validate({
            "cache_dir": str(cache_dir),
            "device": "cpu",
            "frontend": {"checkpoint": str(ckpt), "batch_size": 2},
            "asr": {"kind": "whisper"},
            "backends": {"llm": {"base_url": llm.base_url, "model": "test-model", "api_key_env": "",
                                 "allow_tools": True}},
            "default_backend": "llm",
            "server": {"warmup_steps": 1, "gc_interval_s": 0, "idle_timeout_s": 20},
        })
        self.app = create_app(cfg, device="cpu", environ={})
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> GoldenServer:
        self.thread.start()
        deadline = time.monotonic() + 90
        while self.status() != "ok":
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)
        return self

    def status(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return str(json.loads(r.read()).get("status"))
        except (urllib.error.URLError, ConnectionError, OSError):
            return None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ready", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, OSError):
            return False

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def ws(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"


def respond(rec: RecordedRequest) -> Reply:
    """The LLM's script: with tools a call, then an answer built on its output; without tools a guess."""
    body = rec.body if isinstance(rec.body, dict) else {}
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if not body.get("tools"):
        return Reply(text="It is probably mild outside.")
    if last.get("role") == "tool":
        result = json.loads(last.get("content") or "{}")
        return Reply(text=f"It is {result.get('sky', 'unknown')} and {result.get('temp_c', 0)} degrees in Paris.")
    return Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])


@pytest.fixture(scope="module")
def llm() -> Iterator[LlmServer]:
    with running_llm_server() as server:
        server.responder = respond
        yield server


@pytest.fixture(scope="module")
def server(tiny_kame_ckpt: Path, kame_cache_dir: Path, llm: LlmServer) -> Iterator[GoldenServer]:
    Normaliser.paths = {str(tiny_kame_ckpt): "<checkpoint>"}
    mp = pytest.MonkeyPatch()
    mp.setattr("kame.asr.factory.create_recognizer", lambda cfg, **kw: ScriptedRecognizer(AsrConfig()))
    try:
        srv = GoldenServer(tiny_kame_ckpt, kame_cache_dir, llm).start()
    finally:
        mp.undo()
    yield srv
    srv.stop()


@pytest.fixture
def script() -> Iterator[None]:
    yield
    ScriptedRecognizer.script = SCRIPT


# --------------------------------------------------------------------------- normalising

_ID_KEYS = re.compile(r"(^|_)id$|^id_|^call_id$|^item_id$|^response_id$|^previous_item_id$")
_TIME_KEYS = re.compile(r"(_ms|_s|_at)$|^(seconds|ms|t)$")
_VOLATILE_TEXT_EVENTS = {"session.output_transcript.delta"}  # Moshi's own words (a random tiny model)
_AUDIO_EVENTS = {"session.output_audio.delta"}
_CLOCK_EVENTS = {"session.usage.updated"}  # every usage_interval_s of wall time


class Normaliser:
    """Ids become ``<id:N>`` by first appearance (so which event refers to which survives), times ``<t>``."""

    #: Paths of this run (the tiny checkpoint lives in a temporary cache) -> a placeholder.
    paths: dict[str, str] = {}

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def id(self, value: str) -> str:
        if value not in self.ids:
            self.ids[value] = f"<id:{len(self.ids)}>"
        return self.ids[value]

    def value(self, key: str, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.value(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(key, v) for v in value]
        if isinstance(value, str) and value and _ID_KEYS.search(key) and not key.startswith("client_"):
            return self.id(value)
        if isinstance(value, str):
            for path, name in self.paths.items():
                value = value.replace(path, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _TIME_KEYS.search(key):
            return "<t>"
        return value


def normalise_json(events: list[dict[str, Any]]) -> list[Any]:
    """Collapse each run of audio (and of Moshi's words) into one entry; drop clock-driven usage reports."""
    n = Normaliser()
    out: list[Any] = []
    for event in events:
        etype = event.get("type", "")
        if etype in _CLOCK_EVENTS:
            continue
        if etype in _AUDIO_EVENTS or etype in _VOLATILE_TEXT_EVENTS:
            continue
        out.append(n.value("", event))
    return out


# --------------------------------------------------------------------------- the client


class Session:
    """A plain websocket client that keeps every message it receives."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.received: list[Any] = []
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._read())
        self.close_code: int | None = None

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self.received.append(json.loads(message) if isinstance(message, str) else message)
                self._new.set()
        except websockets.ConnectionClosed:
            pass
        self.close_code = self.ws.close_code
        self._new.set()

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def until(self, predicate: Any, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            for m in self.received:
                if predicate(m):
                    return m
            assert self.close_code is None or any(predicate(m) for m in self.received), \
                f"closed ({self.close_code}) before the awaited message; got {self.types()}"
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; got {self.types()}"
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), left)
            except asyncio.TimeoutError:
                pass

    def of_type(self, etype: str) -> list[dict[str, Any]]:
        return [m for m in self.received if isinstance(m, dict) and m.get("type") == etype]

    def types(self) -> list[str]:
        return [m.get("type", "?") if isinstance(m, dict) else f"bytes:{m[:1].hex()}" for m in self.received]

    async def closed(self, timeout: float = 20.0) -> None:
        await asyncio.wait_for(self._task, timeout)


def pcm16_b64(seconds: float, start: int = 0) -> list[str]:
    """A quiet tone in 80 ms chunks (its content is irrelevant: the recogniser is scripted)."""
    n = int(seconds * RATE)
    t = np.arange(start, start + n) / RATE
    pcm = (0.05 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    return [base64.b64encode(pcm[i:i + FRAME].tobytes()).decode() for i in range(0, n, FRAME)]


async def send_live_audio(s: Session, seconds: float) -> None:
    for i, chunk in enumerate(pcm16_b64(seconds)):
        await s.send({"type": "session.input_audio.append", "event_id": f"a{i}", "audio": chunk})
        await asyncio.sleep(FRAME / RATE)


def compare(name: str, log: list[Any]) -> None:
    path = GOLDEN / f"{name}.jsonl"
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in log)
    if os.environ.get("KAME_GOLDEN_UPDATE") == "1" or not path.exists() and os.environ.get("KAME_GOLDEN_CREATE") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    expected = path.read_text()
    assert text == expected, f"{name}: the event log differs from {path} (run with KAME_GOLDEN_UPDATE=1 to see the diff)"


async def wait_ready(server: GoldenServer) -> None:
    deadline = time.monotonic() + 10
    while not await asyncio.to_thread(server.ready):
        assert time.monotonic() < deadline, "the previous session's slot was not released"
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- the sessions


def test_chat(server: GoldenServer, script: None) -> None:
    """/api/chat: handshake, server info, Opus audio for a while, then a message kind Moshi does not know."""
    import sphn

    async def main() -> Session:
        await wait_ready(server)
        async with websockets.connect(server.ws("/api/chat?text_temperature=0.5"), max_size=None) as ws:
            s = Session(ws)
            await s.until(lambda m: isinstance(m, bytes) and m[:1] == b"\x00")
            writer = sphn.OpusStreamWriter(RATE)
            pcm = 0.05 * np.sin(2 * np.pi * 220 * np.arange(int(1.2 * RATE)) / RATE).astype(np.float32)
            for i in range(0, len(pcm), FRAME):
                ogg = writer.append_pcm(pcm[i:i + FRAME].astype(np.float32))
                if ogg:
                    await ws.send(b"\x01" + ogg)
                await asyncio.sleep(FRAME / RATE)
            await ws.send(b"\x09nonsense")
            await s.closed()
            return s

    s = asyncio.run(main())
    log: list[Any] = []
    for m in s.received:
        kind = m[:1]
        if kind in (b"\x01", b"\x02"):  # audio and Moshi's text pieces: the model's
            continue
        if kind == b"\x04":
            meta = json.loads(m[1:].decode())
            log.append({"kind": "0x04", "meta": Normaliser().value("", meta)})
        else:
            log.append({"kind": f"0x{kind.hex()}", "payload": m[1:].decode("utf-8", "replace")})
    log.append({"close_code": s.close_code})
    assert s.close_code is not None
    compare("chat", log)


LIVE_START = {"model": "gpt-live-1", "instructions": "Be brief.", "audio": {"format": {"type": "audio/pcm", "rate": 24000}}}


def test_live_client_delegation(server: GoldenServer, script: None) -> None:
    """Live, client delegation: start, a refused event, context, a turn -> delegation -> commentary, mute,
    update, a stale commentary, close."""

    async def main() -> Session:
        await wait_ready(server)
        async with websockets.connect(server.ws("/v1/live/sessions"), max_size=None) as ws:
            s = Session(ws)
            await s.send({"type": "session.start", "event_id": "start-1", "session": LIVE_START})
            await s.until(lambda m: m.get("type") == "session.started")
            await s.send({"type": "session.wobble", "event_id": "bad-1"})
            await s.until(lambda m: m.get("type") == "error")
            await s.send({"type": "session.thinking.append", "event_id": "think-1", "content": "The user is in Paris.",
                          "delegation_id": None})
            await s.until(lambda m: m.get("client_event_id") == "think-1")
            await send_live_audio(s, SCRIPT_AUDIO_S)
            created = await s.until(lambda m: m.get("type") == "session.delegation.created")
            await s.send({"type": "session.commentary.append", "event_id": "answer-1",
                          "content": "It is sunny in Paris today.", "delegation_id": created["delegation"]["id"]})
            await s.until(lambda m: m.get("type") == "kame.oracle.reset")
            await s.send({"type": "session.input_audio.mute", "event_id": "mute-1"})
            await s.until(lambda m: m.get("type") == "session.input_audio.muted")
            await s.send({"type": "session.input_audio.unmute", "event_id": "unmute-1"})
            await s.until(lambda m: m.get("type") == "session.input_audio.unmuted")
            await s.send({"type": "session.update", "event_id": "update-1",
                          "session": {"instructions": "Be very brief."}})
            await s.until(lambda m: m.get("client_event_id") == "update-1")
            await s.send({"type": "session.update", "event_id": "update-2", "session": {"kame": {"text_temperature": 0.5}}})
            await s.until(lambda m: m.get("type") == "session.updated")
            await s.send({"type": "session.commentary.append", "event_id": "answer-2",
                          "content": "zzz", "delegation_id": "dlg_unknown"})
            await s.until(lambda m: m.get("client_event_id") == "answer-2")
            await s.send({"type": "session.close", "event_id": "close-1"})
            await s.until(lambda m: m.get("type") == "session.closed")
            await s.closed()
            return s

    s = asyncio.run(main())
    assert s.close_code == 1000
    compare("live_client_delegation", normalise_json([m for m in s.received if isinstance(m, dict)])
            + [{"close_code": s.close_code}])


def test_live_responses_delegation(server: GoldenServer, script: None, llm: LlmServer) -> None:
    """Live, Responses delegation: start with the client's function, a turn -> delegation -> a round that
    calls it, the client's output and response.create, the answer round, close."""
    ScriptedRecognizer.script = FINAL_ONLY

    async def main() -> Session:
        await wait_ready(server)
        async with websockets.connect(server.ws("/v1/live/sessions"), max_size=None) as ws:
            s = Session(ws)
            responses = {"model": "llm", "instructions": "You are a weather assistant.", "tools": [WEATHER]}
            start = {**LIVE_START, "delegation": {"type": "responses", "responses": responses},
                     "input": [{"role": "user", "content": [{"type": "input_text", "text": "I live in Paris."}]}]}
            await s.send({"type": "session.start", "event_id": "start-1", "session": start})
            await s.until(lambda m: m.get("type") == "session.started")
            await send_live_audio(s, SCRIPT_AUDIO_S)
            await s.until(lambda m: m.get("type") == "session.delegation.created")

            def call_done(m: dict[str, Any]) -> bool:
                e = m.get("event") or {}
                return (m.get("type") == "response.event" and e.get("type") == "response.output_item.done"
                        and (e.get("item") or {}).get("type") == "function_call")

            call = (await s.until(call_done))["event"]["item"]
            await s.until(lambda m: m.get("type") == "response.event" and m["event"]["type"] == "response.completed")
            await s.send({"type": "response.item.create", "event_id": "out-1",
                          "item": {"type": "function_call_output", "call_id": call["call_id"],
                                   "output": json.dumps({"sky": "sunny", "temp_c": 21})}})
            await s.send({"type": "response.create", "event_id": "create-1"})
            await s.until(lambda m: m.get("type") == "kame.responses.answer" and m.get("round") == 1)
            await s.until(lambda m: m.get("type") == "response.event" and m["event"]["type"] == "response.completed"
                          and m["event"]["response"]["id"] != call.get("response_id")
                          and len([x for x in s.of_type("response.event")
                                   if x["event"]["type"] == "response.completed"]) >= 2)
            await s.send({"type": "session.close", "event_id": "close-1"})
            await s.until(lambda m: m.get("type") == "session.closed")
            await s.closed()
            return s

    s = asyncio.run(main())
    assert s.close_code == 1000
    compare("live_responses_delegation", normalise_json([m for m in s.received if isinstance(m, dict)])
            + [{"close_code": s.close_code}])
