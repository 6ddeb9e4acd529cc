"""Tools on by default, and a server that refuses them: the registry through the real `openai` client.

The servers are real HTTP servers on 127.0.0.1: one that refuses tools as vLLM
without --enable-auto-tool-choice does (tests/vllm_like_server.py: status 400,
vLLM's body), the same one accepting them, and the scriptable server answering
llama.cpp's and Ollama's refusals and unrelated 400s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from kame.backend.config import BackendConfig
from kame.backend.errors import BackendRequestError
from kame.backend.registry import BackendRegistry
from kame.backend.resolve import ResolvedBackends
from kame.backend.stats import BackendEvent
from kame.backend.tool_loop import LoopDone, TextDelta, ToolLoop
from kame.backend.tool_refusal import tools_refusal
from kame.backend.tools import ToolCall, ToolCallDelta, ToolResult, ToolSpec
from kame.config import KameConfig
from tests.support.llm_server import LlmServer, Reply, ToolCallScript
from tests.support.vllm_like_server import VLLM_TOOLS_MESSAGE, VllmLikeServer, running_vllm_like_server

WEATHER = ToolSpec("get_weather", "Current weather of a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}}, read_only=True)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def vllm() -> Iterator[VllmLikeServer]:
    with running_vllm_like_server(["served-model"]) as server:
        server.set_default(Reply(text="It is sunny in Paris."))
        yield server


def registry(base_url: str, events: list[BackendEvent] | None = None, **fields: Any) -> BackendRegistry:
    cfg = BackendConfig.model_validate({"base_url": base_url, "model": "served-model", "api_key_env": "", **fields})
    observers = [events.append] if events is not None else []
    return BackendRegistry(ResolvedBackends({"local": cfg}, "local"), environ={}, observers=observers)


async def turn(reg: BackendRegistry, tools: list[ToolSpec] | None = None) -> tuple[list[Any], str | None]:
    stream = reg.stream_turn(None, USER, tools=tools)
    async with stream:
        items = [item async for item in stream]
    return items, stream.tools_refused


# --------------------------------------------------------------------------- which errors are refusals


@pytest.mark.parametrize(("status", "message", "server"), [
    (400, VLLM_TOOLS_MESSAGE, "vLLM"),
    (500, "tools param requires --jinja flag", "llama.cpp"),
    (500, "Unsupported param: tools", "llama.cpp"),
    (400, "registry.ollama.ai/library/llama2:latest does not support tools", "Ollama"),
    (400, "stablelm2:latest does not support tools", "Ollama"),
])
def test_the_servers_refusals_of_tools_are_recognised(status: int, message: str, server: str) -> None:
    assert tools_refusal(status, message) == server


@pytest.mark.parametrize(("status", "message"), [
    (400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."),
    (400, "max_tokens must be at least 1, got 0."),
    (400, "tool_choice must either be a named tool, 'auto', or 'none'."),
    (400, "Invalid 'tools[0].function.name': string does not match pattern."),
    (500, VLLM_TOOLS_MESSAGE),  # vLLM sends it as a 400; a 500 with it is something else
    (404, "registry.ollama.ai/library/llama2:latest does not support tools"),
])
def test_unrelated_errors_are_not_refusals(status: int, message: str) -> None:
    assert tools_refusal(status, message) is None


# --------------------------------------------------------------------------- defaults


def test_allow_tools_is_on_for_a_kame_llm_base_url_back_end_and_tools_reach_its_server() -> None:
    with running_vllm_like_server(["served-model"], refuse_tools=False) as server:
        server.set_default(Reply(text="Let me look.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]))
        reg = BackendRegistry.from_config(KameConfig(), {"KAME_LLM_BASE_URL": server.base_url,
                                                         "KAME_LLM_MODEL": "served-model"})
        assert reg.default_name == "env" and reg.tools_allowed("env")
        items, refused = asyncio.run(turn(reg, [WEATHER]))
        asyncio.run(reg.aclose())
        assert refused is None and reg.tools_refused("env") is None
        assert any(isinstance(i, ToolCallDelta) and i.name == "get_weather" for i in items)
        (request,) = server.chat_requests()
        assert request.tool_names == ["get_weather"] and server.refused == []


def test_allow_tools_false_still_turns_them_off() -> None:
    reg = BackendRegistry.from_config(
        KameConfig.model_validate({"backends": {"env": {"allow_tools": False}}}),
        {"KAME_LLM_BASE_URL": "http://127.0.0.1:9/v1"},
    )
    assert not reg.tools_allowed("env")


# --------------------------------------------------------------------------- the vLLM refusal


def test_first_refusal_marks_the_back_end_tool_less_and_the_turn_is_answered_without_tools(
    vllm: VllmLikeServer, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[BackendEvent] = []
    reg = registry(vllm.base_url, events)
    assert reg.tools_allowed("local") and reg.tools_refused("local") is None

    async def main() -> tuple[tuple[list[Any], str | None], tuple[list[Any], str | None]]:
        try:
            return await turn(reg, [WEATHER]), await turn(reg, [WEATHER])
        finally:
            await reg.aclose()

    with caplog.at_level(logging.WARNING, logger="kame.backend.registry"):
        (first, first_refused), (second, second_refused) = asyncio.run(main())
    # the refused turn was answered, at once, without tools
    assert "".join(i for i in first if isinstance(i, str)) == "It is sunny in Paris."
    assert first_refused == VLLM_TOOLS_MESSAGE and second_refused == VLLM_TOOLS_MESSAGE
    assert "".join(i for i in second if isinstance(i, str)) == "It is sunny in Paris."
    requests = vllm.chat_requests()
    assert [r.tool_names for r in requests] == [["get_weather"], [], []]  # refused, retried, later: no retry
    assert all("tool_choice" not in r.body for r in requests[1:])
    assert len(vllm.refused) == 1
    assert reg.tools_refused("local") == VLLM_TOOLS_MESSAGE
    # one log line naming the back-end and the server's reason; one event; no error, no breaker failure
    lines = [r.getMessage() for r in caplog.records if "refuses function tools" in r.getMessage()]
    assert len(lines) == 1 and "local" in lines[0] and "--enable-auto-tool-choice" in lines[0], lines
    refused = [e for e in events if e.kind == "tools_refused"]
    assert len(refused) == 1 and refused[0].backend == "local" and refused[0].error == VLLM_TOOLS_MESSAGE
    assert not [e for e in events if e.kind == "error"]
    assert reg.breaker_state("local") == "closed"
    assert [d["tools"] for d in reg.describe()] == ["refused"]


def test_concurrent_refusals_log_once(vllm: VllmLikeServer, caplog: pytest.LogCaptureFixture) -> None:
    events: list[BackendEvent] = []
    reg = registry(vllm.base_url, events)

    async def main() -> list[tuple[list[Any], str | None]]:
        try:
            return await asyncio.gather(*(turn(reg, [WEATHER]) for _ in range(3)))
        finally:
            await reg.aclose()

    with caplog.at_level(logging.WARNING, logger="kame.backend.registry"):
        results = asyncio.run(main())
    assert all("".join(i for i in items if isinstance(i, str)) == "It is sunny in Paris." for items, _ in results)
    assert len([e for e in events if e.kind == "tools_refused"]) == 1
    assert len([r for r in caplog.records if "refuses function tools" in r.getMessage()]) == 1


def test_the_tool_loop_on_a_refusing_server_answers_in_one_round(vllm: VllmLikeServer) -> None:
    reg = registry(vllm.base_url)

    class Never:
        async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
            raise AssertionError("no tool can be called on a server that refuses tools")

    async def main() -> list[Any]:
        try:
            return [ev async for ev in ToolLoop(reg).run(None, USER, [WEATHER], Never())]
        finally:
            await reg.aclose()

    events = asyncio.run(main())
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It is sunny in Paris."
    assert isinstance(events[-1], LoopDone) and events[-1].rounds == 0


def test_a_server_that_accepts_tools_is_never_marked() -> None:
    with running_vllm_like_server(["served-model"], refuse_tools=False) as server:
        server.set_default(Reply(text="Let me look.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]))
        reg = registry(server.base_url)

        async def main() -> tuple[list[Any], str | None]:
            try:
                await turn(reg, [WEATHER])
                return await turn(reg, [WEATHER])
            finally:
                await reg.aclose()

        items, refused = asyncio.run(main())
        assert refused is None and reg.tools_refused("local") is None
        assert [r.tool_names for r in server.chat_requests()] == [["get_weather"], ["get_weather"]]
        assert any(isinstance(i, ToolCallDelta) for i in items)


# --------------------------------------------------------------------------- other servers, other errors


@pytest.mark.parametrize(("status", "message"), [
    (500, "tools param requires --jinja flag"),  # llama-server without --jinja
    (400, "registry.ollama.ai/library/gemma:2b does not support tools"),  # Ollama
])
def test_llama_cpp_and_ollama_refusals(llm_server: LlmServer, status: int, message: str) -> None:
    llm_server.push(Reply(status=status, error_message=message))
    llm_server.set_default(Reply(text="Fine."))
    events: list[BackendEvent] = []
    reg = registry(llm_server.base_url, events)

    async def main() -> tuple[list[Any], str | None]:
        try:
            return await turn(reg, [WEATHER])
        finally:
            await reg.aclose()

    items, refused = asyncio.run(main())
    assert "".join(i for i in items if isinstance(i, str)) == "Fine." and refused == message
    assert [r.tool_names for r in llm_server.chat_requests()] == [["get_weather"], []]
    assert [e.kind for e in events if e.kind in ("tools_refused", "error")] == ["tools_refused"]


def test_an_unrelated_400_is_not_a_refusal(llm_server: LlmServer) -> None:
    llm_server.push(Reply(status=400, error_message="max_tokens must be at least 1, got 0."))
    reg = registry(llm_server.base_url)

    async def main() -> None:
        try:
            await turn(reg, [WEATHER])
        finally:
            await reg.aclose()

    with pytest.raises(BackendRequestError) as info:
        asyncio.run(main())
    assert info.value.kind == "bad_request" and reg.tools_refused("local") is None
    assert len(llm_server.chat_requests()) == 1  # not asked again


def test_the_refusal_without_tools_in_the_request_is_not_a_refusal_of_tools(llm_server: LlmServer) -> None:
    """A request that offered no tools cannot be refused for them (the same message is an ordinary error)."""
    llm_server.push(Reply(status=400, error_message=VLLM_TOOLS_MESSAGE))
    reg = registry(llm_server.base_url)

    async def main() -> None:
        try:
            await turn(reg, None)
        finally:
            await reg.aclose()

    with pytest.raises(BackendRequestError):
        asyncio.run(main())
    assert reg.tools_refused("local") is None
