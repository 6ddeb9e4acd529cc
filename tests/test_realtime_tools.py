"""Client-executed functions on /v1/realtime: the official OpenAI SDK's realtime client against the CPU demo.

The back-end is a real local LLM server streaming ``tool_calls`` in the chat-completions
format (tests/support/llm_server.py, reached by the server through the real ``openai`` client) or
the scripted back-end. The client defines functions in ``session.update``, receives each
call as its own response, returns a result with ``conversation.item.create`` +
``response.create``, and the words of the answer built on it reach Moshi's oracle after the
assistant began speaking. A read-only function called while the espeak question still plays
is reused by the final request; a side-effecting one runs exactly once, after the turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.support.llm_server import LlmServer, RecordedRequest, Reply, ToolCallScript
from tests.support.moshi_client import ServerProcess
from tests.support.servers import OPENAI_TOKEN, LlmStandins, responding
from tests.support.speech import silence, synthesize

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather where the user is.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "kame": {"read_only": True},
}
BOOK = {
    "type": "function",
    "name": "book_table",
    "description": "Book a table at the restaurant (a side effect).",
    "parameters": {"type": "object", "properties": {"time": {"type": "string"}}},
}



def llm(rec: RecordedRequest) -> Reply:
    """The LLM: answers from a function's output; calls get_weather as soon as it hears 'weather',
    book_table when it hears 'table' (only offered after the user's turn)."""
    results = rec.tool_messages
    if results:
        return Reply(text=f"Good news, {results[-1]['content']}.", first_token_delay_s=0.05)
    heard = (rec.last_user_message or "").lower()
    if "weather" in heard and "get_weather" in rec.tool_names:
        return Reply(text="Let me check.", first_token_delay_s=0.05,
                     tool_calls=[ToolCallScript("get_weather", {"city": "here"})])
    if "table" in heard and "book_table" in rec.tool_names:
        return Reply(text="One moment.", first_token_delay_s=0.05,
                     tool_calls=[ToolCallScript("book_table", {"time": "seven"})])
    return Reply(text="I am listening.", first_token_delay_s=0.05)


@pytest.fixture(scope="module")
def llm_backend(llm_standins: LlmStandins) -> Iterator[LlmServer]:
    """The shared ``openai`` server's ``llm`` and ``notools`` back-ends (tools-model, plain-model)."""
    with responding(llm_standins.llm, responder=llm):
        yield llm_standins.llm


@pytest.fixture(scope="module")
def server(openai_server: ServerProcess) -> ServerProcess:
    """tests/support/servers.py ``OPENAI``: ``llm`` (tools allowed) by default, ``notools``; a token."""
    return openai_server


def pcm16(pcm: np.ndarray) -> bytes:
    return (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()


class Session:
    """An SDK connection that answers function calls and records what arrives, with arrival times."""

    def __init__(self, conn: Any, answers: dict[str, str]) -> None:
        self.conn = conn
        self.answers = answers
        self.events: list[tuple[float, Any]] = []
        self.calls: list[tuple[float, Any]] = []  # (time, response.output_item.done with a function_call)
        self.first_transcript_at: float | None = None
        self.errors: list[Any] = []

    def of(self, *types: str) -> list[Any]:
        return [e for _, e in self.events if e.type in types]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                event = await asyncio.wait_for(self.conn.recv(), 0.5)
            except asyncio.TimeoutError:
                continue
            now = time.monotonic()
            if event.type in ("response.output_audio.delta", "kame.output_audio.delta"):
                continue
            if event.type == "response.output_audio_transcript.delta":
                if self.first_transcript_at is None:
                    self.first_transcript_at = now
                continue
            self.events.append((now, event))
            if event.type == "error":
                self.errors.append(event)
            if event.type == "response.output_item.done" and event.item.type == "function_call":
                self.calls.append((now, event))
                output = self.answers[event.item.name]
                await self.conn.conversation.item.create(
                    item={"type": "function_call_output", "call_id": event.item.call_id, "output": output}
                )
                await self.conn.response.create()


async def speak(conn: Any, pcm: np.ndarray, chunk: int = 960) -> None:
    import base64

    data = pcm16(pcm)
    step = chunk * 2
    start = time.monotonic()
    for k, i in enumerate(range(0, len(data), step)):
        delay = start + k * chunk / 24000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())


def oracle_sequences(s: Session) -> list[tuple[float, str]]:
    """Each oracle sequence (a reset and the text events after it): when it started, all its words."""
    out: list[tuple[float, str]] = []
    for t, e in s.events:
        if e.type == "kame.oracle.reset":
            out.append((t, str(getattr(e, "text", ""))))
        elif e.type == "kame.oracle.text" and out:
            out[-1] = (out[-1][0], str(getattr(e, "text", "")))
    return out


def run_session(server: ServerProcess, question: str, tools: list[dict[str, Any]], answers: dict[str, str],
                extra: dict[str, Any] | None = None) -> tuple[Session, Any, float]:
    from openai import AsyncOpenAI

    pcm = np.concatenate([silence(0.3), synthesize(question), silence(3.5)])
    speech_end = 0.3 + len(synthesize(question)) / 24000

    async def main() -> tuple[Session, Any, float]:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=OPENAI_TOKEN)
        async with client.realtime.connect(model="kame", extra_query={"kame_events": "1"}) as conn:
            await asyncio.wait_for(conn.recv(), 15)  # session.created
            # kame's events asked for: the resume handle comes next (docs/protocol.md, "Resuming a session")
            assert (await asyncio.wait_for(conn.recv(), 5)).type == "kame.session.resumable"
            await conn.session.update(session={"type": "realtime", "tools": tools, "tool_choice": "auto", **(extra or {})})
            updated = await asyncio.wait_for(conn.recv(), 5)
            s = Session(conn, answers)
            stop = asyncio.Event()
            collector = asyncio.create_task(s.run(stop))
            t0 = time.monotonic()
            await speak(conn, pcm)
            stop.set()
            await collector
            return s, updated, t0 + speech_end

    return asyncio.run(main())


def test_read_only_function_during_the_question_is_reused_and_its_answer_reaches_the_oracle(
    server: ServerProcess, llm_backend: LlmServer
) -> None:
    llm_backend.reset()
    llm_backend.responder = llm
    s, updated, speech_end = run_session(server, "Can you tell me what the weather is like today, please?",
                                         [WEATHER], {"get_weather": "it is sunny and warm"})
    assert updated.type == "session.updated"
    tools = updated.session.model_extra["tools"] if "tools" in (updated.session.model_extra or {}) else updated.session.tools
    assert [t["name"] if isinstance(t, dict) else t.name for t in tools] == ["get_weather"]
    assert s.errors == [], [e.error for e in s.errors]
    # exactly one call, made while the question was still being spoken: the last output item of the response
    # in progress (one of its own if none was), which ends with it
    assert len(s.calls) == 1, [c.item for _, c in s.calls]
    at, done = s.calls[0]
    assert done.item.name == "get_weather" and json.loads(done.item.arguments) == {"city": "here"}
    assert at < speech_end, f"the call came {at - speech_end:+.2f} s after the end of the question"
    created = [e for e in s.of("response.created")]
    fc_responses = [e for e in s.of("response.done") if any(o.type == "function_call" for o in e.response.output)]
    assert len(fc_responses) == 1 and fc_responses[0].response.output[-1].call_id == done.item.call_id
    assert created
    # the final request (after the turn) reused the running call's result: it carried the output
    chat = llm_backend.chat_requests()
    with_output = [r for r in chat if r.tool_messages]
    assert with_output and all(m["content"] == "it is sunny and warm" for r in with_output for m in r.tool_messages)
    # the answer on the result reached the oracle as a sequence of its own, after the assistant began speaking
    sequences = oracle_sequences(s)
    tool_answers = [(t, text) for t, text in sequences if text.startswith("Good news")]
    assert any(text == "Good news, it is sunny and warm." for _, text in tool_answers), sequences
    assert s.first_transcript_at is not None and s.first_transcript_at < tool_answers[0][0]
    started = s.of("kame.tool.call_started")
    finished = s.of("kame.tool.call_finished")
    assert started and finished and getattr(finished[0], "outcome", None) == "ok"


def test_side_effecting_function_runs_once_after_the_turn(server: ServerProcess, llm_backend: LlmServer) -> None:
    llm_backend.reset()
    llm_backend.responder = llm
    s, _, speech_end = run_session(server, "I would like a table for two people tonight, at seven.", [WEATHER, BOOK],
                                   {"get_weather": "sunny", "book_table": "booked for seven"})
    assert s.errors == [], [e.error for e in s.errors]
    books = [(t, c) for t, c in s.calls if c.item.name == "book_table"]
    assert len(books) == 1, [c.item.name for _, c in s.calls]
    assert books[0][0] > speech_end, "a side-effecting call ran before the user finished"
    partial_requests = [r for r in llm_backend.chat_requests() if "book_table" not in r.tool_names]
    assert partial_requests, "requests on partial transcripts must not offer book_table"
    assert any(text == "Good news, booked for seven." for _, text in oracle_sequences(s)), oracle_sequences(s)


def test_function_errors(server: ServerProcess) -> None:
    """Unknown call_id, output too large, tools on a back-end that may not: an error each, the session goes on."""
    from openai import AsyncOpenAI

    async def main() -> list[Any]:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=OPENAI_TOKEN)
        got: list[Any] = []
        async with client.realtime.connect(model="kame", extra_query={"kame_events": "1"}) as conn:
            await asyncio.wait_for(conn.recv(), 15)  # session.created
            assert (await asyncio.wait_for(conn.recv(), 5)).type == "kame.session.resumable"
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": "call_nope", "output": "x"})
            got.append(await asyncio.wait_for(conn.recv(), 5))
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": "call_nope", "output": "x" * 100_000})
            got.append(await asyncio.wait_for(conn.recv(), 5))
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "kame": {"backend": "notools"}})
            got.append(await asyncio.wait_for(conn.recv(), 5))
            await conn.session.update(session={"type": "realtime", "tools": [{"type": "mcp", "server_url": "http://x"}]})
            got.append(await asyncio.wait_for(conn.recv(), 5))
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER]})
            got.append(await asyncio.wait_for(conn.recv(), 5))
        return got

    unknown, too_big, notools, mcp, ok = asyncio.run(main())
    assert unknown.type == "error" and unknown.error.code == "unknown_call_id"
    assert too_big.type == "error" and too_big.error.code == "output_too_large"
    assert notools.type == "error" and notools.error.code == "tools_not_allowed"
    assert mcp.type == "error" and mcp.error.code == "unsupported_tool_type"
    assert ok.type == "session.updated"
