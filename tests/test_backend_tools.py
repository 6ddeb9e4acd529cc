"""Function tools through the real `openai` client against a real local server streaming `tool_calls`."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from kame.backend.config import BackendConfig, ScriptedConfig, ScriptedToolRule
from kame.backend.errors import BackendServerError, BackendToolsNotAllowed
from kame.backend.registry import BackendRegistry
from kame.backend.resolve import ResolvedBackends
from kame.backend.tool_loop import CallFinished, CallsRequested, LoopDone, TextDelta, ToolLoop, ToolLoopLimits
from kame.backend.tools import (
    ToolCall,
    ToolCallAssembler,
    ToolCallDelta,
    ToolDefinitionError,
    ToolResult,
    ToolSpec,
)
from tests.support.llm_server import LlmServer, Reply, ToolCallScript

WEATHER = ToolSpec(
    "get_weather",
    "Current weather of a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    read_only=True,
)
BOOK = ToolSpec("book_table", "Book a table.", {"type": "object", "properties": {"time": {"type": "string"}}})
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def registry_for(server: LlmServer, **fields: Any) -> BackendRegistry:
    data: dict[str, Any] = {"base_url": server.base_url, "model": "test-model", "api_key_env": "", "allow_tools": True}
    data.update(fields)
    cfg = BackendConfig.model_validate(data)
    return BackendRegistry(ResolvedBackends({"llm": cfg}, "llm"), environ={})


class Recorder:
    """A tool executor that records calls and answers from a table (or fails / hangs)."""

    def __init__(self, answers: dict[str, Any], delay_s: float = 0.0) -> None:
        self.answers = answers
        self.delay_s = delay_s
        self.calls: list[ToolCall] = []

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        self.calls.append(call)
        await asyncio.sleep(self.delay_s)
        answer = self.answers[call.name]
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.sleep(3600)
        return ToolResult(call.id, call.name, "ok", answer)


def weather_then_answer(rec: Any) -> Reply | None:
    """The LLM: calls get_weather when asked, answers from the tool message once it has one."""
    tools = rec.tool_messages
    if tools:
        return Reply(text=f"It is {tools[-1]['content']} in Paris.")
    return Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])


async def collect(events: Any) -> list[Any]:
    return [ev async for ev in events]


# ---------------------------------------------------------------------- pure parts


def test_assembler_joins_pieces_of_several_calls_by_index() -> None:
    asm = ToolCallAssembler()
    for delta in [
        ToolCallDelta(1, "c2", "book_", ""),
        ToolCallDelta(0, "c1", "get_weather", '{"ci'),
        ToolCallDelta(1, None, "table", '{"time":'),
        ToolCallDelta(0, None, None, 'ty": "Paris"}'),
        ToolCallDelta(1, None, None, ' "7pm"}'),
        ToolCallDelta(0, "c1", "get_weather", ""),  # some servers repeat id and name
    ]:
        asm.add(delta)
    calls = asm.calls()
    assert [c.id for c in calls] == ["c1", "c2"]
    assert [c.name for c in calls] == ["get_weather", "book_table"]
    assert calls[0].parsed_arguments() == {"city": "Paris"}
    assert calls[1].parsed_arguments() == {"time": "7pm"}
    assert calls[0].key == ("get_weather", '{"city":"Paris"}')


def test_assembler_without_indices() -> None:
    asm = ToolCallAssembler()
    for delta in [ToolCallDelta(None, "a", "f", '{"x":'), ToolCallDelta(None, None, None, " 1}"),
                  ToolCallDelta(None, "b", "g", "{}")]:
        asm.add(delta)
    assert [(c.id, c.name, c.arguments) for c in asm.calls()] == [("a", "f", '{"x": 1}'), ("b", "g", "{}")]


def test_assembler_names_calls_without_id() -> None:
    asm = ToolCallAssembler("call_r0")
    asm.add(ToolCallDelta(0, None, "x", ""))
    assert asm.calls()[0].id == "call_r0_0" and asm.calls()[0].arguments == "{}"


def test_assembler_single_keeps_only_the_first_call() -> None:
    asm = ToolCallAssembler(single=True)
    for delta in [ToolCallDelta(0, "a", "f", '{"x":'), ToolCallDelta(1, "b", "g", "{}"),
                  ToolCallDelta(0, None, None, " 1}"), ToolCallDelta(1, None, None, "more")]:
        asm.add(delta)
    assert [(c.id, c.name, c.arguments) for c in asm.calls()] == [("a", "f", '{"x": 1}')]


def test_tool_spec_validation() -> None:
    with pytest.raises(ToolDefinitionError):
        ToolSpec("has space")
    with pytest.raises(ToolDefinitionError):
        ToolSpec("ok", parameters={"type": "array"})
    assert WEATHER.as_openai()["function"]["parameters"]["required"] == ["city"]


# ---------------------------------------------------------------------- the openai back-end


def test_openai_backend_streams_tool_call_deltas_and_sends_tools(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text="Checking.", tool_calls=[
        ToolCallScript("get_weather", {"city": "Paris"}, argument_chunks=4),
        ToolCallScript("book_table", {"time": "7pm"}),
    ], interleave_calls=True))
    reg = registry_for(llm_server)

    async def main() -> list[Any]:
        try:
            return [x async for x in reg.stream_turn(None, USER, tools=[WEATHER, BOOK], tool_choice="auto")]
        finally:
            await reg.aclose()

    items = asyncio.run(main())
    text = "".join(i for i in items if isinstance(i, str))
    deltas = [i for i in items if isinstance(i, ToolCallDelta)]
    assert text == "Checking."
    assert {d.index for d in deltas} == {0, 1}
    asm = ToolCallAssembler()
    for d in deltas:
        asm.add(d)
    calls = asm.calls()
    assert [c.name for c in calls] == ["get_weather", "book_table"]
    assert calls[0].parsed_arguments() == {"city": "Paris"} and calls[1].parsed_arguments() == {"time": "7pm"}
    (req,) = llm_server.chat_requests()
    assert req.tool_names == ["get_weather", "book_table"]
    assert req.body["tool_choice"] == "auto"
    assert req.body["tools"][0]["function"]["parameters"]["required"] == ["city"]


def test_calls_streamed_whole_without_an_index_stay_apart(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text="", calls_whole_without_index=True, tool_calls=[
        ToolCallScript("get_weather", {"city": "Paris"}), ToolCallScript("get_weather", {"city": "Rome"})]),
        Reply(text="Both sunny."))
    reg = registry_for(llm_server)
    tools = Recorder({"get_weather": "sunny"})
    asyncio.run(collect(ToolLoop(reg).run(None, USER, [WEATHER], tools)))
    assert [c.parsed_arguments()["city"] for c in tools.calls] == ["Paris", "Rome"]
    assert len(llm_server.chat_requests()[1].tool_messages) == 2


def test_requests_with_tools_never_go_to_a_backend_that_may_not(llm_server: LlmServer) -> None:
    reg = registry_for(llm_server, allow_tools=False)
    assert not reg.tools_allowed(None)
    with pytest.raises(BackendToolsNotAllowed):
        reg.stream_turn(None, USER, tools=[WEATHER])
    assert llm_server.chat_requests() == []
    # Without tools the same back-end still answers.
    asyncio.run(_drain(reg.stream_turn(None, USER)))
    assert len(llm_server.chat_requests()) == 1 and "tools" not in llm_server.chat_requests()[0].body


def test_a_fallback_that_may_not_take_tools_is_skipped(llm_server: LlmServer) -> None:
    llm_server.push(Reply(status=500))
    primary = BackendConfig.model_validate(
        {"base_url": llm_server.base_url, "model": "primary", "api_key_env": "", "allow_tools": True, "fallback": "fb"}
    )
    fallback = BackendConfig.model_validate(
        {"base_url": llm_server.base_url, "model": "fb", "api_key_env": "", "allow_tools": False}
    )
    assert not fallback.tools_allowed()
    reg = BackendRegistry(ResolvedBackends({"p": primary, "fb": fallback}, "p"), environ={})
    with pytest.raises(BackendServerError):
        asyncio.run(_drain(reg.stream_turn(None, USER, tools=[WEATHER])))
    assert [r.model for r in llm_server.chat_requests()] == ["primary"]


def test_allow_tools_defaults_to_true_for_every_kind_and_preset() -> None:
    assert BackendConfig(preset="openai").tools_allowed()
    assert BackendConfig(preset="vllm").tools_allowed()
    assert BackendConfig(base_url="http://localhost:8000/v1").tools_allowed()
    assert not BackendConfig(preset="vllm", allow_tools=False).tools_allowed()
    assert BackendConfig(kind="scripted").tools_allowed()


async def _drain(stream: Any) -> list[Any]:
    async with stream:
        return [x async for x in stream]


# ---------------------------------------------------------------------- the loop


def test_loop_runs_the_call_and_continues_with_a_tool_message(llm_server: LlmServer) -> None:
    llm_server.responder = weather_then_answer
    reg = registry_for(llm_server)
    tools = Recorder({"get_weather": "sunny and 21 degrees"})

    async def main() -> list[Any]:
        try:
            return await collect(ToolLoop(reg).run(None, USER, [WEATHER], tools))
        finally:
            await reg.aclose()

    events = asyncio.run(main())
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "TextDelta" and "CallsRequested" in kinds and kinds[-1] == "LoopDone"
    pre = "".join(e.text for e in events if isinstance(e, TextDelta) and not e.after_tools)
    post = "".join(e.text for e in events if isinstance(e, TextDelta) and e.after_tools)
    assert pre == "Let me check." and post == "It is sunny and 21 degrees in Paris."
    done = events[-1]
    assert isinstance(done, LoopDone) and done.rounds == 1 and done.after_tools
    (call,) = tools.calls
    assert call.parsed_arguments() == {"city": "Paris"}
    first, second = llm_server.chat_requests()
    msgs = second.body["messages"]
    assert msgs[-2]["role"] == "assistant" and msgs[-2]["content"] == "Let me check."
    assert msgs[-2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert msgs[-1] == {"role": "tool", "tool_call_id": msgs[-2]["tool_calls"][0]["id"],
                        "content": "sunny and 21 degrees"}


def test_text_before_a_call_arrives_before_the_call_runs(llm_server: LlmServer) -> None:
    """The pre-call text is yielded as it streams, not held back until the round ends."""
    llm_server.push(Reply(text="Let me check that for you.", chunk_delay_s=0.02, tool_call_delay_s=0.5,
                          tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]),
                    Reply(text="Sunny."))
    reg = registry_for(llm_server)
    tools = Recorder({"get_weather": "sunny"})

    async def main() -> tuple[float, float]:
        t0 = time.monotonic()
        first_text = call_at = 0.0
        async for ev in ToolLoop(reg).run(None, USER, [WEATHER], tools):
            if isinstance(ev, TextDelta) and not first_text:
                first_text = time.monotonic() - t0
            if isinstance(ev, CallsRequested):
                call_at = time.monotonic() - t0
        await reg.aclose()
        return first_text, call_at

    first_text, call_at = asyncio.run(main())
    assert call_at - first_text >= 0.4, (first_text, call_at)


def test_failed_refused_timed_out_and_bad_calls_are_reported_and_the_llm_answers(llm_server: LlmServer) -> None:
    llm_server.push(
        Reply(text="", tool_calls=[
            ToolCallScript("broken", {}),
            ToolCallScript("slow", {}),
            ToolCallScript("not_offered", {}),
            ToolCallScript("get_weather", "{not json"),
        ]),
        Reply(text="Sorry, I could not look that up."),
    )
    reg = registry_for(llm_server)
    specs = [ToolSpec("broken", read_only=True), ToolSpec("slow", read_only=True), WEATHER]
    tools = Recorder({"broken": RuntimeError("disk on fire"), "slow": "hang", "get_weather": "x"})

    async def main() -> list[Any]:
        try:
            return await collect(ToolLoop(reg, ToolLoopLimits(call_timeout_s=0.3)).run(None, USER, specs, tools))
        finally:
            await reg.aclose()

    t0 = time.monotonic()
    events = asyncio.run(main())
    assert time.monotonic() - t0 < 3.0
    outcomes = {e.call.name: e.result for e in events if isinstance(e, CallFinished)}
    assert outcomes["broken"].outcome == "error" and "disk on fire" in outcomes["broken"].output
    assert outcomes["slow"].outcome == "timeout"
    assert outcomes["not_offered"].outcome == "refused"
    assert outcomes["get_weather"].outcome == "error" and "JSON" in outcomes["get_weather"].output
    assert [c.name for c in tools.calls] == ["broken", "slow"]  # never ran the unoffered one or the bad one
    second = llm_server.chat_requests()[1]
    contents = [json.loads(m["content"]) for m in second.tool_messages]
    assert [c["error"] for c in contents] == ["error", "timeout", "refused", "error"]
    assert isinstance(events[-1], LoopDone) and events[-1].text == "Sorry, I could not look that up."


def test_several_calls_of_one_round_run_concurrently(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text="", tool_calls=[ToolCallScript("get_weather", {"city": c}) for c in "ABC"]),
                    Reply(text="Done."))
    reg = registry_for(llm_server)
    tools = Recorder({"get_weather": "fine"}, delay_s=0.4)

    async def main() -> float:
        t0 = time.monotonic()
        await collect(ToolLoop(reg).run(None, USER, [WEATHER], tools))
        await reg.aclose()
        return time.monotonic() - t0

    elapsed = asyncio.run(main())
    assert len(tools.calls) == 3 and elapsed < 1.1, elapsed  # 3 x 0.4 s in sequence would be 1.2 s + requests


def test_rounds_are_bounded_and_the_last_request_may_not_call(llm_server: LlmServer) -> None:
    llm_server.set_default(Reply(text="", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]))
    reg = registry_for(llm_server)
    tools = Recorder({"get_weather": "sunny"})

    async def main() -> list[Any]:
        try:
            return await collect(ToolLoop(reg, ToolLoopLimits(max_rounds=2)).run(None, USER, [WEATHER], tools))
        finally:
            await reg.aclose()

    events = asyncio.run(main())
    reqs = llm_server.chat_requests()
    assert len(reqs) == 3 and len(tools.calls) == 2
    assert [r.body.get("tool_choice") for r in reqs] == [None, None, "none"]
    assert isinstance(events[-1], LoopDone) and events[-1].rounds == 2


def test_output_is_capped_before_the_llm(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text="", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]), Reply(text="Ok."))
    reg = registry_for(llm_server)
    tools = Recorder({"get_weather": "x" * 5000})
    asyncio.run(collect(ToolLoop(reg, ToolLoopLimits(max_output_chars=100)).run(None, USER, [WEATHER], tools)))
    content = llm_server.chat_requests()[1].tool_messages[0]["content"]
    assert content.startswith("x" * 100) and len(content) < 200 and "cut" in content


def test_closing_the_loop_closes_the_http_stream(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text="one two three four five six", chunk_delay_s=0.2))
    reg = registry_for(llm_server)

    async def main() -> None:
        events = ToolLoop(reg).run(None, USER, [WEATHER], Recorder({}))
        async for ev in events:
            assert isinstance(ev, TextDelta)
            break
        await events.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    (req,) = llm_server.chat_requests()
    assert req.wait_ended(3) and req.disconnected


# ---------------------------------------------------------------------- the scripted back-end


def test_scripted_backend_scripts_a_call_and_answers_with_the_result() -> None:
    cfg = BackendConfig(kind="scripted", scripted=ScriptedConfig(
        first_token_delay_s=0.0, chunks_per_s=200,
        tool_rules=[ScriptedToolRule(keyword="weather", tool="get_weather", arguments={"city": "Paris"},
                                     say_first="Let me check.", answer="It is {result} today.")]))
    reg = BackendRegistry(ResolvedBackends({"s": cfg}, "s"), environ={})
    tools = Recorder({"get_weather": "sunny"})

    async def main(specs: list[ToolSpec]) -> list[Any]:
        return await collect(ToolLoop(reg).run(None, USER, specs, tools))

    events = asyncio.run(main([WEATHER]))
    pre = "".join(e.text for e in events if isinstance(e, TextDelta) and not e.after_tools)
    post = "".join(e.text for e in events if isinstance(e, TextDelta) and e.after_tools)
    assert pre == "Let me check." and post == "It is sunny today."
    assert tools.calls[0].parsed_arguments() == {"city": "Paris"}
    # Not offered: the scripted LLM does not call it and answers from its rules.
    events = asyncio.run(main([BOOK]))
    assert len(tools.calls) == 1 and not any(isinstance(e, CallsRequested) for e in events)
