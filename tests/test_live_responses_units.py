"""Pure pieces of the Live API's Responses delegation: the nested event stream (checked with the
openai SDK's own Responses and Live models), ``delegation.responses`` validation, and the back-end prompt."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.completion_usage import CompletionTokensDetails, CompletionUsage, PromptTokensDetails
from openai.types.live import ResponsesDelegationConfig, ServerEvent
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from kame.oracle.prompt import PENDING_MARK, SILENCE_MARK
from kame.session.responses.config import model_notice, parse_responses_config, update_responses_config
from kame.session.responses.conversation import (
    NO_OUTPUT,
    BackendTurn,
    CallOutput,
    CallRecord,
    ClientMessage,
    ConversationLog,
    Note,
    UserSpeech,
    build_backend_messages,
)
from kame.session.responses.settings import BackendCatalog, BackendTarget, DelegationConfigError
from kame.session.responses.stream import (
    ResponseStream,
    Usage,
    failure_code,
    incomplete_reason,
    response_event,
)

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
LIVE_EVENT: TypeAdapter[Any] = TypeAdapter(ServerEvent)


def counter_ids() -> Any:
    n = itertools.count(1)
    return lambda prefix: f"{prefix}_{next(n)}"


def stream(**kw: Any) -> ResponseStream:
    return ResponseStream(model="qwen", ids=counter_ids(), clock=lambda: 1_700_000_000.0, **kw)


def unknown_keys(data: Any, model: Any, path: str = "") -> list[str]:
    """Keys of ``data`` that the SDK model does not define (the SDK allows extras; we want none)."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)) or not isinstance(data, dict):
        return []
    fields = {f.alias or name: (name, f) for name, f in model.model_fields.items()}
    out = []
    for key, value in data.items():
        if key not in fields:
            out.append(f"{path}{key}")
            continue
        parsed = getattr(model.model_validate(data), fields[key][0], None)
        if isinstance(parsed, BaseModel):
            out += unknown_keys(value, type(parsed), f"{path}{key}.")
        elif isinstance(parsed, list) and isinstance(value, list):
            for i, (v, p) in enumerate(zip(value, parsed, strict=False)):
                if isinstance(p, BaseModel):
                    out += unknown_keys(v, type(p), f"{path}{key}[{i}].")
    return out


def check(events: list[dict[str, Any]], delegation_id: str = "dlg_1") -> list[Any]:
    """Parse every nested event and its Live envelope with the SDK; no field the SDK does not know."""
    parsed = []
    for event in events:
        model = STREAM_EVENT.validate_python(event)
        assert unknown_keys(event, type(model)) == [], event["type"]
        envelope = LIVE_EVENT.validate_python(dict(response_event(event, delegation_id), event_id="event_1"))
        assert envelope.type == "response.event" and envelope.delegation_id == delegation_id
        assert envelope.event == event
        parsed.append(model)
    return parsed


# --------------------------------------------------------------------------- the event stream


def test_text_round_is_a_valid_responses_stream_with_usage() -> None:
    s = stream()
    events = s.start() + s.text_delta("It is ") + s.text_delta("") + s.text_delta("sunny.")
    events += s.complete(Usage(input_tokens=120, output_tokens=4, cached_tokens=100))
    parsed = check(events)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    created, done = parsed[0], parsed[-1]
    assert created.response.status == "in_progress" and created.response.id == s.response_id
    assert parsed[6].text == "It is sunny." and parsed[7].part.text == "It is sunny."
    item = parsed[8].item
    assert item.type == "message" and item.status == "completed" and item.content[0].text == "It is sunny."
    assert done.response.status == "completed" and done.response.output == []
    assert done.response.usage.input_tokens == 120 and done.response.usage.total_tokens == 124
    assert done.response.usage.input_tokens_details.cached_tokens == 100
    assert s.summary().text == "It is sunny." and s.summary().calls == []


def test_text_then_function_call_as_pipecat_reads_it() -> None:
    s = stream(tool_choice="auto")
    events = s.start() + s.text_delta("Let me check.")
    events += s.call_begin(0, "call_abc", "get_weather")
    events += s.call_arguments(0, '{"city": ') + s.call_arguments(0, '"Paris"}')
    events += s.call_end(0) + s.complete(None)
    parsed = check(events)
    kinds = [e["type"] for e in events]
    # The message closes before the call opens: items keep the back-end's order.
    assert kinds.index("response.output_item.done") < kinds.index("response.function_call_arguments.delta")
    done_items = [p.item for p in parsed if p.type == "response.output_item.done"]
    assert [i.type for i in done_items] == ["message", "function_call"]
    call = done_items[1]
    assert (call.status, call.call_id, call.name) == ("completed", "call_abc", "get_weather")
    assert json.loads(call.arguments) == {"city": "Paris"}
    args_done = next(p for p in parsed if p.type == "response.function_call_arguments.done")
    assert args_done.item_id == call.id and args_done.output_index == 1
    assert parsed[-1].response.usage is None  # the back-end reported none: nothing invented
    assert [(c.call_id, c.name) for c in s.summary().calls] == [("call_abc", "get_weather")]


def test_parallel_calls_interleaved_close_at_completion_in_output_order() -> None:
    s = stream()
    events = s.start()
    events += s.call_begin(0, "", "a") + s.call_begin(1, None, "b")
    events += s.call_arguments(1, '{"y":2}') + s.call_arguments(0, '{"x":1}')
    events += s.complete(Usage(10, 8))
    parsed = check(events)
    done = [p.item for p in parsed if p.type == "response.output_item.done"]
    assert [(i.name, i.arguments, i.status) for i in done] == [
        ("a", '{"x":1}', "completed"),
        ("b", '{"y":2}', "completed"),
    ]
    ids = [i.call_id for i in done]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)  # generated: the server sent none
    assert s.call_id_of(0) == ids[0] and s.call_id_of(1) == ids[1]


def test_repeated_call_id_is_replaced() -> None:
    s = stream()
    s.start()
    s.call_begin(0, "call_same", "a")
    s.call_end(0)
    s.call_begin(1, "call_same", "a")
    s.complete()
    assert [c.call_id for c in s.summary().calls][0] == "call_same"
    assert len({c.call_id for c in s.summary().calls}) == 2


def test_text_after_a_call_opens_a_new_message_item() -> None:
    s = stream()
    events = s.start() + s.text_delta("One.") + s.call_begin(0, "c1", "f") + s.text_delta(" Two.") + s.complete()
    parsed = check(events)
    added = [p.item.type for p in parsed if p.type == "response.output_item.added"]
    assert added == ["message", "function_call", "message"]
    assert s.text == "One. Two."


def test_incomplete_round_marks_open_items_incomplete_and_no_call_runs() -> None:
    s = stream()
    events = s.start() + s.text_delta("Hmm") + s.call_begin(0, "c1", "f") + s.call_arguments(0, '{"x": ')
    events += s.incomplete("max_output_tokens", Usage(5, 100))
    parsed = check(events)
    done = [p.item for p in parsed if p.type == "response.output_item.done"]
    # The message closed when the call began (completed); the cut call is incomplete.
    assert [(i.type, i.status) for i in done] == [("message", "completed"), ("function_call", "incomplete")]
    assert parsed[-1].type == "response.incomplete"
    assert parsed[-1].response.incomplete_details.reason == "max_output_tokens"
    assert s.summary().calls == [] and s.summary().status == "incomplete"


def test_failed_round_carries_a_responses_error() -> None:
    s = stream()
    events = s.start() + s.text_delta("Let me")
    events += s.fail(
        failure_code("timeout"), "back-end 'fast': timed out waiting for first token after 5 s", error_type="timeout"
    )
    parsed = check(events)
    assert parsed[-2].item.status == "incomplete"
    failed = parsed[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.code == "server_error" and "timed out" in failed.response.error.message
    assert failed.response.error.type == "timeout"


def test_a_call_closed_before_a_failure_stays_runnable() -> None:
    s = stream()
    s.start()
    s.call_begin(0, "c1", "f")
    s.call_arguments(0, "{}")
    s.call_end(0)
    s.fail("rate_limit_exceeded", "busy")
    assert [c.call_id for c in s.summary().calls] == ["c1"]


def test_stream_misuse_is_refused() -> None:
    s = stream()
    with pytest.raises(RuntimeError):
        s.text_delta("early")
    s.start()
    with pytest.raises(RuntimeError):
        s.start()
    with pytest.raises(ValueError):
        s.call_arguments(3, "{}")
    s.call_begin(0, "c", "f")
    with pytest.raises(ValueError):
        s.call_begin(0, "c2", "g")
    with pytest.raises(ValueError):
        s.call_begin(1, "c3", "")
    with pytest.raises(RuntimeError):
        s.summary()
    s.complete()
    with pytest.raises(RuntimeError):
        s.text_delta("late")
    with pytest.raises(RuntimeError):
        s.complete()


def test_snapshot_fields_follow_settings() -> None:
    s = stream(
        tool_choice={"type": "function", "name": "f"},
        parallel_tool_calls=False,
        max_output_tokens=200,
        previous_response_id="resp_prev",
        response_id="resp_given",
    )
    created = check(s.start())[0].response
    assert created.id == "resp_given" and created.previous_response_id == "resp_prev"
    assert created.tool_choice.name == "f" and created.parallel_tool_calls is False
    assert created.max_output_tokens == 200 and created.model == "qwen" and created.created_at == 1_700_000_000.0


def test_usage_from_chat_completions_and_error_mappings() -> None:
    usage = CompletionUsage(
        prompt_tokens=50,
        completion_tokens=7,
        total_tokens=57,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=32),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=3),
    )
    assert Usage.from_chat(usage) == Usage(50, 7, 32, 3)
    assert Usage.from_chat({"prompt_tokens": 4, "completion_tokens": 2}) == Usage(4, 2)
    assert Usage.from_chat(None) is None
    assert Usage(1, 2) + Usage(3, 4, 1, 1) == Usage(4, 6, 1, 1)
    with pytest.raises(ValueError):
        Usage(-1, 0)
    assert [failure_code(k) for k in ("rate_limited", "busy", "circuit_open", "timeout", "auth")] == [
        "rate_limit_exceeded",
        "rate_limit_exceeded",
        "rate_limit_exceeded",
        "server_error",
        "server_error",
    ]
    assert [incomplete_reason(r) for r in ("stop", "tool_calls", "length", "content_filter", None)] == [
        None,
        None,
        "max_output_tokens",
        "content_filter",
        None,
    ]


# --------------------------------------------------------------------------- delegation.responses

CATALOG = BackendCatalog(
    backends=("fast", "scripted"),
    default="fast",
    tools_allowed=frozenset({"fast"}),
    model_override=frozenset({"fast"}),
    mcp_servers={"weather": ("forecast", "alerts")},
)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def parse(cfg: dict[str, Any], catalog: BackendCatalog = CATALOG) -> Any:
    ResponsesDelegationConfig.model_validate(cfg)  # what a real client could send
    return parse_responses_config(cfg, catalog)


def refused(cfg: dict[str, Any], catalog: BackendCatalog = CATALOG) -> DelegationConfigError:
    with pytest.raises(DelegationConfigError) as info:
        parse_responses_config(cfg, catalog)
    return info.value


def test_model_picks_a_backend_by_name_else_a_model_on_the_default() -> None:
    assert parse({"model": "scripted"}).target == BackendTarget("scripted", None)
    assert parse({"model": "fast"}).target == BackendTarget("fast", None)
    assert parse({"model": "gpt-4.1-mini"}).target == BackendTarget("fast", "gpt-4.1-mini")
    err = refused({"model": "x"}, BackendCatalog(backends=("a",), default=None))
    assert err.param == "session.delegation.responses.model" and "no default back-end" in err.message
    # a default back-end without models (scripted, the CPU demo) runs the delegation as it is
    scripted = parse_responses_config({"model": "gpt-x"}, BackendCatalog(backends=("s",), default="s"))
    assert scripted.target == BackendTarget("s", None)
    assert "takes no model" in (model_notice("gpt-x", scripted.target) or "")
    assert model_notice("fast", BackendTarget("fast", None)) is None
    assert model_notice("gpt-4.1", BackendTarget("fast", "gpt-4.1")) is None
    assert refused({"instructions": "hi"}).code == "missing_required_parameter"
    assert refused({"model": "two words"}).code == "invalid_value"


def test_functions_and_instructions_reach_the_tool_loop_shapes() -> None:
    cfg = parse({"model": "fast", "instructions": "You are a travel agent.", "tools": [WEATHER, TIME]})
    assert cfg.instructions == "You are a travel agent."
    tools = cfg.chat_tools()
    assert [t["function"]["name"] for t in tools] == ["get_weather", "get_time"]
    for tool in tools:
        TypeAdapter(ChatCompletionFunctionToolParam).validate_python(tool)
    assert tools[0]["function"]["parameters"]["required"] == ["city"]
    assert cfg.tool_choice.chat_tool_choice() == "auto" and cfg.parallel_tool_calls is True
    # What session.started reports back is itself a valid ResponsesDelegationConfig.
    echoed = ResponsesDelegationConfig.model_validate(cfg.as_config())
    assert echoed.model == "fast" and len(echoed.tools or []) == 2


def test_hosted_tools_are_refused_with_one_error_naming_each() -> None:
    cfg = {
        "model": "fast",
        "tools": [
            WEATHER,
            {"type": "web_search"},
            {"type": "code_interpreter"},
            {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.example/mcp"},
        ],
    }
    ResponsesDelegationConfig.model_validate(cfg)
    err = refused(cfg)
    assert err.code == "unsupported_tool" and err.param == "session.delegation.responses.tools[1]"
    for name in ("web_search (session.delegation.responses.tools[1])", "code_interpreter", "server_url", "weather"):
        assert name in err.message
    assert "https://mcp.example" not in err.message  # the client's URL is not echoed


@pytest.mark.parametrize(
    "tool",
    [{"type": t} for t in ("file_search", "shell", "image_generation", "computer", "apply_patch", "tool_search")],
)
def test_each_hosted_tool_type_is_refused(tool: dict[str, Any]) -> None:
    err = refused({"model": "fast", "tools": [tool]})
    assert err.code == "unsupported_tool" and tool["type"] in err.message


def test_configured_mcp_servers_can_be_enabled_by_label() -> None:
    cfg = parse({"model": "fast", "tools": [{"type": "mcp", "server_label": "weather", "allowed_tools": ["forecast"]}]})
    assert cfg.mcp_servers[0].server_label == "weather" and cfg.mcp_servers[0].allowed_tools == ("forecast",)
    assert "weather" in refused({"model": "fast", "tools": [{"type": "mcp", "server_label": "nope"}]}).message
    err = refused({"model": "fast", "tools": [{"type": "mcp", "server_label": "weather", "allowed_tools": ["rm"]}]})
    assert "rm" in err.message and "forecast" in err.message
    err = refused(
        {"model": "fast", "tools": [{"type": "mcp", "server_label": "weather", "require_approval": "always"}]}
    )
    assert err.param.endswith("require_approval")


def test_tools_on_a_backend_that_may_not_be_sent_tools() -> None:
    err = refused({"model": "scripted", "tools": [WEATHER]})
    assert err.code == "tools_not_allowed" and "scripted" in err.message and "fast" in err.message
    assert parse({"model": "scripted"}).functions == ()


def test_tool_choice_variants() -> None:
    forced = parse({"model": "fast", "tools": [WEATHER, TIME], "tool_choice": {"type": "function", "name": "get_time"}})
    assert forced.tool_choice.chat_tool_choice() == {"type": "function", "function": {"name": "get_time"}}
    assert [f.name for f in forced.offered_functions()] == ["get_time"]
    allowed = parse(
        {
            "model": "fast",
            "tools": [WEATHER, TIME],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_weather"}],
            },
        }
    )
    assert [f.name for f in allowed.offered_functions()] == ["get_weather"]
    assert allowed.tool_choice.chat_tool_choice() == "required"
    none = parse({"model": "fast", "tools": [WEATHER], "tool_choice": "none"})
    assert none.offered_functions() == [] and none.chat_tools() == []
    mcp = parse(
        {
            "model": "fast",
            "tools": [{"type": "mcp", "server_label": "weather"}],
            "tool_choice": {"type": "mcp", "server_label": "weather", "name": "alerts"},
        }
    )
    assert mcp.tool_choice.forced == "mcp:weather:alerts"
    assert mcp.tool_choice.chat_tool_choice(lambda key: key.replace(":", "__")) == {
        "type": "function",
        "function": {"name": "mcp__weather__alerts"},
    }
    # Every choice reads back as a valid Responses tool_choice in the snapshots.
    for settings in (forced, allowed, none, mcp):
        s = stream(tool_choice=settings.tool_choice.response_tool_choice())
        check(s.start())
    assert refused({"model": "fast", "tool_choice": "required"}).code == "invalid_value"
    assert refused(
        {"model": "fast", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}}
    ).param.endswith("tool_choice.name")
    assert (
        refused({"model": "fast", "tools": [WEATHER], "tool_choice": {"type": "web_search"}}).code == "unsupported_tool"
    )
    assert refused({"model": "fast", "tool_choice": "sometimes"}).code == "invalid_value"


def test_ignored_and_unknown_fields() -> None:
    cfg = parse({"model": "fast", "reasoning": {"effort": "low"}, "service_tier": "flex", "text": {"verbosity": "low"}})
    assert dict(cfg.ignored) == {"reasoning": {"effort": "low"}, "service_tier": "flex", "text": {"verbosity": "low"}}
    err = refused({"model": "fast", "temperature": 0.3})
    assert err.code == "unknown_parameter" and err.param == "session.delegation.responses.temperature"
    err = refused({"model": "fast", "tools": [dict(WEATHER, kame={"read_only": True})]})
    assert err.code == "unknown_parameter"


@pytest.mark.parametrize(
    ("tool", "fragment"),
    [
        (dict(WEATHER, name="has space"), "name"),
        (dict(WEATHER, parameters={"type": "array"}), "object"),
        (dict(WEATHER, parameters="{}"), "JSON Schema"),
        (dict(WEATHER, strict="yes"), "strict"),
        ({"type": "teleport"}, "unknown tool type"),
    ],
)
def test_bad_function_tools(tool: dict[str, Any], fragment: str) -> None:
    assert fragment in refused({"model": "fast", "tools": [tool]}).message


def test_duplicate_function_names_and_limits() -> None:
    assert "duplicate" in refused({"model": "fast", "tools": [WEATHER, WEATHER]}).message
    assert refused({"model": "fast", "max_output_tokens": 0}).code == "invalid_value"
    assert refused({"model": "fast", "parallel_tool_calls": "no"}).code == "invalid_type"
    assert refused({"model": "fast", "instructions": "x" * 70_000}).code == "string_above_max_length"
    assert parse({"model": "fast", "instructions": "   "}).instructions is None


def test_session_update_keeps_omitted_fields_and_replaces_tools() -> None:
    cfg = parse({"model": "fast", "instructions": "Be brief.", "tools": [WEATHER, TIME], "max_output_tokens": 80})
    updated = update_responses_config(cfg, {"tools": [TIME]}, CATALOG)
    assert [f.name for f in updated.functions] == ["get_time"]
    assert updated.instructions == "Be brief." and updated.max_output_tokens == 80 and updated.target == cfg.target
    moved = update_responses_config(cfg, {"model": "gpt-4.1"}, CATALOG)
    assert moved.target == BackendTarget("fast", "gpt-4.1") and moved.functions == cfg.functions
    forced = update_responses_config(cfg, {"tool_choice": {"type": "function", "name": "get_weather"}}, CATALOG)
    with pytest.raises(DelegationConfigError) as info:
        update_responses_config(forced, {"tools": [TIME]}, CATALOG)
    assert "get_weather" in info.value.message
    with pytest.raises(DelegationConfigError):
        update_responses_config(cfg, {"model": "scripted"}, CATALOG)  # tools on a back-end that may not
    assert update_responses_config(cfg, {}, CATALOG) == cfg


# --------------------------------------------------------------------------- the back-end prompt

CHAT_MESSAGE: TypeAdapter[Any] = TypeAdapter(ChatCompletionMessageParam)


def sample_log() -> ConversationLog:
    log = ConversationLog()
    log.add_initial_input(
        [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "The user is called Ana."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi, I am planning a trip."}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Great, where to?"}]},
        ]
    )
    log.add(Note("instructions", "Prices in euros."))
    log.add(UserSpeech("What is the weather  in Paris?"))
    log.add(BackendTurn("Let me check.", (CallRecord("call_1", "get_weather", '{"city":"Paris"}'),)))
    log.add(Note("thinking", "Ana prefers trains."))
    log.add(CallOutput("call_1", '{"temp_c": 21, "sky": "sunny"}'))
    log.add(BackendTurn("It is sunny and 21 degrees in Paris."))
    log.add(UserSpeech(""))  # nothing said: not an entry
    return log


def test_prompt_has_instructions_notes_history_and_tool_exchange() -> None:
    log = sample_log()
    log.add(UserSpeech("And tomorrow?"))
    messages = build_backend_messages(log, instructions="You are a travel agent.", tools=True)
    for msg in messages:
        CHAT_MESSAGE.validate_python(msg)
    system = messages[0]["content"]
    assert messages[0]["role"] == "system" and sum(m["role"] == "system" for m in messages) == 1
    order = [
        system.index(s)
        for s in ("At most 30 words", "You are a travel agent.", "Ana.", "Prices in euros.", "Ana prefers trains.")
    ]
    assert order == sorted(order)
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert messages[3]["content"] == "What is the weather in Paris?"
    call_msg = messages[4]
    assert call_msg["content"] == "Let me check."
    assert call_msg["tool_calls"][0] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    assert messages[5] == {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21, "sky": "sunny"}'}
    assert messages[-1] == {"role": "user", "content": "And tomorrow?"}


def test_front_end_instructions_are_not_the_backend_prompt() -> None:
    messages = build_backend_messages(ConversationLog(), instructions=None)
    assert "Instructions for this conversation" not in messages[0]["content"]
    assert messages[-1] == {"role": "user", "content": SILENCE_MARK}


def test_pending_partial_and_silence_marks() -> None:
    log = sample_log()
    spec = build_backend_messages(log, instructions=None, pending_user="and what about  tomor")
    assert spec[-1] == {"role": "user", "content": f"{PENDING_MARK} and what about tomor"}
    silent = build_backend_messages(log, instructions=None)
    assert silent[-1] == {"role": "user", "content": SILENCE_MARK}


def test_unanswered_call_gets_a_no_output_message_and_continuing_ends_on_tools() -> None:
    log = ConversationLog()
    log.add(UserSpeech("Book it."))
    log.add(BackendTurn("", (CallRecord("c1", "book", "{}"), CallRecord("c2", "pay", ""))))
    assert [c.call_id for c in log.pending_calls()] == ["c1", "c2"]
    log.add(CallOutput("c1", "booked"))
    assert [c.call_id for c in log.pending_calls()] == ["c2"]
    assert log.has_call("c2") and not log.has_call("c9") and log.has_output("c1") and not log.has_output("c2")
    messages = build_backend_messages(log, instructions=None, continuing=True)
    for msg in messages:
        CHAT_MESSAGE.validate_python(msg)
    assert messages[2]["content"] is None and messages[2]["tool_calls"][1]["function"]["arguments"] == "{}"
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "booked"},
        {"role": "tool", "tool_call_id": "c2", "content": NO_OUTPUT},
    ]


def test_history_bound_drops_oldest_and_keeps_rounds_whole() -> None:
    log = ConversationLog()
    for i in range(30):
        log.add(UserSpeech(f"question number {i} " + "x" * 80))
        log.add(BackendTurn("", (CallRecord(f"c{i}", "f", "{}"),)))
        log.add(CallOutput(f"c{i}", "y" * 80))
        log.add(BackendTurn(f"answer {i}"))
    messages = build_backend_messages(log, instructions=None, max_chars=1000)
    assert 1 < len(messages) < 40
    ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    calls = [m["tool_calls"][0]["id"] for m in messages if m.get("tool_calls")]
    assert ids == calls and "c29" in ids and "c0" not in ids
    assert sum(len(m.get("content") or "") for m in messages[1:]) <= 1000 + 200


def test_consecutive_user_entries_merge_and_client_developer_items_stay_in_place() -> None:
    log = ConversationLog()
    log.add(UserSpeech("Hello"))
    log.add(ClientMessage("user", "there"))
    log.add(ClientMessage("developer", "The user is on a train."))
    messages = build_backend_messages(log, instructions=None)
    assert messages[1:] == [
        {"role": "user", "content": "Hello there [note from the application] The user is on a train."}
    ]


def test_log_keeps_at_most_max_entries() -> None:
    log = ConversationLog(max_entries=5)
    for i in range(12):
        log.add(UserSpeech(f"q{i}"))
    assert [e.text for e in log.entries] == ["q7", "q8", "q9", "q10", "q11"]  # type: ignore[union-attr]
