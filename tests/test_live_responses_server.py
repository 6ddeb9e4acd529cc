"""/v1/live/sessions in Responses delegation on the real CPU demo server (tiny KAME model, Whisper tiny.en),
driven by the official SDK's ``client.live.connect()`` (kame.client.live_client), with kame's back-end a
real local LLM server that streams a tool call (tests/support/llm_server.py, through the real `openai` client).

An espeak question plays at real time; kame guesses while it plays (its own requests: no tools, only
``kame.backend.*`` events), then the user's turn becomes the delegation: ``session.delegation.created``
(target ``responses``), the nested Responses events, a function call the client runs and answers; the
answer built on its result reaches Moshi's oracle; a second question in the same session reuses the
conversation. A back-end that fails ends its response ``failed`` and the session goes on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kame.client.live_client import LiveClient
from tests.support.llm_server import LlmServer, RecordedRequest, Reply, ToolCallScript
from tests.support.moshi_client import ServerProcess
from tests.support.servers import OPENAI_TOKEN, LlmStandins, responding
from tests.support.speech import silence, synthesize

TOKEN = OPENAI_TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def respond(rec: RecordedRequest) -> Reply:
    """The LLM's script: guesses without tools; with tools, a call, then an answer from its output."""
    body = rec.body if isinstance(rec.body, dict) else {}
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if not body.get("tools"):
        return Reply(text="It is probably mild outside.")
    if last.get("role") == "tool":
        result = json.loads(last.get("content") or "{}")
        return Reply(text=f"It is {result.get('sky', 'unknown')} and {result.get('temp_c', 0)} degrees in Paris.")
    if "tomorrow" in str(last.get("content", "")).lower():
        return Reply(text="Tomorrow it will rain in Paris.")
    if "fail" in str(last.get("content", "")).lower():
        return Reply(status=500, error_message="upstream exploded")
    return Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])


@pytest.fixture(scope="module")
def llm(llm_standins: LlmStandins) -> Iterator[LlmServer]:
    """The shared ``openai`` server's ``llm`` back-end, answering with ``respond``."""
    with responding(llm_standins.llm, responder=respond):
        yield llm_standins.llm


@pytest.fixture(scope="module")
def server(openai_server: ServerProcess, llm: LlmServer) -> ServerProcess:
    """tests/support/servers.py ``OPENAI``: the ``llm`` back-end (tools allowed); a token."""
    return openai_server


def spoken(text: str, after_s: float) -> np.ndarray:
    return np.concatenate([synthesize(text), silence(after_s)])


def test_sdk_responses_delegation_on_the_cpu_demo(server: ServerProcess, llm: LlmServer) -> None:
    first_q = np.concatenate([silence(0.3), spoken("What is the weather in Paris?", 7.0)])
    second_q = spoken("And what about tomorrow?", 6.0)
    ran: list[dict[str, Any]] = []

    async def answer_calls(c: LiveClient, stop: asyncio.Event) -> None:
        """Pipecat's way: run each completed function_call item, answer, then response.create."""
        seen = 0
        pending = False
        while not stop.is_set():
            events = [e for _, e in c.events]
            for event in events[seen:]:
                if event.get("type") != "response.event":
                    continue
                nested = event["event"]
                item = nested.get("item") or {}
                if nested["type"] == "response.output_item.done" and item.get("type") == "function_call":
                    assert item["status"] == "completed"
                    ran.append(json.loads(item["arguments"]))
                    await c.conn.response.item.create(
                        item={
                            "type": "function_call_output",
                            "call_id": item["call_id"],
                            "output": json.dumps({"sky": "sunny", "temp_c": 21}),
                        }
                    )
                    pending = True
                elif nested["type"] == "response.completed" and pending:
                    pending = False
                    await c.conn.response.create()
            seen = len(events)
            await asyncio.sleep(0.02)

    async def main() -> LiveClient:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        started = await c.start(
            {
                "model": "gpt-live-1",
                "delegation": {
                    "type": "responses",
                    "responses": {"model": "llm", "instructions": "You are a weather assistant.", "tools": [WEATHER]},
                },
            },
            event_id="s1",
        )
        assert started is not None, c.events
        stop = asyncio.Event()
        runner = asyncio.create_task(answer_calls(c, stop))
        await c.send_pcm(np.concatenate([first_q, second_q]))
        await c.wait_for(lambda e: e.get("type") == "kame.responses.answer" and "rain" in e.get("text", ""), 20)
        stop.set()
        await runner
        await c.close_session()
        await asyncio.wait_for(c.closed.wait(), 5)
        return c

    resets_before = server.metric("kame_oracle_resets_total", headers=AUTH)
    calls_label = 'outcome="ok",tool="client_function"'
    calls_before = server.metric("kame_tool_calls_total", calls_label, headers=AUTH)
    c = asyncio.run(main())
    assert server.metric("kame_tool_calls_total", calls_label, headers=AUTH) - calls_before == 1
    assert c.errors == [], c.errors
    heard = c.transcript("user").lower()
    assert "weather" in heard and "tomorrow" in heard, heard
    session = c.of_type("session.started")[0]["session"]
    assert session["delegation"]["type"] == "responses"
    assert session["delegation"]["responses"]["tools"][0]["name"] == "get_weather"
    # one delegation per question, each after the words it covers, with its first response's id
    delegations = c.of_type("session.delegation.created")
    assert len(delegations) == 2 and all(d["delegation"]["target"] == "responses" for d in delegations)
    order = [
        e
        for _, e in c.events
        if e.get("type") in ("session.input_transcript.delta", "session.delegation.created", "response.event")
    ]
    first = next(i for i, e in enumerate(order) if e["type"] == "session.delegation.created")
    before = "".join(e.get("delta", "") for e in order[:first]).lower()
    assert "weather" in before, before
    assert order[first + 1]["type"] == "response.event"
    assert order[first + 1]["event"]["type"] == "response.created"
    assert order[first + 1]["event"]["response"]["id"] == delegations[0]["delegation"]["response_id"]
    # the function ran once, on the client, and the answer built on its output reached the oracle
    assert ran == [{"city": "Paris"}]
    answers = c.of_type("kame.responses.answer")
    texts = [a["text"] for a in answers]
    assert texts == ["Let me check.", "It is sunny and 21 degrees in Paris.", "Tomorrow it will rain in Paris."], texts
    assert [a["after_tools"] for a in answers] == [False, True, False]
    completed = [e["event"] for e in c.of_type("response.event") if e["event"]["type"] == "response.completed"]
    assert len(completed) == 3 and all(r["response"]["usage"]["total_tokens"] > 0 for r in completed)
    # kame's guesses while the user spoke: no tools, only kame.backend.* events, answers to the oracle
    guesses = [r for r in llm.chat_requests() if not r.body.get("tools")]
    delegated = [r for r in llm.chat_requests() if r.body.get("tools")]
    assert guesses and c.of_type("kame.backend.request_started")
    assert len(delegated) == 3
    history = [m["role"] for m in delegated[2].body["messages"][1:]]
    assert history == ["user", "assistant", "tool", "assistant", "user"], history
    # every answer, guesses included, was one new oracle sequence
    resets = server.metric("kame_oracle_resets_total", headers=AUTH) - resets_before
    assert resets == len(answers) + len(c.of_type("kame.oracle.reset")), resets
    assert c.of_type("session.closed")[0]["reason"] == "close_requested"


def test_a_failing_backend_fails_the_response_and_the_session_goes_on(server: ServerProcess) -> None:
    """The back-end answers 500 for this question: the response ends ``failed``; audio and the session go on."""

    async def main() -> LiveClient:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        assert (
            await c.start(
                {
                    "model": "gpt-live-1",
                    "delegation": {"type": "responses", "responses": {"model": "llm", "tools": [WEATHER]}},
                }
            )
            is not None
        )
        mic = asyncio.create_task(c.send_pcm(spoken("This will fail, sorry.", 4.0)))
        failed = await c.wait_for(
            lambda e: e.get("type") == "response.event" and e["event"]["type"] == "response.failed", 20
        )
        assert failed is not None, c.transcript("user")
        frames = len(c.stats.frame_arrivals)
        await mic
        assert len(c.stats.frame_arrivals) - frames > 10  # Moshi kept talking after the failure
        await c.close_session()
        return c

    c = asyncio.run(main())
    failed = [e["event"] for e in c.of_type("response.event") if e["event"]["type"] == "response.failed"][0]
    assert failed["response"]["error"]["code"] == "server_error" and "500" in failed["response"]["error"]["message"]
    assert c.of_type("session.closed")[0]["reason"] == "close_requested"


@pytest.fixture(scope="module")
def demo(demo_server: ServerProcess) -> ServerProcess:
    """The stock CPU demo (``--config cpu-demo``): its default back-end is the scripted one."""
    return demo_server


def test_a_framework_with_its_own_model_name_on_the_stock_cpu_demo(demo: ServerProcess) -> None:
    """A client names its own Responses model (as Pipecat users do); the demo's scripted back-end runs the
    delegation anyway (an ``info`` says so), calls the client's get_weather and answers from its output."""
    ran: list[dict[str, Any]] = []

    async def main() -> LiveClient:
        c = await LiveClient.connect(demo.http_url)
        assert (
            await c.start(
                {
                    "model": "gpt-live-1",
                    "delegation": {
                        "type": "responses",
                        "responses": {
                            "model": "gpt-5.4-mini",
                            "instructions": "Help with the weather.",
                            "tools": [WEATHER],
                        },
                    },
                }
            )
            is not None
        )
        mic = asyncio.create_task(c.send_pcm(spoken("What is the weather like?", 6.0)))
        call = await c.wait_for(
            lambda e: (
                e.get("type") == "response.event"
                and e["event"]["type"] == "response.output_item.done"
                and e["event"]["item"]["type"] == "function_call"
            ),
            20,
        )
        assert call is not None, c.transcript("user")
        item = call["event"]["item"]
        ran.append(json.loads(item["arguments"]))
        await c.wait_for(lambda e: e.get("type") == "response.event" and e["event"]["type"] == "response.completed", 5)
        await c.conn.response.item.create(
            item={"type": "function_call_output", "call_id": item["call_id"], "output": "sunny and warm"}
        )
        await c.conn.response.create()
        answer = await c.wait_for(lambda e: e.get("type") == "kame.responses.answer" and e["after_tools"], 15)
        assert answer is not None
        await mic
        await c.close_session()
        return c

    c = asyncio.run(main())
    assert c.errors == [], c.errors
    assert any("gpt-5.4-mini" in e["message"] for e in c.of_type("info"))
    assert ran and ran[0] == {"city": "here"}  # the demo script's call
    texts = [a["text"] for a in c.of_type("kame.responses.answer")]
    assert texts[0] == "Let me check the weather." and "sunny and warm" in texts[-1], texts
