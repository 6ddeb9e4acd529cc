"""The Live wire in Responses delegation: session.start with delegation.responses, the user's turn as the
delegation, the nested response.event stream, the client's function output and response.create, answers
to the oracle. The back-end is the registry with the real `openai` client against tests/support/llm_server.py;
every event is encoded as on the wire and parsed with the openai SDK's own Live models."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kame.server.wires.live.config import LiveServerInfo
from kame.server.wires.live.events import DelegationCreated
from tests.support.live_responses import SERVER_EVENT, WEATHER, Client  # noqa: F401
from tests.support.live_session import LiveSession
from tests.support.llm_server import LlmServer, Reply, ToolCallScript


def start(client: Client, **responses: Any) -> Any:
    cfg = {"model": "llm", "instructions": "You are a weather assistant.", "tools": [WEATHER], **responses}
    return client.message(
        {
            "type": "session.start",
            "event_id": "s1",
            "session": {
                "model": "gpt-live-1",
                "instructions": "Speak warmly.",
                "delegation": {"type": "responses", "responses": cfg},
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "I live in Paris."}]}],
            },
        }
    )


def test_a_full_exchange_and_a_second_question(llm_server: LlmServer, encode: Callable[[str], list[int]]) -> None:
    llm_server.push(
        Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]),
        Reply(text="It is sunny and twenty one degrees in Paris."),
        Reply(text="Tomorrow it will rain."),
    )

    async def main() -> Client:
        c = Client(llm_server, encode)
        out = start(c, reasoning={"effort": "low"})
        assert out.started and not out.errors
        started = c.of_type("session.started")[0]["session"]
        assert started["delegation"]["type"] == "responses"
        assert started["delegation"]["responses"]["tools"][0]["name"] == "get_weather"
        assert any(e["type"] == "info" and "reasoning" in e["message"] for e in c.sent)
        c.sends(c.wire.speech_started(1, 0.0))
        c.sends(c.wire.final(1, 1.5, "What is the weather today?", 2.0))
        created = c.of_type("session.delegation.created")[0]
        assert created["delegation"]["target"] == "responses" and created["delegation"]["response_id"]
        await c.until(lambda: c.wire.responses is not None and c.wire.responses.delegator._waiting is not None)
        call = next(e["item"] for e in c.nested("response.output_item.done") if e["item"]["type"] == "function_call")
        assert c.sent.index(created) < c.sent.index(c.of_type("response.event")[0])  # the delegation first
        assert c.nested("response.created")[0]["response"]["id"] == created["delegation"]["response_id"]
        c.message(
            {
                "type": "response.item.create",
                "event_id": "i1",
                "item": {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temp_c": 21}'},
            }
        )
        c.message({"type": "response.create", "event_id": "r1"})
        await c.until(lambda: len(c.nested("response.completed")) == 2 and len(c.answers) == 2)
        assert not c.of_type("error")
        # Each round's text is its own oracle answer: "let me check", then the answer built on the result.
        assert [a.text for a in c.answers] == ["Let me check.", "It is sunny and twenty one degrees in Paris."]
        assert [a.ids for a in c.answers] == [tuple(encode(a.text)) for a in c.answers]
        reached = [e for e in c.sent if e["type"] == "kame.responses.answer"]
        assert [e["after_tools"] for e in reached] == [False, True]
        # A second question: a new delegation on the same conversation.
        c.sends(c.wire.speech_started(2, 5.0))
        c.sends(c.wire.final(2, 6.0, "And tomorrow?", 7.0))
        await c.until(lambda: len(c.answers) == 3)
        assert len(c.of_type("session.delegation.created")) == 2
        await c.wire.responses.aclose() if c.wire.responses else None
        await c.registry.aclose()
        return c

    c = asyncio.run(main())
    reqs = llm_server.chat_requests()
    first = reqs[0].body["messages"]
    assert "You are a weather assistant." in first[0]["content"] and "Speak warmly." not in first[0]["content"]
    assert [m["content"] for m in first[1:]] == ["I live in Paris. What is the weather today?"]
    assert reqs[1].tool_messages[0]["content"] == '{"temp_c": 21}'
    third = reqs[2].body["messages"]
    assert [m["role"] for m in third[1:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert third[-1]["content"] == "And tomorrow?"
    assert c.answers[-1].text == "Tomorrow it will rain."


def test_responses_commands_and_appends(llm_server: LlmServer, encode: Callable[[str], list[int]]) -> None:
    llm_server.push(Reply(text="You asked about trains."))

    async def main() -> Client:
        c = Client(llm_server, encode)
        start(c)
        out = c.message({"type": "session.thinking.append", "content": "x", "delegation_id": "dlg_1"})
        assert out.errors and out.errors[0].param == "delegation_id"
        c.message({"type": "session.instructions.append", "content": "Mention trains.", "delegation_id": None})
        c.message(
            {
                "type": "response.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Typed: how do I get to Lyon?"}],
                },
            }
        )
        out = c.message(
            {
                "type": "response.item.create",
                "event_id": "bad",
                "item": {"type": "function_call_output", "call_id": "call_x", "output": "1"},
            }
        )
        assert out.errors[0].code == "unknown_call_id" and c.of_type("error")[-1]["error"]["client_event_id"] == "bad"
        c.message({"type": "response.create", "event_id": "r1"})
        created = c.of_type("session.delegation.created")[-1]
        assert created["client_event_id"] == "r1" and created["delegation"]["target"] == "responses"
        await c.until(lambda: len(c.answers) == 1)
        await c.registry.aclose()
        return c

    c = asyncio.run(main())
    body = llm_server.chat_requests()[0].body["messages"]
    assert "Mention trains." in body[0]["content"]
    assert body[-1]["content"] == "I live in Paris. Typed: how do I get to Lyon?"
    assert c.answers[0].text == "You asked about trains."


def test_client_delegation_still_refuses_responses_commands(encode: Callable[[str], list[int]]) -> None:
    wire = LiveSession(LiveServerInfo(session_id="abcd1234"), encode)
    wire.message(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}), 1.0)
    for etype in ("response.create", "response.item.create"):
        body: dict[str, Any] = {"type": etype, "event_id": "e"}
        if etype == "response.item.create":
            body["item"] = {"type": "function_call_output", "call_id": "c", "output": "x"}
        out = wire.message(json.dumps(body), 2.0)
        assert out.errors[0].code == "unsupported_event" and "Responses delegation" in out.errors[0].message


def test_hosted_tools_are_refused_at_start(llm_server: LlmServer, encode: Callable[[str], list[int]]) -> None:
    c = Client(llm_server, encode)
    out = start(c, tools=[WEATHER, {"type": "web_search"}, {"type": "file_search"}])
    assert not out.started and out.errors[0].code == "unsupported_tool"
    error = c.of_type("error")[0]["error"]
    assert "web_search" in error["message"] and "file_search" in error["message"]
    assert error["param"] == "session.delegation.responses.tools[1]" and error["client_event_id"] == "s1"
    asyncio.run(c.registry.aclose())


def test_update_changes_the_backend_prompt_and_keeps_the_type(
    llm_server: LlmServer,
    encode: Callable[[str], list[int]],
) -> None:
    c = Client(llm_server, encode)
    start(c)
    out = c.message(
        {
            "type": "session.update",
            "session": {"delegation": {"type": "responses", "responses": {"instructions": "Be brief."}}},
        }
    )
    assert not out.errors
    responses = c.of_type("session.updated")[0]["session"]["delegation"]["responses"]
    assert responses["instructions"] == "Be brief." and responses["tools"][0]["name"] == "get_weather"
    out = c.message({"type": "session.update", "session": {"delegation": {"type": "client"}}})
    assert out.errors[0].code == "unsupported_delegation"
    assert isinstance(DelegationCreated("d", 0, target="responses", response_id="r").body()["delegation"], dict)
    asyncio.run(c.registry.aclose())


def test_speculative_requests_stay_inside_kame(llm_server: LlmServer, encode: Callable[[str], list[int]]) -> None:
    from kame.oracle.prompt import PENDING_MARK

    llm_server.push(
        Reply(text="The weather in Paris is mild today."),
        Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]),
        Reply(text="It is sunny in Paris."),
    )

    async def main() -> Client:
        c = Client(llm_server, encode, function_timeout_s=5.0)
        start(c)
        c.sends(c.wire.speech_started(1, 0.0))
        c.sends(c.wire.partial(1, 0.8, "what is the weather", 1.0))
        await c.until(lambda: bool(c.of_type("kame.oracle.reset")))
        assert not c.of_type("session.delegation.created")  # a guess is no delegation
        c.sends(c.wire.final(1, 1.5, "What is the weather in Paris?", 2.0))
        await c.until(lambda: c.wire.responses is not None and c.wire.responses.delegator._waiting is not None)
        call = next(e["item"] for e in c.nested("response.output_item.done") if e["item"]["type"] == "function_call")
        c.message(
            {
                "type": "response.item.create",
                "item": {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
            }
        )
        c.message({"type": "response.create"})
        await c.until(lambda: len(c.answers) == 3)
        await c.registry.aclose()
        return c

    c = asyncio.run(main())
    guess, first, second = llm_server.chat_requests()
    assert "tools" not in guess.body  # never the client's functions
    assert guess.body["messages"][-1]["content"].endswith(f"{PENDING_MARK} what is the weather")
    assert first.tool_names == ["get_weather"]
    reset = c.of_type("kame.oracle.reset")[0]
    assert reset["source"] == "speculation" and reset["delegation_id"] is None
    kinds = [e["type"] for e in c.sent if e["type"].startswith("kame.backend.")]
    assert kinds[:3] == ["kame.backend.request_started", "kame.backend.first_token", "kame.backend.done"]
    assert [a.text for a in c.answers] == [
        "The weather in Paris is mild today.",
        "Let me check.",
        "It is sunny in Paris.",
    ]
    # the delegation's response stream belongs to the delegation only
    assert all(
        e["delegation_id"] == c.of_type("session.delegation.created")[0]["delegation"]["id"]
        for e in c.of_type("response.event")
    )


def test_the_final_transcript_cancels_the_guess(llm_server: LlmServer, encode: Callable[[str], list[int]]) -> None:
    llm_server.push(Reply(text="A slow guess.", first_token_delay_s=30.0), Reply(text="Here is the answer."))

    async def main() -> Client:
        c = Client(llm_server, encode)
        start(c)
        c.sends(c.wire.speech_started(1, 0.0))
        c.sends(c.wire.partial(1, 0.8, "tell me a joke", 1.0))
        await c.until(lambda: len(llm_server.chat_requests()) == 1)
        c.sends(c.wire.final(1, 1.5, "Tell me a joke please.", 2.0))
        await c.until(lambda: len(c.answers) == 1)
        await c.registry.aclose()
        return c

    c = asyncio.run(main())
    guess = llm_server.chat_requests()[0]
    assert guess.wait_ended(5) and guess.disconnected  # the HTTP stream was closed at once
    cancelled = c.of_type("kame.backend.cancelled")
    assert len(cancelled) == 1 and "turn ended" in cancelled[0]["reason"]
    assert [a.text for a in c.answers] == ["Here is the answer."]
    assert not [e for e in c.sent if e["type"] == "kame.oracle.reset"]


def test_a_round_reaches_the_oracle_word_by_word_as_it_streams(
    llm_server: LlmServer,
    encode: Callable[[str], list[int]],
) -> None:
    answer = "It is sunny and warm in Paris today, with a light breeze from the sea."
    llm_server.push(Reply(text=answer, chunk_delay_s=0.05))
    fed: list[tuple[str, tuple[int, ...], bool]] = []  # (kind, ids, the round's response already completed)

    async def main() -> Client:
        c = Client(llm_server, encode, speculate=False)
        done = lambda: bool(c.nested("response.completed"))  # noqa: E731
        c.hooks = replace(  # the runtime's push, as the Live wire's runtime gives it
            c.hooks,
            oracle_reset=lambda a: fed.append(("reset", a.ids, done())),
            oracle_push=lambda ids: fed.append(("push", tuple(ids), done())),
        )
        start(c, tools=[])
        c.sends(c.wire.speech_started(1, 0.0))
        c.sends(c.wire.final(1, 1.0, "How is the weather?", 1.0))
        await c.until(lambda: bool(c.of_type("kame.responses.answer")))
        await c.registry.aclose()
        return c

    c = asyncio.run(main())
    assert fed[0][0] == "reset" and all(kind == "push" for kind, _, _ in fed[1:]) and len(fed) > 3
    assert not fed[0][2] and not fed[1][2]  # Moshi had the first words while the answer still streamed
    ids = [i for _, chunk, _ in fed for i in chunk]
    reached = c.of_type("kame.responses.answer")[0]
    assert ids == encode(reached["text"]) and reached["tokens"] == len(ids)  # one encode of the whole answer
