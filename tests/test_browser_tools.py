"""The browser page shows the back-end's tool calls in its answer pane (real headless Chromium).

The shared ``tools`` server (tests/support/servers.py): an operator-configured stdio MCP server
(written with the ``mcp`` SDK) and the scripted back-end, which calls its ``get_weather`` tool when it hears
"weather". Chromium's fake microphone asks "What is the weather like today?"; the page shows
the call (name, outcome, duration) in the card of the request that made it, and the answer
built on the result in the same pane.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, sync_playwright

from kame.audio.files import write_wav
from tests.support.browser import BASE_ARGS, CHROMIUM, DESKTOP, Console, summary, wait_until
from tests.support.moshi_client import ServerProcess
from tests.support.speech import silence, synthesize


@pytest.fixture(scope="module")
def server(tools_server: ServerProcess) -> ServerProcess:
    """The shared ``tools`` server (tests/support/servers.py): the scripted back-end calls the stdio MCP
    server's ``get_weather`` when it hears "weather"."""
    return tools_server


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
