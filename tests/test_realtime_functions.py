"""Client-executed functions in the Realtime API's shapes (pure parts), checked against the openai SDK's models."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import TypeAdapter

from kame.backend.tools import ToolCall, ToolSpec
from kame.server.wires.realtime.functions import (
    FunctionOutput,
    FunctionProtocolError,
    decode_function_output,
    function_call_response,
    output_accepted,
    parse_tool_choice,
    parse_tools,
    session_tool_choice,
    session_tools,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "kame": {"read_only": True},
}


def sdk_event(event: dict[str, Any]) -> Any:
    from openai.types.realtime.realtime_server_event import RealtimeServerEvent

    return TypeAdapter(RealtimeServerEvent).validate_python(dict(event, event_id="event_x"))


def test_tools_parse_with_the_kame_read_only_extension() -> None:
    specs = parse_tools([WEATHER, {"type": "function", "name": "book_table"}])
    assert [s.name for s in specs] == ["get_weather", "book_table"]
    assert specs[0].read_only and not specs[1].read_only
    assert specs[0].parameters["required"] == ["city"]
    assert parse_tools(None) == [] and parse_tools([]) == []
    echoed = session_tools(specs)
    assert echoed[0] == WEATHER
    # The session object's tools are what the SDK's session model accepts.
    from openai.types.realtime.realtime_function_tool import RealtimeFunctionTool

    assert RealtimeFunctionTool.model_validate(echoed[1]).name == "book_table"


@pytest.mark.parametrize(
    ("tools", "code", "param"),
    [
        ("nope", "invalid_value", "session.tools"),
        ([{"type": "mcp", "server_url": "http://evil/mcp"}], "unsupported_tool_type", "session.tools[0].type"),
        ([{"type": "web_search"}], "unsupported_tool_type", "session.tools[0].type"),
        ([{"type": "function"}], "missing_required_parameter", "session.tools[0].name"),
        ([{"type": "function", "name": "bad name"}], "invalid_value", "session.tools[0]"),
        ([{"type": "function", "name": "f", "parameters": {"type": "array"}}], "invalid_value", "session.tools[0]"),
        ([{"type": "function", "name": "f"}, {"type": "function", "name": "f"}], "invalid_value", "session.tools[1].name"),
        ([{"type": "function", "name": "f", "kame": {"read_only": "yes"}}], "invalid_value", "session.tools[0].kame.read_only"),
        ([{"type": "function", "name": "f", "kame": {"side_effects": 1}}], "unknown_parameter", "session.tools[0].kame"),
        ([{"type": "function", "name": f"f{i}"} for i in range(129)], "invalid_value", "session.tools"),
    ],
)
def test_bad_tools_are_refused_with_a_code_and_param(tools: Any, code: str, param: str) -> None:
    with pytest.raises(FunctionProtocolError) as err:
        parse_tools(tools)
    assert err.value.code == code and err.value.param == param


def test_tool_choice() -> None:
    specs = parse_tools([WEATHER])
    assert parse_tool_choice(None, specs) == "auto"
    assert parse_tool_choice("required", specs) == "required"
    assert parse_tool_choice({"type": "function", "name": "get_weather"}, specs) == "get_weather"
    assert session_tool_choice("get_weather") == {"type": "function", "name": "get_weather"}
    with pytest.raises(FunctionProtocolError):
        parse_tool_choice({"type": "function", "name": "other"}, specs)
    with pytest.raises(FunctionProtocolError):
        parse_tool_choice("sometimes", specs)


def test_a_call_is_its_own_response_in_sdk_shapes() -> None:
    events = function_call_response("resp_1", "item_1", "call_1", "get_weather", '{"city": "Paris"}', "item_0",
                                    deltas=['{"city"', ': "Paris"}'])
    assert [e["type"] for e in events] == [
        "response.created", "response.output_item.added", "conversation.item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done",
        "response.done",
    ]
    parsed = [sdk_event(e) for e in events]
    added = parsed[1].item
    assert (added.type, added.call_id, added.name) == ("function_call", "call_1", "get_weather")
    assert "".join(p.delta for p in parsed[3:5]) == '{"city": "Paris"}'
    assert parsed[5].arguments == '{"city": "Paris"}' and parsed[5].name == "get_weather"
    done = parsed[-1].response
    assert done.status == "completed" and done.output[0].call_id == "call_1"
    assert done.output[0].arguments == '{"city": "Paris"}'


def test_function_outputs_decode_and_refuse_what_they_must() -> None:
    out = decode_function_output({"type": "conversation.item.create", "event_id": "ev1",
                                  "item": {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}})
    assert out == FunctionOutput("call_1", "sunny", None, None, "ev1")
    # The SDK's own param type builds exactly this.
    from openai.types.realtime.conversation_item_create_event import ConversationItemCreateEvent

    ev = ConversationItemCreateEvent.model_validate({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "c", "output": "o"}})
    assert decode_function_output(ev.model_dump(exclude_none=True)).call_id == "c"
    for item, code in [
        ({"type": "message", "role": "user", "content": []}, "unsupported_item_type"),
        ({"type": "function_call_output", "output": "x"}, "missing_required_parameter"),
        ({"type": "function_call_output", "call_id": "c", "output": 3}, "invalid_value"),
        ({"type": "function_call_output", "call_id": "c", "output": "x" * 101}, "output_too_large"),
    ]:
        with pytest.raises(FunctionProtocolError) as err:
            decode_function_output({"type": "conversation.item.create", "item": item}, max_output_chars=100)
        assert err.value.code == code


def test_client_functions_send_the_call_and_wait_for_its_output() -> None:
    from kame.backend.client_functions import ClientCall, ClientFunctions, UnknownCallId

    async def main() -> None:
        asked: list[ClientCall] = []
        n = iter(range(1, 100))
        fns = ClientFunctions(asked.append, lambda: f"call_k{next(n)}")
        task = asyncio.create_task(fns.execute(ToolCall("llm-call-7", "get_weather", '{"city": "Paris"}'),
                                               ToolSpec("get_weather", read_only=True)))
        await asyncio.sleep(0.01)
        (call,) = asked
        assert (call.call_id, call.name, call.read_only) == ("call_k1", "get_weather", True)
        assert fns.pending_call_ids == ["call_k1"]
        # the wire shows it as its own response
        for e in function_call_response("resp_1", "item_1", call.call_id, call.name, call.arguments):
            sdk_event(e)
        with pytest.raises(UnknownCallId):
            fns.deliver("call_unknown", "x")
        fns.deliver("call_k1", "sunny")
        result = await task
        assert (result.call_id, result.outcome, result.output) == ("llm-call-7", "ok", "sunny")
        with pytest.raises(UnknownCallId):  # answered already
            fns.deliver("call_k1", "again")
        # A call given up by the loop (timeout) is forgotten: a late output is unknown.
        slow = asyncio.create_task(fns.execute(ToolCall("x", "get_weather", "{}"), ToolSpec("get_weather")))
        await asyncio.sleep(0.01)
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        with pytest.raises(UnknownCallId):
            fns.deliver("call_k2", "late")
        for e in output_accepted("item_9", "item_1", "call_k1", "sunny"):
            sdk_event(e)

    asyncio.run(main())


def test_tool_metrics_count_outcomes_with_bounded_labels() -> None:
    from kame.backend.speculation import ToolCallEvent
    from kame.server.telemetry.metrics import CLIENT_FUNCTION_LABEL, ServerMetrics

    m = ServerMetrics()
    m.on_tool_call(ToolCallEvent("started", "get_weather", "c1", True, "{}"), tool="get_weather")
    m.on_tool_call(ToolCallEvent("finished", "get_weather", "c1", True, "{}", "ok", 0.3), tool="get_weather")
    m.on_tool_call(ToolCallEvent("finished", "my_fn", "c2", False, "{}", "timeout", 5.0), tool=CLIENT_FUNCTION_LABEL)
    text = m.render().decode()
    assert 'kame_tool_calls_total{outcome="ok",tool="get_weather"} 1.0' in text
    assert 'kame_tool_calls_total{outcome="timeout",tool="client_function"} 1.0' in text
    assert 'kame_tool_call_seconds_count{tool="get_weather"} 1.0' in text
    assert "my_fn" not in text
