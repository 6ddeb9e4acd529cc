"""MCP servers written here with the `mcp` SDK, run as real subprocesses (stdio and streamable HTTP)."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from kame.backend.config import BackendConfig, McpServerConfig, ToolsConfig
from kame.backend.mcp_tools import McpToolbox, UnknownMcpServer
from kame.backend.registry import BackendRegistry
from kame.backend.resolve import ResolvedBackends
from kame.backend.tool_loop import CallFinished, LoopDone, TextDelta, ToolLoop
from kame.backend.tools import ToolCall
from tests.support.llm_server import LlmServer, RecordedRequest, Reply, ToolCallScript
from tests.support.moshi_client import free_port

SECRET = "mcp-secret-KEY-4c1f9a77e2"

SERVER = textwrap.dedent('''
    import os, sys, time
    from mcp.server.mcpserver import MCPServer

    if os.environ.get("FAIL_AT_START"):
        print("starting with key " + os.environ.get("WEATHER_KEY", ""), file=sys.stderr)
        sys.exit(2)
    if os.environ.get("HANG_AT_START"):
        time.sleep(3600)
    if os.environ.get("CHATTY"):
        print("starting, my key is " + os.environ.get("WEATHER_KEY", ""), flush=True)  # not JSON-RPC

    app = MCPServer("weather")

    @app.tool()
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return f"sunny and 21 degrees in {city} (key {os.environ.get('WEATHER_KEY', 'none')})"

    @app.tool()
    def book_table(time: str) -> str:
        """Book a table."""
        return f"booked at {time}"

    @app.tool()
    def not_allowed() -> str:
        """Must never be offered."""
        return "leak"

    @app.tool()
    def big() -> str:
        return "x" * 10000

    @app.tool()
    def crash() -> str:
        os._exit(3)

    @app.tool()
    def hang() -> str:
        time.sleep(3600)
        return "never"

    @app.tool()
    def fails() -> str:
        raise ValueError("the weather service is down")

    if __name__ == "__main__":
        if len(sys.argv) > 1:
            app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
        else:
            app.run()
''')

ALLOWED = ["get_weather", "book_table", "big", "crash", "hang", "fails"]


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    path = tmp_path / "weather_mcp.py"
    path.write_text(SERVER)
    return path


def stdio_cfg(script: Path, **over: Any) -> McpServerConfig:
    data: dict[str, Any] = {"command": sys.executable, "args": [str(script)], "env_from": {"WEATHER_KEY": "KAME_WEATHER_KEY"},
                            "tools": ALLOWED, "read_only": ["get_weather"], "timeout_s": 3.0, "max_output_chars": 500}
    data.update(over)
    return McpServerConfig.model_validate(data)


def toolbox(**servers: McpServerConfig) -> McpToolbox:
    return McpToolbox(ToolsConfig(mcp_servers=servers), {"KAME_WEATHER_KEY": SECRET})


def call(name: str, args: str = "{}") -> ToolCall:
    return ToolCall(f"c-{name}", name, args)


def test_allow_list_read_only_call_cap_and_redaction(server_script: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        box = toolbox(weather=stdio_cfg(server_script))
        try:
            tools = await box.tools(["weather"])
            specs = {t.spec.name: t.spec for t in tools}
            assert set(specs) == set(ALLOWED)  # not_allowed is on the server, not offered
            assert specs["get_weather"].read_only and not specs["book_table"].read_only
            assert specs["get_weather"].parameters["required"] == ["city"]
            ex = box.executor(tools)
            ok = await ex.execute(call("get_weather", '{"city": "Paris"}'), specs["get_weather"])
            assert ok.outcome == "ok" and ok.output.startswith("sunny and 21 degrees in Paris")
            assert SECRET not in ok.output and "***" in ok.output  # the child got the key; nobody else sees it
            big = await ex.execute(call("big"), specs["big"])
            assert big.ok and len(big.output) < 600 and "cut" in big.output
            bad = await ex.execute(call("fails"), specs["fails"])
            assert bad.outcome == "error" and "fails" in bad.output  # the SDK reports is_error with its text
            sneaky = await box.connections["weather"].call(call("not_allowed"), "not_allowed")
            assert sneaky.outcome == "refused"
        finally:
            await box.aclose()

    asyncio.run(main())
    assert SECRET not in caplog.text


def test_a_crashing_server_fails_its_call_and_comes_back(server_script: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        box = toolbox(weather=stdio_cfg(server_script))
        try:
            tools = await box.tools(["weather"])
            specs = {t.spec.name: t.spec for t in tools}
            ex = box.executor(tools)
            t0 = time.monotonic()
            crashed = await ex.execute(call("crash"), specs["crash"])
            assert crashed.outcome == "error" and time.monotonic() - t0 < 2.5
            assert SECRET not in crashed.output
            await asyncio.sleep(0.6)  # the reconnect backoff after one failure is 0.5 s
            again = await ex.execute(call("get_weather", '{"city": "Oslo"}'), specs["get_weather"])
            assert again.ok and "Oslo" in again.output
            assert box.connections["weather"].connects == 2
        finally:
            await box.aclose()

    asyncio.run(main())
    assert SECRET not in caplog.text


def test_a_hanging_call_times_out_and_other_calls_still_work(server_script: Path) -> None:
    async def main() -> None:
        box = toolbox(weather=stdio_cfg(server_script, timeout_s=1.0))
        try:
            tools = await box.tools(["weather"])
            specs = {t.spec.name: t.spec for t in tools}
            ex = box.executor(tools)
            t0 = time.monotonic()
            hung, ok = await asyncio.gather(
                ex.execute(call("hang"), specs["hang"]),
                ex.execute(call("get_weather", '{"city": "Rome"}'), specs["get_weather"]),
            )
            assert hung.outcome == "timeout" and 0.9 <= time.monotonic() - t0 < 2.5
            assert ok.ok and "Rome" in ok.output
        finally:
            await box.aclose()

    asyncio.run(main())


def test_servers_that_fail_or_hang_at_start_offer_nothing_and_leak_nothing(
    server_script: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        box = toolbox(
            dead=stdio_cfg(server_script, env={"FAIL_AT_START": "1"}),
            stuck=stdio_cfg(server_script, env={"HANG_AT_START": "1"}, connect_timeout_s=1.5),
            weather=stdio_cfg(server_script),
        )
        try:
            t0 = time.monotonic()
            tools = await box.tools(["dead", "stuck", "weather"])
            assert time.monotonic() - t0 < 12.0  # the stuck one is bounded by its connect timeout
            assert {t.server for t in tools} == {"weather"}
            result = await box.connections["dead"].call(call("get_weather", '{"city": "x"}'), "get_weather")
            assert result.outcome == "error" and SECRET not in result.output
        finally:
            await box.aclose()

    asyncio.run(main())
    assert SECRET not in caplog.text


def test_a_server_that_prints_its_key_on_stdout_still_works_and_the_key_stays_out_of_the_logs(
    server_script: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        box = toolbox(weather=stdio_cfg(server_script, env={"CHATTY": "1"}))
        try:
            tools = await box.tools(["weather"])
            spec = next(t.spec for t in tools if t.tool == "get_weather")
            res = await box.executor(tools).execute(call("get_weather", '{"city": "Oslo"}'), spec)
            assert res.ok and "Oslo" in res.output
        finally:
            await box.aclose()

    asyncio.run(main())
    assert "Failed to parse" in caplog.text  # the SDK did log the line...
    assert SECRET not in caplog.text  # ... without the key


def test_sessions_pick_servers_by_name_only() -> None:
    cfg = ToolsConfig(mcp_servers={
        "a": McpServerConfig(command="x", tools=["t"], enabled=True),
        "b": McpServerConfig(command="y", tools=["t"]),
        "c": McpServerConfig(url="http://127.0.0.1:1/mcp", tools=["t"]),
    })
    box = McpToolbox(cfg, {})
    assert box.servers_for(None) == ["a"]
    assert box.servers_for(BackendConfig(kind="scripted", mcp_servers=["c"]), ["b"]) == ["a", "c", "b"]
    with pytest.raises(UnknownMcpServer):
        box.servers_for(None, ["http://evil.example/mcp"])
    with pytest.raises(ValueError):
        McpServerConfig(command="x", url="http://h/mcp")
    with pytest.raises(ValueError):
        McpServerConfig(command="x", tools=["a"], read_only=["b"])
    with pytest.raises(ValueError):
        McpServerConfig(command="x", env_from={"K": "sk-not-a-name"})


def test_streamable_http_server(server_script: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(server_script), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)

        async def main() -> None:
            box = toolbox(remote=McpServerConfig(url=f"http://127.0.0.1:{port}/mcp", tools=["get_weather"],
                                                 read_only=["get_weather"], timeout_s=5))
            try:
                tools = await box.tools(["remote"])
                assert [t.spec.name for t in tools] == ["get_weather"]
                res = await box.executor(tools).execute(call("get_weather", '{"city": "Lima"}'), tools[0].spec)
                assert res.ok and "Lima" in res.output
            finally:
                await box.aclose()

        asyncio.run(main())
    finally:
        proc.kill()
        proc.wait(5)


def test_the_llm_calls_an_mcp_tool_through_the_loop(server_script: Path, llm_server: LlmServer) -> None:
    def llm(rec: RecordedRequest) -> Reply:
        if rec.tool_messages:
            return Reply(text=f"Here it is, {rec.tool_messages[-1]['content']}.")
        return Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"}),
                                                        ToolCallScript("fails", {})])

    llm_server.responder = llm
    cfg = BackendConfig(base_url=llm_server.base_url, model="m", api_key_env="", allow_tools=True)
    reg = BackendRegistry(ResolvedBackends({"llm": cfg}, "llm"), environ={})

    async def main() -> list[Any]:
        box = toolbox(weather=stdio_cfg(server_script))
        try:
            tools = await box.tools(["weather"])
            specs = [t.spec for t in tools if t.tool in ("get_weather", "fails")]
            return [ev async for ev in ToolLoop(reg).run(None, [{"role": "user", "content": "weather?"}], specs,
                                                         box.executor(tools))]
        finally:
            await box.aclose()
            await reg.aclose()

    events = asyncio.run(main())
    outcomes = {e.call.name: e.result.outcome for e in events if isinstance(e, CallFinished)}
    assert outcomes == {"get_weather": "ok", "fails": "error"}
    done = events[-1]
    assert isinstance(done, LoopDone) and done.text.startswith("Here it is,")
    assert any(isinstance(e, TextDelta) and e.after_tools for e in events)
    for rec in llm_server.chat_requests():
        assert SECRET not in str(rec.body)


def test_catalog_gives_a_session_its_mcp_tools_and_the_oracle_speaks_their_answer(
    server_script: Path, llm_server: LlmServer
) -> None:
    from kame.config import KameConfig
    from kame.oracle.config import OracleConfig
    from kame.oracle.loop import OracleLoop
    from kame.oracle.session_tools import ToolCatalog

    def llm(rec: RecordedRequest) -> Reply:
        if rec.tool_messages:
            return Reply(text=f"Here it is, {rec.tool_messages[-1]['content'].split(' (')[0]}.")
        if "get_weather" in rec.tool_names:
            return Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])
        return Reply(text="No tools.")

    llm_server.responder = llm
    cfg = KameConfig.model_validate({
        "backends": {"main": {"base_url": llm_server.base_url, "model": "m", "api_key_env": "", "allow_tools": True,
                              "mcp_servers": ["weather"]}},
        "tools": {"mcp_servers": {"weather": stdio_cfg(server_script).model_dump()}},
    })
    seen: list[tuple[str, str, str | None]] = []
    catalog = ToolCatalog(cfg.tools, {"KAME_WEATHER_KEY": SECRET},
                          observer=lambda ev, source: seen.append((ev.name, source, ev.outcome)))
    reg = BackendRegistry.from_config(cfg, {})

    class Sink:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def oracle_reset(self, ids: list[int]) -> None:
            self.texts.append("".join(chr(i) for i in ids))

        def oracle_push(self, ids: list[int]) -> None:
            self.texts[-1] += "".join(chr(i) for i in ids)

        def oracle_clear(self) -> None:
            pass

    async def main() -> tuple[Sink, list[str]]:
        tools = catalog.new_session()
        servers = catalog.mcp_servers_for(cfg.backends["main"])
        assert servers == ["weather"]
        with pytest.raises(UnknownMcpServer):
            catalog.mcp_servers_for(cfg.backends["main"], ["stdio:/bin/sh"])
        specs = await catalog.enable_mcp(tools, servers)
        assert "get_weather" in [s.name for s in specs]
        sink = Sink()
        events: list[str] = []
        loop = OracleLoop(config=OracleConfig(), registry=reg, sink=sink, encode=lambda t: [ord(c) for c in t],
                          piece_of=None, emit=lambda e: events.append(e.name), tools=tools)
        loop.on_user_final("what is the weather in Paris")
        deadline = time.monotonic() + 15
        while "llm.done" not in events and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await loop.aclose()
        await catalog.aclose()
        await reg.aclose()
        return sink, events

    sink, events = asyncio.run(main())
    assert sink.texts == ["Let me check.", "Here it is, sunny and 21 degrees in Paris."]
    assert ("get_weather", "mcp", "ok") in seen
    assert "tool.call_finished" in events


def test_session_tool_state_follows_settings(server_script: Path) -> None:
    from kame.backend.client_functions import ClientCall, UnknownCallId
    from kame.backend.tools import ToolSpec
    from kame.oracle.session_tools import SessionToolState, ToolCatalog

    async def main() -> None:
        catalog = ToolCatalog(ToolsConfig(mcp_servers={"weather": stdio_cfg(server_script)}),
                              {"KAME_WEATHER_KEY": SECRET})
        asked: list[ClientCall] = []
        ids = iter(range(100))
        state = SessionToolState(catalog, emit=asked.append, new_call_id=lambda: f"call_{next(ids)}")
        mine = ToolSpec("my_calendar", "The user's calendar.", read_only=True)
        state.apply(functions=[mine], tool_choice="auto", mcp_servers=["weather"])
        await asyncio.wait_for(state.mcp_ready.wait(), 15)
        names = [s.name for s in state.tools.specs]
        assert "my_calendar" in names and "get_weather" in names
        # a call of the client's function goes to the client and waits for its output
        ex = state.tools.calls.executor(turn_id=1, turn_ended=True)
        task = asyncio.create_task(ex.execute(call("my_calendar"), mine))
        await asyncio.sleep(0.05)
        assert [a.name for a in asked] == ["my_calendar"]
        with pytest.raises(UnknownCallId):
            state.deliver("call_99", "x")
        state.deliver(asked[0].call_id, "free all day")
        assert (await task).output == "free all day"
        # the MCP tool goes to the server
        spec = next(s for s in state.tools.specs if s.name == "get_weather")
        res = await ex.execute(call("get_weather", '{"city": "Nice"}'), spec)
        assert res.ok and "Nice" in res.output
        with pytest.raises(UnknownMcpServer):
            state.apply(mcp_servers=["nope"])
        state.apply(functions=[], mcp_servers=[])  # all off
        await asyncio.wait_for(state.mcp_ready.wait(), 5)
        assert state.tools.specs == []
        await state.aclose()
        await catalog.aclose()

    asyncio.run(main())
