"""Golden event logs (tests/test_golden_sessions.py): the in-process server, the scripted recogniser, the
normaliser, a plain websocket client and the comparison with ``tests/golden/<name>.jsonl``.

Why in process: the suite may start at most 8 counted server processes (tests/conftest.py), and the
sessions need a recogniser that says prepared words at prepared points of the audio (so that
transcripts, and the LLM requests and delegations they cause, are the same on every run), which only
a monkeypatch in this process can put in. Everything else is the real application (``create_app``:
admission, session runtime, wires, pipeline, the tiny KAME model on its engine thread, the back-end
registry with the real ``openai`` client) under uvicorn on loopback, talking to
tests/support/llm_server.py over HTTP.

What only the model or the clock decides is normalised away (:class:`Normaliser`, :func:`normalise_json`):
ids become ``<id:N>`` by first appearance (so which event refers to which survives), times ``<t>``,
audio and Moshi's own words (a random tiny model makes them up; their count is the clock's) are
dropped, clock-driven usage reports are dropped. ``KAME_UPDATE_GOLDEN=1`` rewrites the files.
"""

from __future__ import annotations

import asyncio
import base64
import difflib
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from kame.asr.events import Emission, EventType
from kame.asr.recognizer import Recognizer
from kame.asr.stream import AsrStream, EventCallback, ThreadedStream
from kame.asr.transcriber import Transcriber, TranscriberStats
from tests.support.llm_server import LlmServer, RecordedRequest
from tests.support.moshi_client import free_port

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
#: Set to ``1`` to rewrite the golden files from this run (review the diff, then commit it).
UPDATE_ENV = "KAME_UPDATE_GOLDEN"
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
#: Only the final (no partials): no speculative LLM request, whose cancellation is the clock's (a partial's
#: request may or may not finish before the next partial comes).
FINAL_ONLY: list[tuple[float, Emission]] = [SCRIPT[0], SCRIPT[3], SCRIPT[4]]
#: Audio a session sends: the script's last word comes at 1.68 s.
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
    """The recogniser of every golden session: a fresh :class:`ScriptedTranscriber` per stream. ``script``
    is the class's so that a test can choose it before its session opens (and restore it after)."""

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

    async def wait_ready(self) -> None:
        """Until a slot is free: the previous session's slot is released a moment after its close."""
        deadline = time.monotonic() + 10
        while not await asyncio.to_thread(self.ready):
            assert time.monotonic() < deadline, "the previous session's slot was not released"
            await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- normalising

_ID_KEYS = re.compile(r"(^|_)id$|^id_|^call_id$|^item_id$|^response_id$|^previous_item_id$")
_TIME_KEYS = re.compile(r"(_ms|_s|_at)$|^(seconds|ms|t)$")
#: Moshi's own words (a random tiny model makes them up, and how many pieces come is the clock's).
VOLATILE_TEXT_EVENTS = frozenset({"session.output_transcript.delta", "response.output_audio_transcript.delta"})
#: Audio out: one per 80 ms frame while the session lasts, so their count is the clock's.
AUDIO_EVENTS = frozenset({"session.output_audio.delta", "response.output_audio.delta", "kame.output_audio.delta"})
#: Sent every usage_interval_s of wall time; and a session's random resume handle (tests/calls/test_resume_*.py).
CLOCK_EVENTS = frozenset({"session.usage.updated", "kame.session.resumable"})


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


def normalise_json(events: list[dict[str, Any]], n: Normaliser | None = None) -> list[Any]:
    """Drop audio, Moshi's words and clock-driven usage reports; normalise ids and times of the rest."""
    n = n or Normaliser()
    out: list[Any] = []
    for event in events:
        etype = event.get("type", "")
        if etype in CLOCK_EVENTS or etype in AUDIO_EVENTS or etype in VOLATILE_TEXT_EVENTS:
            continue
        out.append(n.value("", event))
    return out


def realtime_log(events: list[dict[str, Any]], n: Normaliser | None = None) -> list[Any]:
    """A Realtime session's events without what Moshi's speech decides.

    :class:`~kame.server.wires.realtime.turns.AssistantTurns` cuts Moshi's continuous output into
    responses by its loudness, so how many unrequested responses there are, when they start and which
    one is open when a function call comes are the random tiny model's. Dropped: every event about an
    assistant audio message (the item, its content part, its audio and transcript), an unrequested
    response's ``response.created`` (a function call's response shows in its ``response.done``), and a
    ``response.done`` whose response kept no item of its own and was not cancelled by the client (a
    requested response ends when Moshi has been quiet for the end gap: the model's and the clock's).
    Kept, renumbered as if Moshi's messages were not there: ``previous_item_id`` (the nearest earlier item
    that is not Moshi's) and ``output_index`` (among the response's other items), so the conversation's
    order of user, function-call and output items stays pinned."""
    n = n or Normaliser()
    moshi: set[str] = set()
    previous: dict[str, str | None] = {}
    for e in events:
        item = e.get("item")
        if isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "assistant":
            moshi.add(str(item.get("id")))
        if e.get("type") == "conversation.item.added" and isinstance(item, dict):
            previous[str(item.get("id"))] = e.get("previous_item_id")

    def resolve(item_id: str | None) -> str | None:
        seen: set[str] = set()
        while item_id in moshi and item_id not in seen:
            seen.add(item_id)
            item_id = previous.get(item_id)
        return item_id

    index: dict[str, dict[str, int]] = {}  # response id -> item id -> index among the non-Moshi items
    out: list[Any] = []
    for e in events:
        etype = e.get("type", "")
        if etype in CLOCK_EVENTS or etype in AUDIO_EVENTS or etype in VOLATILE_TEXT_EVENTS:
            continue
        item = e.get("item")
        item_id = e.get("item_id") or (item.get("id") if isinstance(item, dict) else None)
        if item_id in moshi:
            continue
        e = dict(e)
        if etype in ("response.created", "response.done"):
            response = dict(e["response"])
            output = [o for o in response.get("output") or [] if o.get("id") not in moshi]
            if etype == "response.created" and response.get("metadata") is None:
                continue
            if etype == "response.done" and not output and response.get("status") != "cancelled":
                continue
            e["response"] = {**response, "output": output}
        if "previous_item_id" in e:
            e["previous_item_id"] = resolve(e["previous_item_id"])
        if "output_index" in e and "response_id" in e and item_id is not None:
            mine = index.setdefault(str(e["response_id"]), {})
            e["output_index"] = mine.setdefault(str(item_id), len(mine))
        out.append(n.value("", e))
    return out


#: What stands for Moshi's words in a request's history (:func:`llm_requests`).
MOSHI_WORDS = "<moshi's words>"


def llm_requests(llm: LlmServer, n: Normaliser | None = None, *, moshi_words: bool = False,
                 drop_moshi_words: bool = False) -> list[dict[str, Any]]:
    """What the back-end was asked, in order: the chat requests' messages, tools and tool choice (ids and
    times normalised): the answer-making that issue 26 moves must ask the same.

    ``moshi_words``: the history's assistant messages without tool calls are what Moshi said (Realtime
    keeps the spoken transcript as the assistant's turns), made up by the random tiny model and cut where
    the clock put the user's turn: each run of them becomes one ``MOSHI_WORDS`` message.
    ``drop_moshi_words``: whether there are any is the clock's too (after a cancel, the words Moshi said
    while its audio was withheld leave the history when the user's turn is committed, unless Moshi was
    quiet for the end gap before and spoke again): they are left out, and the messages of one role they
    separated are joined as the prompt joins them (one space)."""
    n = n or Normaliser()
    out: list[dict[str, Any]] = []
    for rec in llm.chat_requests():
        body: dict[str, Any] = rec.body if isinstance(rec.body, dict) else {}
        request = {k: body.get(k) for k in ("messages", "tools", "tool_choice") if body.get(k) is not None}
        if moshi_words or drop_moshi_words:
            messages: list[Any] = []
            for m in request.get("messages") or []:
                if isinstance(m, dict) and m.get("role") == "assistant" and not m.get("tool_calls"):
                    if drop_moshi_words or (messages and messages[-1] == {"role": "assistant", "content": MOSHI_WORDS}):
                        continue
                    m = {"role": "assistant", "content": MOSHI_WORDS}
                last = messages[-1] if messages else None
                if (drop_moshi_words and isinstance(m, dict) and isinstance(last, dict) and set(m) == set(last)
                        == {"role", "content"} and m["role"] == last["role"] and isinstance(m["content"], str)):
                    messages[-1] = {"role": m["role"], "content": f"{last['content']} {m['content']}"}
                    continue
                messages.append(m)
            request["messages"] = messages
        out.append({"llm_request": n.value("", request)})
    return out


def last_message(rec: RecordedRequest) -> dict[str, Any]:
    body = rec.body if isinstance(rec.body, dict) else {}
    messages = body.get("messages") or []
    return messages[-1] if messages else {}


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
                if isinstance(m, dict) and predicate(m) or isinstance(m, bytes) and _bytes_ok(predicate, m):
                    return m
            assert self.close_code is None, f"closed ({self.close_code}) before the awaited message; got {self.types()}"
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; got {self.types()}"
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), left)
            except asyncio.TimeoutError:
                pass

    def of_type(self, etype: str) -> list[dict[str, Any]]:
        return [m for m in self.received if isinstance(m, dict) and m.get("type") == etype]

    def json(self) -> list[dict[str, Any]]:
        return [m for m in self.received if isinstance(m, dict)]

    def types(self) -> list[str]:
        return [m.get("type", "?") if isinstance(m, dict) else f"bytes:{m[:1].hex()}" for m in self.received]

    async def closed(self, timeout: float = 20.0) -> None:
        await asyncio.wait_for(self._task, timeout)


def _bytes_ok(predicate: Any, m: bytes) -> bool:
    try:
        return bool(predicate(m))
    except (AttributeError, TypeError, KeyError):
        return False


def pcm16_b64(seconds: float, start: int = 0) -> list[str]:
    """A quiet tone in 80 ms chunks (its content is irrelevant: the recogniser is scripted)."""
    n = int(seconds * RATE)
    t = np.arange(start, start + n) / RATE
    pcm = (0.05 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    return [base64.b64encode(pcm[i:i + FRAME].tobytes()).decode() for i in range(0, n, FRAME)]


async def send_audio(s: Session, seconds: float, event_type: str, prefix: str = "a") -> None:
    """``seconds`` of audio in 80 ms events at the real-time pace (the engine steps one frame per 80 ms)."""
    for i, chunk in enumerate(pcm16_b64(seconds)):
        await s.send({"type": event_type, "event_id": f"{prefix}{i}", "audio": chunk})
        await asyncio.sleep(FRAME / RATE)


# --------------------------------------------------------------------------- the comparison


def compare(name: str, log: list[Any]) -> None:
    """The log must equal ``tests/golden/<name>.jsonl`` (one JSON object a line, keys sorted); with
    ``KAME_UPDATE_GOLDEN=1`` this run's log is written there instead (the diff goes into the commit)."""
    path = GOLDEN / f"{name}.jsonl"
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in log)
    if os.environ.get(UPDATE_ENV) == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with {UPDATE_ENV}=1 to write it"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), text.splitlines(keepends=True),
                                            str(path), "this run", n=1))
        raise AssertionError(f"{name}: the event log differs from {path} "
                             f"(a change on purpose: rerun with {UPDATE_ENV}=1 and commit the diff)\n{diff[:6000]}")
