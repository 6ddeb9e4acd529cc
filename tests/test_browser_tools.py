"""The browser page shows the back-end's tool calls in its answer pane (real headless Chromium).

The CPU demo server with an operator-configured stdio MCP server (written here with the
``mcp`` SDK) and the scripted back-end, which calls its ``get_weather`` tool when it hears
"weather". Chromium's fake microphone asks "What is the weather like today?"; the page shows
the call (name, outcome, duration) in the card of the request that made it, and the answer
built on the result in the same pane.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, sync_playwright

from kame.audio import write_wav
from tests.support.browser import BASE_ARGS, CHROMIUM, DESKTOP, Console, summary, wait_until
from tests.support.moshi_client import ServerProcess
from tests.support.speech import silence, synthesize

MCP_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("weather")

    @app.tool()
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return f"sunny and warm in {city}"

    if __name__ == "__main__":
        app.run()
''')

CONFIG = """
device: cpu
frontend:
  checkpoint: "tiny:0"
  batch_size: 1
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
tools:
  mcp_servers:
    weather: {{command: {python}, args: [{script}], tools: [get_weather], read_only: [get_weather], enabled: true}}
"""


@pytest.fixture(scope="module")
def server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("browser-tools")
    script = tmp / "weather_mcp.py"
    script.write_text(MCP_SERVER)
    config = tmp / "tools.yaml"
    config.write_text(CONFIG.format(python=sys.executable, script=script))
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp / "server.log", config=str(config)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("browser-tools-audio") / "question.wav"
    write_wav(wav, np.concatenate([silence(0.5), synthesize("What is the weather like today?"), silence(3.0)]))
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            *BASE_ARGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}",
        ])
        yield b
        b.close()


def test_tool_calls_show_in_the_answer_pane(server: ServerProcess, browser: Browser, artifacts_dir: Path) -> None:
    console = Console()
    ctx = browser.new_context(viewport=DESKTOP)
    try:
        page = console.watch(ctx.new_page(), "tools")
        page.goto(server.http_url + "/")
        page.wait_for_function("() => document.querySelectorAll('#backend option').length === 1", timeout=15000)
        dump = lambda: summary(page)  # noqa: E731
        page.click("#connect")
        wait_until(page, "() => window.kame.phase === 'live'", 20, "session.created", dump)
        wait_until(page, "() => document.querySelector('#oracle-log .answer .tools .tool') !== null", 45,
                   "a tool call in the answer pane", dump)
        wait_until(page, """() => [...document.querySelectorAll('#oracle-log .answer .tool')].some((li) =>
                   li.querySelector('.name').textContent === 'get_weather' && /^ok in /.test(li.querySelector('.state').textContent))""",
                   20, "the call finished ok", dump)
        wait_until(page, "() => /The forecast says sunny and warm in Paris/.test(document.getElementById('oracle-log').innerText)",
                   20, "the answer built on the result", dump)
        card = page.locator("#oracle-log .answer", has=page.locator(".tool")).first
        assert "get_weather" in card.inner_text()
        page.screenshot(path=str(artifacts_dir / "browser-tools.png"))
        assert console.errors == [], console.errors
    finally:
        ctx.close()
