"""The servers that several test files share: one configuration each, started once per run.

A test file that only talks to a server asks for one of these (``conftest.py`` has a session fixture
per entry of ``SHARED``, named ``<name>_server``) instead of starting its own: each start costs a
torch import, the tiny model and Whisper (5-8 s and as many core-seconds on the 2-core CI machine).
A test that changes a server's state (signals, drains, breakers, tight limits) starts its own.

On a shared server a test reads metric deltas, never absolute counters, and picks out its own
sessions (recordings, health) rather than "the first" or "all". Each starts once per run: in one
process (``TEST_WORKERS=0``), and under pytest-xdist (the test command's four workers) too, where the tests sharing a server
(transitively) all run on one worker (tests/support/scheduling.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.llm_server import LlmServer, RecordedRequest, Reply
from tests.support.moshi_client import ServerProcess, free_port
from tests.support.vllm_like_server import VllmLikeServer

#: The bearer token and the allowed browser origins of the ``secured`` server: a made-up site, and an
#: app's own page on loopback (tests/test_webrtc_browser.py serves it on ``APP_PORT``).
SECURED_TOKEN = "shared-secret-6b1d0e77c1"
GOOD_ORIGIN = "http://good.example"
APP_PORT = free_port()
APP_ORIGIN = f"http://127.0.0.1:{APP_PORT}"
#: The ``secured`` server's idle timeout: a session without audio for this long is ended.
SECURED_IDLE_S = 4
#: The ``secured`` server's WebRTC consent timeout: a vanished peer's call ends this long after it went.
SECURED_CONSENT_S = 12
#: The bearer token of the ``openai`` server.
OPENAI_TOKEN = "shared-openai-token-3f9a51"
#: The value the ``tools`` server hands its MCP server (``env_from``): it must reach the tool only.
TOOLS_SECRET = "mcp-chat-secret-91ab77c2e0"

#: A stdio MCP server (the ``mcp`` SDK) with a working, a crashing and a hanging tool.
WEATHER_MCP = textwrap.dedent('''
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


#: How each Whisper configuration here starts: the tiny model and Whisper on the CPU, ``frontend`` last
#: (a configuration may go on with more ``frontend`` keys).
WHISPER_CPU = """
device: cpu
asr:
  kind: whisper
  device: cpu
frontend:
  checkpoint: "tiny:0"
"""

#: Two scripted back-ends that say which of them answered (the ``browser`` and ``secured`` servers'):
#: a session's choice of back-end shows in the words of its reply.
ALPHA_BETA = """backends:
  alpha:
    kind: scripted
    description: Scripted replies (alpha).
    scripted:
      rules: {}
      default_reply: "Alpha thinks about {user}."
      first_token_delay_s: 0.1
  beta:
    kind: scripted
    description: Scripted replies (beta).
    scripted:
      rules: {}
      default_reply: "Beta answers {user} now."
      first_token_delay_s: 0.1
"""


@dataclass(frozen=True)
class SharedServer:
    """One shared configuration: its YAML (``{python}``, ``{mcp}`` and ``{record}`` filled in at start) or
    ``cpu-demo`` (the stock demo config), extra environment (``KAME_*`` settings), and whether its sessions
    are recorded (``ServerProcess.record_dir``)."""

    name: str
    config: str
    env: dict[str, str] = field(default_factory=dict)
    records: bool = False


#: Two scripted back-ends and one that is down, one session slot, sessions recorded: the browser page
#: (tests/test_browser.py), the page over WebRTC (test_webrtc_page.py) and a refused session retried by
#: ``kame eval duplex`` (test_eval_duplex_e2e.py). No token (the page has none), any origin.
BROWSER = SharedServer(
    "browser",
    WHISPER_CPU + "  batch_size: 1\n" + ALPHA_BETA + """  offline:
    kind: openai
    description: An OpenAI-compatible server that is not running.
    base_url: http://127.0.0.1:9/v1
    model: none
    api_key_env: ""
    max_retries: 0
default_backend: alpha
server:
  record_dir: "{record}"
""",
    records=True,
)

#: The scripted back-end calling a real stdio MCP server's tools (weather, crash, hang) when it hears
#: their keywords, sessions recorded: tests/test_chat_mcp.py and the page's tool pane
#: (test_browser_tools.py).
TOOLS = SharedServer(
    "tools",
    WHISPER_CPU + """backends:
  scripted:
    kind: scripted
    scripted:
      rules: {}
      default_reply: "I heard {user}."
      first_token_delay_s: 0.1
      tool_rules:
        - {keyword: weather, tool: get_weather, arguments: {city: Paris}, say_first: "Let me check.",
           answer: "The forecast says {result}."}
        - {keyword: crash, tool: crash, say_first: "", answer: "Done."}
        - {keyword: stuck, tool: hang, say_first: "", answer: "Done."}
tools:
  mcp_servers:
    weather:
      command: "{python}"
      args: ["{mcp}"]
      env_from: {WEATHER_KEY: KAME_TEST_WEATHER_KEY}
      tools: [get_weather, crash, hang]
      read_only: [get_weather, crash, hang]
      timeout_s: 1.5
      enabled: true
server:
  max_sessions: 2
  idle_timeout_s: 10
  record_dir: "{record}"
""",
    env={"KAME_TEST_WEATHER_KEY": TOOLS_SECRET},
    records=True,
)

#: A bearer token and an origin allow-list, two scripted back-ends, two session slots, a 4 s idle
#: timeout and a 3 s ICE connect timeout: the token and origin rules (tests/test_server_auth.py), the
#: Realtime API over the websocket (test_realtime_server.py), over WebRTC (test_webrtc_server.py) and
#: from an app's page in Chromium (test_webrtc_browser.py); the Live API over WebRTC (test_live_webrtc.py).
SECURED = SharedServer(
    "secured",
    WHISPER_CPU + "  batch_size: 2\n" + ALPHA_BETA + """default_backend: alpha
server:
  idle_timeout_s: {idle}
  webrtc_connect_timeout_s: 3
  webrtc_consent_timeout_s: {consent}
""".replace("{idle}", str(SECURED_IDLE_S)).replace("{consent}", str(SECURED_CONSENT_S)),
    env={"KAME_AUTH_TOKEN": SECURED_TOKEN, "KAME_SERVER__ALLOWED_ORIGINS": json.dumps([GOOD_ORIGIN, APP_ORIGIN])},
)

#: Real OpenAI-compatible HTTP servers on loopback behind every back-end (``{llm}``: tests/support/
#: llm_server.py serving tools-model and plain-model; ``{rt}``, ``{live}``: vLLM stand-ins that refuse
#: tools, ``{ok}``: one that accepts them; ``conftest.py``'s ``llm_standins``, each test file sets its
#: own responder), a token, two slots, WebRTC through a real TURN server only (tests/support/turn.py;
#: the relay-only policy binds every call, and no other file here makes one): client-executed functions
#: (tests/test_realtime_tools.py), client-driven turns (test_realtime_turns.py), Live's Responses
#: delegation (test_live_responses_server.py), a server refusing tools (test_tools_refused_server.py)
#: and a call relayed through coturn (test_webrtc_turn.py).
OPENAI = SharedServer(
    "openai",
    WHISPER_CPU + """backends:
  llm:
    base_url: "{llm}"
    model: tools-model
    api_key_env: ""
    allow_tools: true
    breaker: {enabled: false}
  notools:
    base_url: "{llm}"
    model: plain-model
    api_key_env: ""
    allow_tools: false
  rt:
    base_url: "{rt}"
    model: served-model
    api_key_env: ""
    breaker: {enabled: false}
  live:
    base_url: "{live}"
    model: served-model
    api_key_env: ""
  ok:
    base_url: "{ok}"
    model: served-model
    api_key_env: ""
default_backend: llm
tools:
  call_timeout_s: 8
server:
  max_sessions: 2
  idle_timeout_s: 15
  webrtc_ice_transport_policy: relay
  webrtc_ice_servers:
    - urls: "turn:127.0.0.1:{turn_port}?transport=udp"
      username: {turn_user}
      credential: {turn_password}
""",
    env={"KAME_AUTH_TOKEN": OPENAI_TOKEN},
)

@dataclass(frozen=True)
class LlmStandins:
    """The ``openai`` server's back-ends: real HTTP servers on loopback (``OPENAI``).
    A test file sets the responders it needs, after ``reset()``: what an earlier file left is not its."""

    llm: LlmServer
    rt: VllmLikeServer
    live: VllmLikeServer
    ok: VllmLikeServer


#: The stock CPU demo without ASR (no Whisper: the tests send noise and silence, not words) and with
#: low client limits (burst, buffer, flood, slow-client and idle timeouts) so that every abuse resolves
#: in seconds; eight slots: the abuse matrix on both websockets (tests/test_abuse.py) and the Moshi
#: protocol's sessions, refusals and malformed messages (test_server_chat.py).
LIMITS = SharedServer(
    "limits",
    "cpu-demo",
    env={
        "KAME_ASR__KIND": "none",
        "KAME_SERVER__IDLE_TIMEOUT_S": "4",
        "KAME_SERVER__SLOW_CLIENT_TIMEOUT_S": "2",
        "KAME_SERVER__INPUT_BURST_S": "1.0",
        "KAME_SERVER__INPUT_BUFFER_S": "1.0",
        "KAME_SERVER__FLOOD_CLOSE_S": "2.0",
        "KAME_SERVER__MAX_MESSAGE_BYTES": str(256 * 1024),
    },
)

#: The ``lifecycle`` server's slots and maximum session duration (warned 1 s before).
LIFECYCLE_SLOTS = 2
LIFECYCLE_MAX_S = 3
#: The stock CPU demo without ASR, two slots, a 1 s idle timeout, a 3 s maximum duration warned 1 s
#: before, a 30-tick warm-up (the ``starting`` phase is observable) and collections every 0.5 s: the
#: session lifecycle on the Moshi protocol (tests/test_server_lifecycle.py), on /v1/realtime
#: (test_realtime_lifecycle.py) and on the Live API (test_live_server.py). Their SIGTERM drains each
#: start a server of their own (a signal ends the process).
LIFECYCLE = SharedServer(
    "lifecycle",
    "cpu-demo",
    env={
        "KAME_ASR__KIND": "none",
        "KAME_FRONTEND__BATCH_SIZE": str(LIFECYCLE_SLOTS),
        "KAME_SERVER__IDLE_TIMEOUT_S": "1.0",
        "KAME_SERVER__MAX_DURATION_S": f"{LIFECYCLE_MAX_S}.0",
        "KAME_SERVER__DURATION_WARNING_S": "1.0",
        "KAME_SERVER__WARMUP_STEPS": "30",
        "KAME_SERVER__GC_INTERVAL_S": "0.5",
    },
)

SHARED = {s.name: s for s in (BROWSER, TOOLS, SECURED, OPENAI, LIMITS, LIFECYCLE)}


@contextlib.contextmanager
def responding(*servers: LlmServer, responder: Callable[[RecordedRequest], Reply | None] | None = None) -> Iterator[None]:
    """Shared LLM stand-ins (``LlmStandins``) for one test file: reset first (nothing an earlier file
    recorded or scripted is its), answering with ``responder`` (None: set later, per test), reset after."""
    for srv in servers:
        srv.reset()
        srv.responder = responder
    try:
        yield
    finally:
        for srv in servers:
            srv.reset()


def _fill(template: str, values: dict[str, str]) -> str:
    """``{key}`` placeholders only: the YAML's own braces (flow mappings, ``{user}``) stay as they are."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def start_shared(spec: SharedServer, cache_dir: Path, tmp: Path, values: dict[str, str] | None = None) -> ServerProcess:
    """Start ``spec`` in ``tmp`` (config, log, MCP script, recordings; ``values`` fill the config's other
    placeholders, e.g. back-end URLs) and wait until it is ready."""
    mcp = tmp / "weather_mcp.py"
    mcp.write_text(WEATHER_MCP)
    record = tmp / "recordings"
    config = spec.config
    if config != "cpu-demo":
        path = tmp / f"{spec.name}.yaml"
        path.write_text(_fill(config, {"python": sys.executable, "mcp": str(mcp), "record": str(record), **(values or {})}))
        config = str(path)
    srv = ServerProcess(cache_dir=cache_dir, log_path=tmp / "server.log", config=config, env=spec.env,
                        label=f"{spec.name} (shared)")
    srv.record_dir = record if spec.records else None
    return srv.start()


def recorded_sessions(record_dir: Path) -> set[Path]:
    """The session folders recorded so far: take this before a test's sessions, then ``new_sessions``."""
    return set(record_dir.iterdir()) if record_dir.exists() else set()


def new_sessions(record_dir: Path, before: set[Path]) -> list[Path]:
    """The session folders recorded since ``before``, oldest first."""
    return sorted(recorded_sessions(record_dir) - before)
