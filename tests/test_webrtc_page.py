"""kame's own page in real headless Chromium: WebRTC by default, the websocket by itself when ICE fails.

The page (server/static) POSTs its offer to /v1/realtime/calls, hears the assistant on the remote track and
reads events from ``oai-events``. Its fallback is checked with Chromium's own ICE agent allowed only relayed
candidates and given no TURN server (``iceTransportPolicy: "relay"``, injected before the page loads): what
a network that blocks UDP leaves, no candidate pair, so ICE never connects. The page hangs the call up (the
only slot is free at once, so the websocket gets it without a "server full" retry) and has the conversation
over the websocket.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from kame.audio.files import write_wav
from tests.support.moshi_client import ServerProcess
from tests.support.speech import silence, synthesize

CHROMIUM = "/usr/bin/chromium"
BASE_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
]
TRANSCRIPT = """() => window.kame.events.some((e) => e.type === 'conversation.item.input_audio_transcription.completed'
                                         && /capital|france/i.test(e.transcript))"""


@pytest.fixture(scope="module")
def server(browser_server: ServerProcess) -> ServerProcess:
    """The shared ``browser`` server (tests/support/servers.py): the scripted back-end alpha, one slot, no token."""
    return browser_server


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("page-audio") / "question.wav"
    write_wav(path, np.concatenate([silence(0.5), synthesize("What is the capital of France?"), silence(2.5)]))
    return path


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


def launch(playwright: Playwright, wav: Path, *extra: str) -> Browser:
    return playwright.chromium.launch(executable_path=CHROMIUM,
                                      args=[*BASE_ARGS, f"--use-file-for-fake-audio-capture={wav}", *extra])


# Websockets the page opens (they are not in the resource timeline).
COUNT_SOCKETS = """
window.__sockets = [];
const Native = window.WebSocket;
window.WebSocket = class extends Native { constructor(url, protocols) { super(url, protocols); window.__sockets.push(url); } };
"""


# A network where this browser may reach the server only through a TURN relay, and there is none (UDP
# blocked, as in many offices): Chromium's real ICE agent gathers no candidate and never connects.
RELAY_ONLY = """
const NativePc = window.RTCPeerConnection;
window.RTCPeerConnection = function (config) { return new NativePc({ ...(config || {}), iceTransportPolicy: "relay" }); };
window.RTCPeerConnection.prototype = NativePc.prototype;
"""


def kame(page: Page, expr: str) -> Any:
    return page.evaluate(f"(() => {{ const k = window.kame; return {expr}; }})()")


def summary(page: Page) -> dict[str, Any]:
    return kame(page, "({phase: k.phase, transport: k.transport, fallback: k.fallback, rtc: k.rtc, "
                      "notice: document.getElementById('notice').hidden ? null : document.getElementById('notice-text').textContent, "
                      "last: k.events.slice(-12).map((e) => e.type)})")


def wait_until(page: Page, js: str, timeout_s: float, what: str, dump: Callable[[], Any]) -> None:
    try:
        page.wait_for_function(js, timeout=timeout_s * 1000, polling=100)
    except Exception as exc:  # noqa: BLE001 - say what did not happen, with the page's view
        raise AssertionError(f"{what}: not within {timeout_s:g} s ({exc.__class__.__name__}); {dump()}") from None


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    _status, text = server.get("/metrics")
    want = "".join(f'(?=[^}}]*{k}="{re.escape(v)}")' for k, v in labels.items())
    total = 0.0
    for m in re.finditer(rf"^{name}(?:\{{{want}[^}}]*\}})? ([0-9.e+-]+)$", text, re.M):
        total += float(m.group(1))
    return total


def wait_metric(server: ServerProcess, value: float, name: str, timeout_s: float = 20, **labels: str) -> None:
    """The session's end is counted once its pipeline has closed (the ASR's last final), after its slot is free."""
    deadline = time.monotonic() + timeout_s
    while (got := metric(server, name, **labels)) != value:
        assert time.monotonic() < deadline, f"{name}{labels} = {got}, not {value}"
        time.sleep(0.1)


def wait_ready(server: ServerProcess, timeout_s: float) -> float:
    """Seconds until /ready says the only slot is free again."""
    t0 = time.monotonic()
    while server.get("/ready")[0] != 200:
        assert time.monotonic() - t0 < timeout_s, "the slot was not freed"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_page_talks_over_webrtc_by_default(server: ServerProcess, playwright: Playwright, question_wav: Path) -> None:
    answered = metric(server, "kame_webrtc_calls_total", result="answered")
    ended = metric(server, "kame_sessions_ended_total")
    browser = launch(playwright, question_wav, "--allow-loopback-in-peer-connection")
    try:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(COUNT_SOCKETS)
        page.goto(server.http_url + "/")
        assert kame(page, "k.transport") == "webrtc"
        page.click("#connect")
        wait_until(page, "() => window.kame.phase === 'live'", 20, "session.created on oai-events", lambda: summary(page))
        assert kame(page, "[k.transport, k.fallback]") == ["webrtc", None]
        wait_until(page, TRANSCRIPT, 60, "the question's transcript", lambda: summary(page))
        wait_until(page, "() => window.kame.events.some((e) => e.type === 'output_audio_buffer.stopped')", 30,
                   "a response's audio over RTP (output_audio_buffer.stopped)", lambda: summary(page))
        # the assistant's voice reached Chromium's own receiver, and the page reads its statistics
        wait_until(page, "() => (window.kame.rtc?.inbound?.totalAudioEnergy ?? 0) > 0", 10,
                   "audio energy on the remote track", lambda: summary(page))
        rtc = kame(page, "k.rtc")
        assert rtc["inbound"]["packetsReceived"] > 50, rtc
        assert page.inner_text("#m-rtt") != "–" and page.inner_text("#m-buffer").endswith("ms")
        assert page.inner_text("#m-reply") != "–"  # reply delay, from output_audio_buffer.started
        wait_until(page, "() => /Alpha thinks/.test(document.getElementById('oracle-log').innerText)", 45,
                   "the oracle's text (kame.* events on oai-events)", lambda: summary(page))
        # push to talk, released: the track is muted, the server hears silence (the fake microphone goes on
        # saying its question every 5 s); held (the space bar): the microphone again
        page.click("label[for=mode-ptt]")
        time.sleep(2.5)  # turns already heard may still be reported
        started = "window.kame.events.filter((e) => e.type === 'input_audio_buffer.speech_started').length"
        before = page.evaluate(started)
        time.sleep(8)
        assert page.evaluate(started) == before, "speech heard while push to talk was released"
        page.keyboard.down("Space")
        wait_until(page, f"() => {started} > {before}", 15, "speech while the space bar is held", lambda: summary(page))
        page.keyboard.up("Space")
        # no websocket was opened: the call was the conversation
        assert page.evaluate("window.__sockets") == []
        assert metric(server, "kame_webrtc_calls_total", result="answered") == answered + 1
        page.click("#connect")  # hang up
        wait_until(page, "() => window.kame.phase === 'idle'", 5, "disconnected", lambda: summary(page))
        freed = wait_ready(server, 10)
        # (the hangup, or the peer connection's close reaching the server first)
        wait_metric(server, ended + 1, "kame_sessions_ended_total")
        assert freed < 5, freed
        assert not errors, errors
    finally:
        browser.close()


def test_page_falls_back_to_the_websocket_when_ice_fails(
    server: ServerProcess, playwright: Playwright, question_wav: Path
) -> None:
    wait_ready(server, 30)
    answered = metric(server, "kame_webrtc_calls_total", result="answered")
    hangups = metric(server, "kame_sessions_ended_total", reason="hangup")
    browser = launch(playwright, question_wav, "--allow-loopback-in-peer-connection")
    try:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(COUNT_SOCKETS)
        page.add_init_script(RELAY_ONLY)
        page.goto(server.http_url + "/")
        assert kame(page, "k.transport") == "webrtc"
        t0 = time.monotonic()
        page.click("#connect")
        wait_until(page, "() => window.kame.phase === 'live'", 40, "live over the websocket", lambda: summary(page))
        fell_back_s = time.monotonic() - t0
        state = summary(page)
        assert state["transport"] == "websocket" and re.search(r"ICE", state["fallback"] or ""), state
        assert state["notice"] is None, state  # no "server full": the call was hung up, its slot freed at once
        # the call was answered (the offer reached kame), then hung up by the page when ICE did not connect
        assert metric(server, "kame_webrtc_calls_total", result="answered") == answered + 1
        wait_metric(server, hangups + 1, "kame_sessions_ended_total", reason="hangup")
        assert fell_back_s < 25, fell_back_s  # the page's 10 s ICE limit, not the server's 30 s one
        wait_until(page, TRANSCRIPT, 60, "the question's transcript over the websocket", lambda: summary(page))
        wait_until(page, "() => window.kame.counters.responseFrames > 0", 30, "response audio over the websocket",
                   lambda: summary(page))
        assert len(page.evaluate("window.__sockets")) == 1
        # a later connection goes straight to the websocket
        page.click("#connect")
        wait_until(page, "() => window.kame.phase === 'idle'", 5, "disconnected", lambda: summary(page))
        wait_ready(server, 10)
        page.click("#connect")
        wait_until(page, "() => window.kame.phase === 'live'", 20, "live again", lambda: summary(page))
        assert metric(server, "kame_webrtc_calls_total", result="answered") == answered + 1  # no new offer
        assert len(page.evaluate("window.__sockets")) == 2
        page.click("#connect")
        assert not errors, errors
    finally:
        browser.close()
