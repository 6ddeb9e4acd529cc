"""Server-side MCP tools for a Moshi-protocol session (/api/chat) on the real CPU demo server.

A real stdio MCP server written here with the ``mcp`` SDK is configured by the operator
(server-wide, with an allow-list, read-only tools, a timeout and an environment key); the
scripted back-end calls its tools when it hears the keyword. A question spoken with espeak
gets the tool's answer into Moshi's oracle (seen in the session's recording); a tool that
crashes the MCP server and one that hangs fail their calls (metrics), and the session keeps
streaming audio to its end; the key never shows in the logs or the recording.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.moshi_client import ServerProcess, run_session
from tests.support.speech import silence, synthesize

SECRET = "mcp-chat-secret-91ab77c2e0"

MCP_SERVER = textwrap.dedent('''
    import os, time
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("weather")

    @app.tool()
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return f"sunny and warm in {city}, key {os.environ.get('WEATHER_KEY', 'none')}"

    @app.tool()
    def crash() -> str:
        os._exit(3)

    @app.tool()
    def hang() -> str:
        time.sleep(3600)
        return "never"

    if __name__ == "__main__":
        app.run()
''')

CONFIG = """
device: cpu
frontend:
  checkpoint: "tiny:0"
asr:
  kind: whisper
  device: cpu
backends:
  scripted:
    kind: scripted
    scripted:
      rules: {{}}
      default_reply: "I heard {{user}}."
      first_token_delay_s: 0.1
      tool_rules:
        - {{keyword: weather, tool: get_weather, arguments: {{city: Paris}}, say_first: "Let me check.",
           answer: "The forecast says {{result}}."}}
        - {{keyword: crash, tool: crash, say_first: "", answer: "Done."}}
        - {{keyword: stuck, tool: hang, say_first: "", answer: "Done."}}
tools:
  mcp_servers:
    weather:
      command: {python}
      args: [{script}]
      env_from: {{WEATHER_KEY: KAME_TEST_WEATHER_KEY}}
      tools: [get_weather, crash, hang]
      read_only: [get_weather, crash, hang]
      timeout_s: 1.5
      enabled: true
server:
  max_sessions: 2
  idle_timeout_s: 10
  record_dir: {record}
"""


@pytest.fixture(scope="module")
def server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    tmp = tmp_path_factory.mktemp("chat-mcp")
    script = tmp / "weather_mcp.py"
    script.write_text(MCP_SERVER)
    record = tmp / "rec"
    config = tmp / "mcp.yaml"
    config.write_text(CONFIG.format(python=sys.executable, script=script, record=record))
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp / "server.log", config=str(config),
                        env={"KAME_TEST_WEATHER_KEY": SECRET}).start()
    yield srv, record
    srv.stop()
    assert SECRET not in srv.logs()


def _events(record: Path, sessions: int) -> list[dict]:
    """Events of the recorded sessions, once the recorder has written the last one's end."""
    deadline = time.monotonic() + 10
    while True:
        out: list[dict] = []
        for path in sorted(record.glob("*/events.jsonl")):
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if sum(1 for e in out if e.get("type") == "session.end") >= sessions or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def _ask(srv: ServerProcess, question: str) -> tuple[int, int]:
    pcm = np.concatenate([silence(0.3), synthesize(question), silence(4.0)])
    client = asyncio.run(run_session(srv.ws_url, pcm, tail_s=3.0))
    return len(client.received_pcm()), len(pcm)


def test_an_mcp_tool_answers_a_spoken_question_through_the_oracle(server: tuple[ServerProcess, Path]) -> None:
    srv, record = server
    received, sent = _ask(srv, "What is the weather like today?")
    assert received > 0.8 * sent  # the session streamed all along
    assert srv.metric("kame_tool_calls_total", 'outcome="ok",tool="get_weather"') >= 1
    events = _events(record, 1)
    texts = [str(e.get("text", "")) for e in events if str(e.get("type", e.get("event", ""))).startswith("oracle.")]
    assert any(t.startswith("The forecast says sunny and warm in Paris") for t in texts), texts
    dump = json.dumps(events)
    assert SECRET not in dump and "***" in dump  # the key reached the tool, nobody else


def test_a_crashing_and_a_hanging_mcp_tool_leave_the_session_running(server: tuple[ServerProcess, Path]) -> None:
    srv, _ = server
    received, sent = _ask(srv, "Please crash the server right now.")
    assert received > 0.8 * sent
    assert srv.metric("kame_tool_calls_total", 'outcome="error",tool="crash"') >= 1
    received, sent = _ask(srv, "My computer is stuck again, can you help me?")
    assert received > 0.8 * sent
    assert srv.metric("kame_tool_calls_total", 'outcome="timeout",tool="hang"') >= 1
    # and the tool works again afterwards (the MCP server was started again after the crash)
    before = srv.metric("kame_tool_calls_total", 'outcome="ok",tool="get_weather"')
    received, sent = _ask(srv, "What is the weather like today?")
    assert received > 0.8 * sent
    assert srv.metric("kame_tool_calls_total", 'outcome="ok",tool="get_weather"') > before
