"""Server-side MCP tools for a Moshi-protocol session (/api/chat) on the real CPU demo server.

A real stdio MCP server written with the ``mcp`` SDK (the shared ``tools`` server, tests/support/servers.py) is configured by the operator
(server-wide, with an allow-list, read-only tools, a timeout and an environment key); the
scripted back-end calls its tools when it hears the keyword. A question spoken with espeak
gets the tool's answer into Moshi's oracle (seen in the session's recording); a tool that
crashes the MCP server and one that hangs fail their calls (metrics), and the session keeps
streaming audio to its end; the key never shows in the logs or the recording.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.moshi_client import ServerProcess, run_session
from tests.support.servers import TOOLS_SECRET, new_sessions, recorded_sessions
from tests.support.speech import silence, synthesize

SECRET = TOOLS_SECRET


@pytest.fixture(scope="module")
def server(tools_server: ServerProcess) -> Iterator[tuple[ServerProcess, Path]]:
    """The shared ``tools`` server (tests/support/servers.py: the scripted back-end and a stdio MCP server
    with get_weather, crash and hang; ``WEATHER_KEY`` from the environment; sessions recorded)."""
    assert tools_server.record_dir is not None
    yield tools_server, tools_server.record_dir
    assert SECRET not in tools_server.logs()


def _events(record: Path, before: set[Path], sessions: int) -> list[dict]:
    """Events of the sessions recorded since ``before``, once the recorder has written the last one's end."""
    deadline = time.monotonic() + 10
    while True:
        out: list[dict] = []
        for folder in new_sessions(record, before):
            path = folder / "events.jsonl"
            if path.exists():
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
    before = recorded_sessions(record)
    received, sent = _ask(srv, "What is the weather like today?")
    assert received > 0.8 * sent  # the session streamed all along
    assert srv.metric("kame_tool_calls_total", 'outcome="ok",tool="get_weather"') >= 1
    events = _events(record, before, 1)
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
