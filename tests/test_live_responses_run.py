"""The Responses-delegation driver: rounds, the client's function calls, timeouts and failures.

The back-end here is a scripted round source (the driver's input protocol: text chunks, tool-call
pieces, a RoundEnd); the real LLM server and the SDK's Live client are exercised by the wire tests.
Every event the driver sends is parsed with the openai SDK's own Live and Responses models.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from openai.types.live import ServerEvent
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from kame.backend.errors import BackendTimeout
from kame.session.responses.config import parse_responses_config
from kame.session.responses.conversation import ConversationLog, UserSpeech
from kame.session.responses.rounds import (
    DelegationDone,
    ResponsesDelegator,
    RoundEnd,
    RoundRequest,
    RoundText,
    TextOut,
)
from kame.session.responses.settings import BackendCatalog, ResponsesError
from kame.session.responses.stream import Usage

LIVE_EVENT: TypeAdapter[Any] = TypeAdapter(ServerEvent)
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
CATALOG = BackendCatalog(backends=("fast",), default="fast", tools_allowed=frozenset({"fast"}))
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@dataclass(frozen=True)
class Piece:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


Script = Callable[[RoundRequest], list[Any]]


def aio(fn: Callable[[], Any]) -> Callable[[], None]:
    """Run an async test on a fresh event loop (the project's tests use asyncio.run, no plugin)."""

    @functools.wraps(fn)
    def run() -> None:
        asyncio.run(asyncio.wait_for(fn(), 30))

    return run


class Harness:
    def __init__(self, script: Script, cfg: dict[str, Any] | None = None, **kw: Any) -> None:
        self.settings = parse_responses_config(cfg or {"model": "fast", "tools": [WEATHER]}, CATALOG)
        self.requests: list[RoundRequest] = []
        self.sent: list[dict[str, Any]] = []
        self.texts: list[TextOut] = []
        self.rounds: list[RoundText] = []
        self.done: list[DelegationDone] = []
        self.script = script
        n = itertools.count(1)
        self.conversation = ConversationLog()
        self.d = ResponsesDelegator(
            settings=lambda: self.settings,
            source=self.source,
            send=self.send,
            on_text=self.texts.append,
            on_round_text=self.rounds.append,
            on_done=self.done.append,
            conversation=self.conversation,
            ids=lambda prefix: f"{prefix}_{next(n)}",
            **kw,
        )

    async def source(self, request: RoundRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        for item in self.script(request):
            if isinstance(item, Exception):
                raise item
            await asyncio.sleep(0)
            yield item

    def send(self, event: dict[str, Any]) -> None:
        LIVE_EVENT.validate_python(dict(event, event_id=f"event_{len(self.sent)}"))
        if event["type"] == "response.event":
            STREAM_EVENT.validate_python(event["event"])
        self.sent.append(event)

    def nested(self, type_: str | None = None) -> list[dict[str, Any]]:
        out = [e["event"] for e in self.sent if e["type"] == "response.event"]
        return [e for e in out if type_ is None or e["type"] == type_]

    async def until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not predicate():
            assert loop.time() < end, "timed out"
            await asyncio.sleep(0.005)

    def waiting(self) -> bool:
        return self.d._waiting is not None


def weather_script(request: RoundRequest) -> list[Any]:
    """Round 1: say something, call get_weather (name and arguments in pieces); round 2: answer from the output."""
    tool_msgs = [m for m in request.messages if m["role"] == "tool"]
    if not tool_msgs:
        return [
            "Let me ",
            "check.",
            Piece(0, "call_llm", "get_", ""),
            Piece(0, None, "weather", ""),
            Piece(0, None, None, '{"city": '),
            Piece(0, None, None, '"Paris"}'),
            RoundEnd("tool_calls", Usage(100, 12)),
        ]
    sky = json.loads(tool_msgs[-1]["content"])["sky"] if tool_msgs[-1]["content"].startswith("{") else "unknown"
    return [f"It is {sky} in Paris.", RoundEnd("stop", Usage(130, 7))]


@aio
async def test_full_exchange_rounds_outputs_and_oracle_text() -> None:
    h = Harness(weather_script)
    h.conversation.add(UserSpeech("What is the weather in Paris?"))
    dlg, resp = h.d.new_ids()
    task = h.d.start(dlg, resp)
    await h.until(h.waiting)
    calls = [e["item"] for e in h.nested("response.output_item.done") if e["item"]["type"] == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert (call["name"], json.loads(call["arguments"]), call["status"]) == (
        "get_weather",
        {"city": "Paris"},
        "completed",
    )
    first = h.nested("response.completed")[0]["response"]
    assert first["id"] == resp and first["usage"]["total_tokens"] == 112
    assert all(e["delegation_id"] == dlg for e in h.sent if e["type"] == "response.event")
    with pytest.raises(ResponsesError) as info:
        h.d.response_create()
    assert info.value.code == "function_call_outputs_required" and call["call_id"] in info.value.message
    h.d.item_create({"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "sunny"}'})
    assert h.d.response_create() == "resumed"
    done = await asyncio.wait_for(task, 5)
    assert (done.status, done.text, done.rounds) == ("completed", "It is sunny in Paris.", 2)
    assert done.usage == Usage(230, 19)
    completed = h.nested("response.completed")
    assert len(completed) == 2 and completed[1]["response"]["previous_response_id"] == resp
    # The second round's request carried the call and the client's output.
    second = h.requests[1].messages
    assistant = next(m for m in second if m.get("tool_calls"))
    assert assistant["content"] == "Let me check." and assistant["tool_calls"][0]["id"] == call["call_id"]
    assert {"role": "tool", "tool_call_id": call["call_id"], "content": '{"sky": "sunny"}'} in second
    assert [f.name for f in h.requests[0].functions] == ["get_weather"] and h.requests[0].tool_choice == "auto"
    # Text reached the oracle as it streamed; the answer is marked as built on tools.
    assert [(t.delta, t.after_tools, t.round) for t in h.texts] == [
        ("Let me ", False, 0),
        ("check.", False, 0),
        ("It is sunny in Paris.", True, 1),
    ]
    assert [(r.text, r.after_tools) for r in h.rounds] == [("Let me check.", False), ("It is sunny in Paris.", True)]
    assert h.done == [done]


@aio
async def test_second_delegation_waits_and_sees_the_first() -> None:
    h = Harness(lambda r: [f"answer {len(h.requests)}", RoundEnd("stop")], {"model": "fast"})
    h.conversation.add(UserSpeech("first question"))
    t1 = h.d.start(*h.d.new_ids())
    h.conversation.add(UserSpeech("second question"))
    t2 = h.d.start(*h.d.new_ids())
    assert h.d.busy
    d1, d2 = await asyncio.wait_for(asyncio.gather(t1, t2), 5)
    assert (d1.text, d2.text) == ("answer 1", "answer 2")
    roles = [(m["role"], m["content"]) for m in h.requests[1].messages[1:]]
    assert roles == [
        ("user", "first question second question"),
        ("assistant", "answer 1"),
        ("user", "[the user is silent]"),
    ]
    assert h.requests[0].functions == ()  # no tools configured: none offered
    await h.until(lambda: not h.d.busy)


@aio
async def test_a_client_that_never_answers_times_out_and_the_backend_answers_anyway() -> None:
    h = Harness(weather_script, function_timeout_s=0.2)
    h.conversation.add(UserSpeech("weather?"))
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert done.status == "completed" and done.text == "It is unknown in Paris."
    infos = [e for e in h.sent if e["type"] == "info"]
    assert len(infos) == 1 and infos[0]["code"] == "kame.function_timeout"
    tool = next(m for m in h.requests[1].messages if m["role"] == "tool")
    assert "did not answer within 0.2 s" in tool["content"]
    call_id = tool["tool_call_id"]
    with pytest.raises(ResponsesError) as info:
        h.d.item_create({"type": "function_call_output", "call_id": call_id, "output": "late"})
    assert info.value.code == "call_expired"


@aio
async def test_outputs_without_response_create_go_on_after_the_timeout() -> None:
    h = Harness(weather_script, function_timeout_s=0.3)
    task = h.d.start(*h.d.new_ids())
    await h.until(h.waiting)
    call_id = h.nested("response.output_item.done")[-1]["item"]["call_id"]
    h.d.item_create(
        {
            "type": "function_call_output",
            "call_id": call_id,
            "output": [{"type": "input_text", "text": '{"sky": "grey"}'}],
        }
    )
    done = await asyncio.wait_for(task, 5)
    assert done.text == "It is grey in Paris."
    assert [e["code"] for e in h.sent if e["type"] == "info"] == ["kame.response_create_timeout"]


@aio
async def test_bad_outputs_are_refused_and_lose_nothing() -> None:
    h = Harness(weather_script, max_output_chars=50)
    task = h.d.start(*h.d.new_ids())
    await h.until(h.waiting)
    call_id = h.nested("response.output_item.done")[-1]["item"]["call_id"]
    cases = [
        ({"type": "function_call_output", "call_id": "call_nope", "output": "x"}, "unknown_call_id"),
        ({"type": "function_call_output", "output": "x"}, "missing_required_parameter"),
        ({"type": "function_call_output", "call_id": call_id, "output": "x" * 51}, "output_too_large"),
        ({"type": "function_call_output", "call_id": call_id, "output": [{"type": "input_image"}]}, "invalid_value"),
        ({"type": "function_call_output", "call_id": call_id, "output": 5}, "invalid_type"),
        ({"type": "reasoning", "summary": []}, "invalid_value"),
        ({"type": "message", "role": "tool", "content": "x"}, "invalid_value"),
        ("not an item", "invalid_type"),
    ]
    for item, code in cases:
        with pytest.raises(ResponsesError) as info:
            h.d.item_create(item)
        assert info.value.code == code, item
    h.d.item_create({"type": "function_call_output", "call_id": call_id, "output": '{"sky": "clear"}'})
    with pytest.raises(ResponsesError) as info:
        h.d.item_create({"type": "function_call_output", "call_id": call_id, "output": "again"})
    assert info.value.code == "duplicate_call_output"
    h.d.response_create()
    assert (await asyncio.wait_for(task, 5)).text == "It is clear in Paris."


@aio
async def test_backend_error_fails_the_response_and_the_next_delegation_works() -> None:
    fail = [True]

    def script(request: RoundRequest) -> list[Any]:
        if fail[0]:
            fail[0] = False
            return ["Let", BackendTimeout("fast", "first_token", 5.0)]
        return ["Back again.", RoundEnd("stop")]

    h = Harness(script, {"model": "fast"})
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert done.status == "failed"
    failed = h.nested("response.failed")[0]["response"]
    assert failed["error"]["code"] == "server_error" and "timed out" in failed["error"]["message"]
    assert failed["error"]["type"] == "timeout"
    assert h.nested("response.output_item.done")[0]["item"]["status"] == "incomplete"
    assert h.rounds == []  # a failed round's partial text is no answer
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert (done.status, done.text) == ("completed", "Back again.")
    assert [r.text for r in h.rounds] == ["Back again."]


@aio
async def test_a_bug_in_the_source_fails_only_the_response() -> None:
    h = Harness(lambda r: [RuntimeError("secret detail")], {"model": "fast"})
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    failed = h.nested("response.failed")[0]["response"]
    assert done.status == "failed" and "secret" not in failed["error"]["message"]


@aio
async def test_round_cap_makes_the_last_request_answer_without_tools() -> None:
    def script(request: RoundRequest) -> list[Any]:
        if not request.functions:
            return ["Final answer.", RoundEnd("stop")]
        n = len(h.requests)
        return [Piece(0, f"c{n}", "get_weather", "{}"), RoundEnd("tool_calls")]

    h = Harness(script, max_rounds=3)
    task = h.d.start(*h.d.new_ids())
    for k in (1, 2):
        await h.until(lambda: h.waiting() and len(h.requests) == k)  # noqa: B023 - used at once
        call_id = h.nested("response.output_item.done")[-1]["item"]["call_id"]
        h.d.item_create({"type": "function_call_output", "call_id": call_id, "output": "{}"})
        h.d.response_create()
    done = await asyncio.wait_for(task, 5)
    assert done.rounds == 3 and done.text == "Final answer."
    assert [len(r.functions) for r in h.requests] == [1, 1, 0]
    assert [r.tool_choice for r in h.requests] == ["auto", "auto", None]


@aio
async def test_forced_function_only_on_the_first_round() -> None:
    cfg = {"model": "fast", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}}
    h = Harness(weather_script, cfg)
    task = h.d.start(*h.d.new_ids())
    await h.until(h.waiting)
    call_id = h.nested("response.output_item.done")[-1]["item"]["call_id"]
    h.d.item_create({"type": "function_call_output", "call_id": call_id, "output": '{"sky": "wet"}'})
    h.d.response_create()
    await asyncio.wait_for(task, 5)
    assert [r.tool_choice for r in h.requests] == ["get_weather", "auto"]


@aio
async def test_length_cut_ends_incomplete() -> None:
    h = Harness(lambda r: ["It is", Piece(0, "c", "get_weather", '{"ci'), RoundEnd("length", Usage(9, 100))])
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert done.status == "incomplete"
    end = h.nested("response.incomplete")[0]["response"]
    assert end["incomplete_details"] == {"reason": "max_output_tokens"}
    assert not h.conversation.pending_calls()  # the cut call is no call: nothing waits


@aio
async def test_unknown_function_is_refused_inside_kame_and_the_backend_retries() -> None:
    def script(request: RoundRequest) -> list[Any]:
        if any(m["role"] == "tool" for m in request.messages):
            return ["I cannot do that.", RoundEnd("stop")]
        return [Piece(0, "c1", "delete_everything", "{}"), RoundEnd("tool_calls")]

    h = Harness(script)
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert done.text == "I cannot do that." and done.rounds == 2
    assert not [e for e in h.nested("response.output_item.added") if e["item"]["type"] == "function_call"]
    tool = next(m for m in h.requests[1].messages if m["role"] == "tool")
    assert "delete_everything" in tool["content"] and "Refused" in tool["content"]


@aio
async def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    cfg = {"model": "fast", "tools": [WEATHER], "parallel_tool_calls": False}
    h = Harness(
        lambda r: [Piece(0, "a", "get_weather", "{}"), Piece(1, "b", "get_weather", "{}"), RoundEnd("tool_calls")],
        cfg,
        function_timeout_s=0.05,
    )
    task = h.d.start(*h.d.new_ids())
    await h.until(h.waiting)
    assert len([e for e in h.nested("response.output_item.done") if e["item"]["type"] == "function_call"]) == 1
    task.cancel()
    await h.d.aclose()
    assert h.done[-1].status == "cancelled"


@aio
async def test_response_create_when_idle_or_streaming_and_message_items() -> None:
    gate = asyncio.Event()

    async def slow(request: RoundRequest) -> AsyncIterator[Any]:
        yield "Thinking"
        await gate.wait()
        yield RoundEnd("stop")

    h = Harness(lambda r: [])
    h.d._source = slow
    assert h.d.response_create() == "new"
    h.d.item_create({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Typed question"}]})
    h.d.item_create({"role": "developer", "content": "Be formal."})
    task = h.d.start(*h.d.new_ids())
    await h.until(lambda: h.d._running is not None)
    with pytest.raises(ResponsesError) as info:
        h.d.response_create()
    assert info.value.code == "response_in_progress"
    gate.set()
    await asyncio.wait_for(task, 5)
    assert len(h.conversation.entries) == 3  # the two items and the back-end's answer


@aio
async def test_a_failing_hook_does_not_end_the_delegation() -> None:
    h = Harness(lambda r: ["Fine.", RoundEnd("stop")], {"model": "fast"})

    def broken(_: Any) -> None:
        raise RuntimeError("consumer bug")

    h.d._on_round_text = broken
    h.d._on_text = broken
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert (done.status, done.text) == ("completed", "Fine.")
    assert h.nested("response.completed")


class SlowTools:
    """Server-side tools for the driver (the ServerTools protocol): one slow lookup and one broken tool."""

    def __init__(self, delay_s: float) -> None:
        from kame.session.function_tools import FunctionTool
        from kame.session.responses.rounds import ServerTool

        self.delay_s = delay_s
        self.tools = [
            ServerTool("lookup", "kb", "lookup", FunctionTool("lookup", "Look it up.", {"type": "object"})),
            ServerTool("broken", "kb", "broken", FunctionTool("broken", None, {"type": "object"})),
        ]

    async def offered(self, settings: Any) -> list[Any]:
        return self.tools

    async def call(self, tool: Any, call_id: str, arguments: str) -> tuple[bool, str]:
        if tool.name == "broken":
            raise RuntimeError("boom")
        await asyncio.sleep(self.delay_s)
        return True, "found it"


@aio
async def test_an_output_during_kame_run_tool_calls_is_kept_and_calls_are_counted() -> None:
    mcp_catalog = BackendCatalog(
        backends=("fast",), default="fast", tools_allowed=frozenset({"fast"}), mcp_servers={"kb": ("lookup", "broken")}
    )
    events: list[tuple[str, str, str | None]] = []

    def script(request: RoundRequest) -> list[Any]:
        if any(m["role"] == "tool" for m in request.messages):
            return ["Done.", RoundEnd("stop")]
        return [
            Piece(0, "a", "get_weather", '{"city": "Rome"}'),
            Piece(1, "b", "lookup", "{}"),
            Piece(2, "c", "broken", "{}"),
            RoundEnd("tool_calls"),
        ]

    h = Harness(script, function_timeout_s=5.0)
    h.settings = parse_responses_config(
        {"model": "fast", "tools": [WEATHER, {"type": "mcp", "server_label": "kb"}]}, mcp_catalog
    )
    h.d._server_tools = SlowTools(0.3)
    h.d._on_tool_call = lambda ev, label: events.append((ev.kind, label, ev.outcome))
    task = h.d.start(*h.d.new_ids())
    await h.until(lambda: any(e["item"]["type"] == "function_call" for e in h.nested("response.output_item.done")))
    call_id = next(
        e["item"]["call_id"] for e in h.nested("response.output_item.done") if e["item"]["type"] == "function_call"
    )
    assert not h.nested("response.completed")  # kame's own calls still run
    h.d.item_create({"type": "function_call_output", "call_id": call_id, "output": "warm"})  # early: no error
    await h.until(h.waiting)
    assert h.d.response_create() == "resumed"  # every output is in
    done = await asyncio.wait_for(task, 5)
    assert done.text == "Done."
    tools = {m["tool_call_id"]: m["content"] for m in h.requests[1].messages if m["role"] == "tool"}
    assert tools[call_id] == "warm" and "found it" in tools.values()
    assert any(v.startswith("Error:") for v in tools.values())
    mcp_items = [e["item"] for e in h.nested("response.output_item.done") if e["item"]["type"] == "mcp_call"]
    assert [(i["name"], i["status"]) for i in mcp_items] == [("lookup", "completed"), ("broken", "failed")]
    finished = sorted((label, outcome) for kind, label, outcome in events if kind == "finished")
    assert finished == [("broken", "error"), ("client_function", "ok"), ("lookup", "ok")]


@aio
async def test_a_timed_out_client_call_is_counted_as_a_timeout() -> None:
    events: list[tuple[str, str, str | None]] = []
    h = Harness(weather_script, function_timeout_s=0.1)
    h.d._on_tool_call = lambda ev, label: events.append((ev.kind, label, ev.outcome))
    await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert events == [("started", "client_function", None), ("finished", "client_function", "timeout")]


@aio
async def test_a_call_on_the_last_round_ends_the_delegation() -> None:
    # Some servers call a tool even when none is offered: the last round still ends the delegation.
    h = Harness(lambda r: ["Hm.", Piece(0, "x", "get_weather", "{}"), RoundEnd("tool_calls")], max_rounds=1)
    done = await asyncio.wait_for(h.d.start(*h.d.new_ids()), 5)
    assert (done.status, done.rounds, done.text) == ("completed", 1, "Hm.")
    assert h.requests[0].functions == () and not h.d.busy
