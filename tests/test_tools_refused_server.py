"""A back-end whose server refuses tools as vLLM does, on the real CPU demo server: /v1/realtime (the official
SDK's realtime client) and /v1/live/sessions (Responses delegation, kame.client.live_client).

Each back-end is a real HTTP server on 127.0.0.1 reached through the real `openai` client
(tests/vllm_like_server.py): ``rt`` and ``live`` refuse tools with vLLM's status and body, ``ok`` accepts
them. The first request with tools is refused: the back-end is marked tool-less for the process (one log
line, a metric), that turn is still answered (asked again at once without tools), the session is told once
(``kame.backend.tools_refused`` on Realtime, an ``info`` ``kame.tools_refused`` on Live; never an ``error``),
and later requests go without tools, without a retry.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kame.client.live_client import LiveClient
from tests.support.llm_server import RecordedRequest, Reply, ToolCallScript
from tests.support.moshi_client import ServerProcess
from tests.support.servers import OPENAI_TOKEN, LlmStandins, responding
from tests.support.speech import silence, synthesize
from tests.support.vllm_like_server import VllmLikeServer

TOKEN = OPENAI_TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ANSWER = "It is sunny and mild in Paris today."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def respond(rec: RecordedRequest) -> Reply:
    """Calls get_weather when offered it (a server with tool calling on), else answers."""
    body = rec.body if isinstance(rec.body, dict) else {}
    if body.get("tools") and not rec.tool_messages:
        return Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])
    return Reply(text=ANSWER)


@pytest.fixture(scope="module")
def llms(llm_standins: LlmStandins) -> Iterator[dict[str, VllmLikeServer]]:
    """The shared ``openai`` server's vLLM-like back-ends: ``rt`` and ``live`` refuse tools, ``ok`` takes them."""
    servers = {"rt": llm_standins.rt, "live": llm_standins.live, "ok": llm_standins.ok}
    with responding(*servers.values(), responder=respond):
        yield servers


@pytest.fixture(scope="module")
def server(openai_server: ServerProcess, llms: dict[str, VllmLikeServer]) -> ServerProcess:
    """tests/support/servers.py ``OPENAI``: the back-ends ``rt``, ``live`` and ``ok`` only this file uses; a token."""
    return openai_server


def question(text: str, after_s: float) -> np.ndarray:
    return np.concatenate([silence(0.3), synthesize(text), silence(after_s)])


# --------------------------------------------------------------------------- /v1/realtime


def realtime_session(server: ServerProcess, backend: str, pcm: np.ndarray) -> tuple[Any, list[Any]]:
    """One SDK session declaring get_weather on ``backend``; speaks ``pcm`` at real time; returns
    session.updated and every event but audio. Function calls are answered as a client would."""
    from openai import AsyncOpenAI

    async def main() -> tuple[Any, list[Any]]:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=TOKEN)
        events: list[Any] = []
        async with client.realtime.connect(model="kame") as conn:
            await asyncio.wait_for(conn.recv(), 15)  # session.created
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "tool_choice": "auto",
                                               "kame": {"backend": backend}})
            updated = await asyncio.wait_for(conn.recv(), 5)
            stop = asyncio.Event()

            async def collect() -> None:
                while not stop.is_set():
                    try:
                        event = await asyncio.wait_for(conn.recv(), 0.5)
                    except asyncio.TimeoutError:
                        continue
                    if event.type in ("response.output_audio.delta", "kame.output_audio.delta"):
                        continue
                    events.append(event)
                    if event.type == "response.output_item.done" and event.item.type == "function_call":
                        await conn.conversation.item.create(item={
                            "type": "function_call_output", "call_id": event.item.call_id, "output": "sunny"})
                        await conn.response.create()

            collector = asyncio.create_task(collect())
            data = (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()
            step, start = 1920, time.monotonic()
            for k, i in enumerate(range(0, len(data), step)):
                delay = start + k * 960 / 24000 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())
            stop.set()
            await collector
        return updated, events

    return asyncio.run(main())


def test_realtime_session_on_a_server_that_refuses_tools(server: ServerProcess, llms: dict[str, VllmLikeServer]) -> None:
    rt = llms["rt"]
    updated, events = realtime_session(server, "rt", question("What is the weather like in Paris today?", 3.5))
    assert updated.type == "session.updated"  # the functions are accepted: allow_tools is on by default
    assert [e for e in events if e.type == "error"] == []
    notices = [e for e in events if e.type == "kame.backend.tools_refused"]
    assert len(notices) == 1, [e.type for e in events]
    assert notices[0].backend == "rt" and "--enable-auto-tool-choice" in notices[0].reason
    # the refused turn was answered (without tools): the answer reached Moshi's oracle
    resets = [str(getattr(e, "text", "")) for e in events if e.type == "kame.oracle.reset"]
    assert any(ANSWER.startswith(text) for text in resets if text), resets
    # one refusal, asked again at once without tools, every later request without them
    chat = rt.chat_requests()
    # (get_weather is not read-only: it is offered only once the user's turn ended, so the guesses on partial
    # transcripts before it carried no tools)
    assert len(rt.refused) == 1 and len(chat) >= 3, [r.tool_names for r in chat]
    i = next(k for k, r in enumerate(chat) if r is rt.refused[0])
    assert [bool(r.tool_names) for r in chat] == [k == i for k in range(len(chat))]
    retry = chat[i + 1]
    assert retry.received_at - rt.refused[0].received_at < 1.0 and retry.last_user_message == chat[i].last_user_message
    assert server.metric("kame_llm_tools_refused_total", 'backend="rt"', headers=AUTH) == 1
    lines = [line for line in server.logs().splitlines() if "refuses function tools" in line and "rt" in line]
    assert len(lines) == 1 and "--enable-auto-tool-choice" in lines[0], lines

    # a later session on the same back-end: told once, its requests go without tools, no new refusal
    before = len(rt.chat_requests())
    _, events = realtime_session(server, "rt", question("Hello there, how are you?", 2.5))
    assert [e for e in events if e.type == "error"] == []
    assert len([e for e in events if e.type == "kame.backend.tools_refused"]) == 1
    later = rt.chat_requests()[before:]
    assert later and all(not r.tool_names for r in later) and len(rt.refused) == 1
    assert server.metric("kame_llm_tools_refused_total", 'backend="rt"', headers=AUTH) == 1


def test_realtime_session_on_a_server_that_accepts_tools(server: ServerProcess, llms: dict[str, VllmLikeServer]) -> None:
    ok = llms["ok"]
    _, events = realtime_session(server, "ok", question("What is the weather like in Paris today?", 3.5))
    assert [e for e in events if e.type == "error"] == []
    assert not [e for e in events if e.type == "kame.backend.tools_refused"]
    calls = [e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert calls and calls[0].item.name == "get_weather"
    assert any(r.tool_names == ["get_weather"] for r in ok.chat_requests()) and ok.refused == []
    assert server.metric("kame_llm_tools_refused_total", 'backend="ok"', headers=AUTH) == 0


# --------------------------------------------------------------------------- /v1/live/sessions


def live_session(server: ServerProcess, backend: str, pcm: np.ndarray, until: str) -> LiveClient:
    async def main() -> LiveClient:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        started = await c.start({"model": "gpt-live-1", "delegation": {
            "type": "responses", "responses": {"model": backend, "tools": [WEATHER]}}})
        assert started is not None, c.events
        mic = asyncio.create_task(c.send_pcm(pcm))
        if until == "answer":
            await c.wait_for(lambda e: e.get("type") == "kame.responses.answer" and ANSWER in e.get("text", ""), 25)
        else:
            await c.wait_for(lambda e: e.get("type") == "response.event"
                             and e["event"]["type"] == "response.output_item.done"
                             and (e["event"].get("item") or {}).get("type") == "function_call", 25)
        mic.cancel()
        await c.close_session()
        await asyncio.wait_for(c.closed.wait(), 5)
        return c

    return asyncio.run(main())


def test_live_delegation_on_a_server_that_refuses_tools(server: ServerProcess, llms: dict[str, VllmLikeServer]) -> None:
    live = llms["live"]
    c = live_session(server, "live", question("What is the weather like in Paris today?", 8.0), "answer")
    assert c.errors == [], c.errors
    infos = [e for e in c.of_type("info") if e.get("code") == "kame.tools_refused"]
    assert len(infos) == 1 and "'live'" in infos[0]["message"] and "--enable-auto-tool-choice" in infos[0]["message"]
    answers = [a["text"] for a in c.of_type("kame.responses.answer")]
    assert ANSWER in answers, answers
    completed = [e["event"] for e in c.of_type("response.event") if e["event"]["type"] == "response.completed"]
    assert completed, [e["event"]["type"] for e in c.of_type("response.event")]
    delegated = [r for r in live.chat_requests() if r.body.get("tools")]
    assert delegated == live.refused and len(live.refused) == 1  # the refused one only; then without tools
    assert server.metric("kame_llm_tools_refused_total", 'backend="live"', headers=AUTH) == 1


def test_live_delegation_on_a_server_that_accepts_tools(server: ServerProcess, llms: dict[str, VllmLikeServer]) -> None:
    ok = llms["ok"]
    c = live_session(server, "ok", question("What is the weather like in Paris today?", 8.0), "call")
    assert c.errors == [], c.errors
    assert not [e for e in c.of_type("info") if e.get("code") == "kame.tools_refused"]
    assert any(r.tool_names == ["get_weather"] for r in ok.chat_requests()) and ok.refused == []
