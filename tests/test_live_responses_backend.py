"""Responses delegation on real back-ends: the registry, the real `openai` client and a real local
server streaming `tool_calls` (tests/support/llm_server.py); every event is parsed with the SDK's own models."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from openai.types.live import ServerEvent
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from kame.backend.config import BackendConfig
from kame.backend.registry import BackendRegistry
from kame.backend.resolve import ResolvedBackends
from kame.session.responses.backend import registry_catalog, registry_source
from kame.session.responses.config import parse_responses_config
from kame.session.responses.conversation import ConversationLog, UserSpeech
from kame.session.responses.rounds import DelegationDone, ResponsesDelegator
from kame.session.responses.settings import DelegationConfigError
from kame.session.responses.stream import Usage
from tests.support.llm_server import LlmServer, Reply, ToolCallScript

LIVE_EVENT: TypeAdapter[Any] = TypeAdapter(ServerEvent)
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def registry_for(server: LlmServer, **extra: Any) -> BackendRegistry:
    llm = BackendConfig.model_validate(
        {"base_url": server.base_url, "model": "test-model", "api_key_env": "", "allow_tools": True}
    )
    plain = BackendConfig.model_validate(
        {"base_url": server.base_url, "model": "plain-model", "api_key_env": "", "allow_tools": False}
    )
    scripted = BackendConfig.model_validate({"kind": "scripted"})
    return BackendRegistry(ResolvedBackends({"llm": llm, "plain": plain, "demo": scripted}, "llm"), environ={}, **extra)


class Session:
    """The delegator as the Live wire drives it, with the sent events checked by the SDK."""

    def __init__(self, registry: BackendRegistry, cfg: dict[str, Any], **kw: Any) -> None:
        self.settings = parse_responses_config(cfg, registry_catalog(registry))
        self.sent: list[dict[str, Any]] = []
        self.done: list[DelegationDone] = []
        self.conversation = ConversationLog()
        self.d = ResponsesDelegator(
            settings=lambda: self.settings,
            source=registry_source(registry),
            send=self.send,
            on_done=self.done.append,
            conversation=self.conversation,
            **kw,
        )

    def send(self, event: dict[str, Any]) -> None:
        LIVE_EVENT.validate_python(dict(event, event_id="event_1"))
        if event["type"] == "response.event":
            STREAM_EVENT.validate_python(event["event"])
        self.sent.append(event)

    def nested(self, type_: str) -> list[dict[str, Any]]:
        return [e["event"] for e in self.sent if e["type"] == "response.event" and e["event"]["type"] == type_]

    async def calls(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            calls = [
                e["item"] for e in self.nested("response.output_item.done") if e["item"]["type"] == "function_call"
            ]
            if len(calls) >= n and self.d._waiting is not None:
                return calls
            assert loop.time() < end, "no function call"
            await asyncio.sleep(0.01)


def test_a_tool_round_through_the_real_client_and_a_second_question(llm_server: LlmServer) -> None:
    llm_server.push(
        Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"}, id="call_srv")]),
        Reply(
            text="It is sunny and 21 degrees in Paris.",
            usage={"prompt_tokens": 90, "completion_tokens": 11, "total_tokens": 101},
        ),
        Reply(text="Tomorrow it rains in Paris."),
    )

    async def main() -> None:
        registry = registry_for(llm_server)
        s = Session(registry, {"model": "llm", "instructions": "You are a weather assistant.", "tools": [WEATHER]})
        s.conversation.add(UserSpeech("What is the weather in Paris?"))
        task = s.d.start(*s.d.new_ids())
        call = (await s.calls(1))[0]
        assert (call["name"], json.loads(call["arguments"]), call["status"]) == (
            "get_weather",
            {"city": "Paris"},
            "completed",
        )
        first = s.nested("response.completed")[0]["response"]
        assert first["usage"]["output_tokens"] > 0  # counted by the server: kame asked for usage
        s.d.item_create({"type": "function_call_output", "call_id": call["call_id"], "output": '{"temp_c": 21}'})
        assert s.d.response_create() == "resumed"
        done = await asyncio.wait_for(task, 10)
        assert (done.status, done.text) == ("completed", "It is sunny and 21 degrees in Paris.")
        second = s.nested("response.completed")[1]["response"]
        assert second["usage"]["input_tokens"] == 90 and second["usage"]["total_tokens"] == 101
        # A second question in the same session: one request, with the whole conversation.
        s.conversation.add(UserSpeech("And tomorrow?"))
        done2 = await asyncio.wait_for(s.d.start(*s.d.new_ids()), 10)
        assert done2.text == "Tomorrow it rains in Paris."
        await registry.aclose()

    asyncio.run(main())
    reqs = llm_server.chat_requests()
    assert len(reqs) == 3
    body0 = reqs[0].body
    assert body0["model"] == "test-model" and reqs[0].tool_names == ["get_weather"]
    assert body0["stream_options"] == {"include_usage": True} and body0["tool_choice"] == "auto"
    assert "You are a weather assistant." in body0["messages"][0]["content"]
    assert reqs[1].tool_messages == [
        {"role": "tool", "tool_call_id": reqs[1].tool_messages[0]["tool_call_id"], "content": '{"temp_c": 21}'}
    ]
    third = reqs[2].body["messages"]
    assert [m["role"] for m in third[1:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert third[-1]["content"] == "And tomorrow?" and third[-2]["content"] == "It is sunny and 21 degrees in Paris."


def test_model_name_goes_to_the_default_backend(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text="Hi."))

    async def main() -> DelegationDone:
        registry = registry_for(llm_server)
        s = Session(registry, {"model": "gpt-4.1-mini"})
        assert s.settings.target.backend == "llm" and s.settings.target.model == "gpt-4.1-mini"
        done = await asyncio.wait_for(s.d.start(*s.d.new_ids()), 10)
        await registry.aclose()
        return done

    assert asyncio.run(main()).text == "Hi."
    body = llm_server.chat_requests()[0].body
    assert body["model"] == "gpt-4.1-mini" and "tools" not in body


def test_backend_error_fails_the_response_and_the_session_goes_on(llm_server: LlmServer) -> None:
    llm_server.push(Reply(status=500, error_message="boom"), Reply(text="Working again."))

    async def main() -> tuple[DelegationDone, DelegationDone, Session]:
        registry = registry_for(llm_server)
        s = Session(registry, {"model": "llm", "tools": [WEATHER]})
        first = await asyncio.wait_for(s.d.start(*s.d.new_ids()), 10)
        second = await asyncio.wait_for(s.d.start(*s.d.new_ids()), 10)
        await registry.aclose()
        return first, second, s

    first, second, s = asyncio.run(main())
    assert first.status == "failed" and second.text == "Working again."
    failed = s.nested("response.failed")[0]["response"]["error"]
    assert failed["code"] == "server_error" and "500" in failed["message"] and failed["type"] == "server_error"


def test_a_client_that_never_answers(llm_server: LlmServer) -> None:
    llm_server.push(
        Reply(text="", tool_calls=[ToolCallScript("get_weather", {"city": "Oslo"})]),
        Reply(text="I could not get the weather right now."),
    )

    async def main() -> tuple[DelegationDone, Session]:
        registry = registry_for(llm_server)
        s = Session(registry, {"model": "llm", "tools": [WEATHER]}, function_timeout_s=0.3)
        done = await asyncio.wait_for(s.d.start(*s.d.new_ids()), 10)
        await registry.aclose()
        return done, s

    done, s = asyncio.run(main())
    assert done.text == "I could not get the weather right now."
    assert [e["code"] for e in s.sent if e["type"] == "info"] == ["kame.function_timeout"]
    tool = llm_server.chat_requests()[1].tool_messages[0]
    assert "did not answer within 0.3 s" in tool["content"]


def test_catalog_from_the_registry(llm_server: LlmServer) -> None:
    registry = registry_for(llm_server)
    catalog = registry_catalog(registry, {"weather": ["forecast"]})
    assert catalog.default == "llm" and set(catalog.backends) == {"llm", "plain", "demo"}
    assert catalog.tools_allowed == frozenset({"llm", "demo"}) and catalog.model_override == frozenset({"llm", "plain"})
    with pytest.raises(DelegationConfigError) as info:
        parse_responses_config({"model": "plain", "tools": [WEATHER]}, catalog)
    assert info.value.code == "tools_not_allowed"
    assert parse_responses_config({"model": "demo"}, catalog).target.model is None
    asyncio.run(registry.aclose())


def test_usage_is_none_when_the_server_sends_none(llm_server: LlmServer) -> None:
    from kame.backend.tools import TurnReport
    from kame.session.responses.backend import usage_of

    assert usage_of(TurnReport()) is None
    assert usage_of(TurnReport(prompt_tokens=3, completion_tokens=2, cached_tokens=1)) == Usage(3, 2, 1, 0)


MCP_SERVER = """
from mcp.server.mcpserver import MCPServer

app = MCPServer("weather")


@app.tool()
def forecast(city: str) -> str:
    \"\"\"Tomorrow's weather in a city.\"\"\"
    return f"rain tomorrow in {city}"


@app.tool()
def broken() -> str:
    \"\"\"Always fails.\"\"\"
    raise ValueError("the forecast service is down")


if __name__ == "__main__":
    app.run()
"""


def test_operator_mcp_server_runs_inside_kame(llm_server: LlmServer, tmp_path: Any) -> None:
    import sys

    from kame.backend.config import McpServerConfig, ToolsConfig
    from kame.backend.mcp_tools import McpToolbox
    from kame.session.responses.backend import McpServerTools, mcp_catalog

    script = tmp_path / "weather_mcp.py"
    script.write_text(MCP_SERVER)
    llm_server.push(
        Reply(
            text="One moment.", tool_calls=[ToolCallScript("forecast", {"city": "Oslo"}), ToolCallScript("broken", {})]
        ),
        Reply(text="It will rain tomorrow in Oslo."),
    )

    async def main() -> tuple[DelegationDone, Session]:
        box = McpToolbox(
            ToolsConfig(
                mcp_servers={
                    "weather": McpServerConfig.model_validate(
                        {
                            "command": sys.executable,
                            "args": [str(script)],
                            "tools": ["forecast", "broken"],
                            "timeout_s": 10.0,
                        }
                    )
                }
            ),
            {},
        )
        registry = registry_for(llm_server)
        try:
            catalog = registry_catalog(registry, mcp_catalog(box))
            s = Session.__new__(Session)
            s.settings = parse_responses_config(
                {"model": "llm", "tools": [WEATHER, {"type": "mcp", "server_label": "weather"}]}, catalog
            )
            s.sent, s.done, s.conversation = [], [], ConversationLog()
            s.d = ResponsesDelegator(
                settings=lambda: s.settings,
                source=registry_source(registry),
                send=s.send,
                on_done=s.done.append,
                conversation=s.conversation,
                server_tools=McpServerTools(box),
            )
            s.conversation.add(UserSpeech("Will it rain in Oslo tomorrow?"))
            done = await asyncio.wait_for(s.d.start(*s.d.new_ids()), 30)
            return done, s
        finally:
            await box.aclose()
            await registry.aclose()

    done, s = asyncio.run(main())
    assert (done.status, done.text, done.rounds) == ("completed", "It will rain tomorrow in Oslo.", 2)
    items = [e["item"] for e in s.nested("response.output_item.done") if e["item"]["type"] == "mcp_call"]
    assert [(i["name"], i["status"]) for i in items] == [("forecast", "completed"), ("broken", "failed")]
    assert items[0]["output"] == "rain tomorrow in Oslo" and items[0]["server_label"] == "weather"
    assert not [e for e in s.nested("response.output_item.done") if e["item"]["type"] == "function_call"]
    first, second = llm_server.chat_requests()
    assert set(first.tool_names) == {"get_weather", "forecast", "broken"}
    outputs = [m["content"] for m in second.tool_messages]
    assert outputs[0] == "rain tomorrow in Oslo" and outputs[1].startswith("Error:")


def test_a_backend_that_refuses_stream_options_is_asked_without(llm_server: LlmServer) -> None:
    llm_server.push(
        Reply(status=400, error_message="Unrecognized request argument supplied: stream_options"),
        Reply(text="", tool_calls=[ToolCallScript("get_weather", {"city": "Nice"})]),
        Reply(text="Nice is warm."),
    )

    async def main() -> tuple[DelegationDone, Session]:
        registry = registry_for(llm_server)
        s = Session(registry, {"model": "llm", "tools": [WEATHER]})
        task = s.d.start(*s.d.new_ids())
        call = (await s.calls(1))[0]
        s.d.item_create({"type": "function_call_output", "call_id": call["call_id"], "output": "warm"})
        s.d.response_create()
        done = await asyncio.wait_for(task, 10)
        await registry.aclose()
        return done, s

    done, s = asyncio.run(main())
    assert done.text == "Nice is warm." and not s.nested("response.failed")
    reqs = llm_server.chat_requests()
    assert len(reqs) == 3 and "stream_options" in reqs[0].body
    assert "stream_options" not in reqs[1].body and "stream_options" not in reqs[2].body  # remembered
    assert all(e["response"]["usage"] is None for e in s.nested("response.completed"))


def test_a_model_the_backend_does_not_serve_falls_back_to_its_own(llm_server: LlmServer) -> None:
    llm_server.push(
        Reply(status=404, error_message="The model `gpt-5.4-mini` does not exist."),
        Reply(text="Answer one."),
        Reply(text="Answer two."),
    )

    async def main() -> tuple[list[DelegationDone], Session]:
        registry = registry_for(llm_server)
        s = Session(registry, {"model": "gpt-5.4-mini"})
        done = [await asyncio.wait_for(s.d.start(*s.d.new_ids()), 10) for _ in range(2)]
        await registry.aclose()
        return done, s

    done, s = asyncio.run(main())
    assert [d.text for d in done] == ["Answer one.", "Answer two."]
    models = [r.body["model"] for r in llm_server.chat_requests()]
    assert models == ["gpt-5.4-mini", "test-model", "test-model"]  # remembered for the session
    notices = [e for e in s.sent if e["type"] == "info" and e["code"] == "kame.backend_notice"]
    assert len(notices) == 1 and "gpt-5.4-mini" in notices[0]["message"]
