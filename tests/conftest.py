"""Shared test set-up: no torch.compile, a per-run cache dir, an artifacts dir, shared servers, and a count
of the server processes a run starts.

Helpers live in the support package (tests/support/, imported as ``tests.support.X``); no test file imports
another test file (tests/test_suite_layout.py checks it).

Shared fixtures
- ``kame_cache_dir``, ``artifacts_dir``, ``tiny_kame_ckpt``, ``tiny_moshi_ckpt``: as before, once per run.
- ``llm_server``: a fresh scriptable OpenAI-compatible server per test (tests/support/llm_server.py).
- ``encode``: a real SentencePiece tokenizer (the tiny checkpoints' recipe), once per run.
- ``demo_server``: the stock ``kame serve --config cpu-demo`` (tiny model, Whisper tiny.en, the scripted
  back-end, 8 slots, no token), started once per run in its own process. Use it for any test that only
  talks to the server; do not change its state (no signals, no drains, no limits): such a test starts its
  own ``ServerProcess`` (or a module fixture) instead.
- ``browser_server``, ``tools_server``, ``secured_server``, ``openai_server``,
  ``limits_server``, ``lifecycle_server``: the configurations several
  files share (tests/support/servers.py says which and why), once per run each, under the same rules;
  ``llm_standins``: the ``openai`` server's back-ends (real HTTP servers on loopback), once per run.

Metrics on a shared server: read deltas, never absolute counters, e.g.
``before = demo_server.metric("kame_sessions_total"); ...; assert demo_server.metric(...) - before == 1``.

Server processes: every ``ServerProcess.start()`` is recorded; the terminal summary lists them. A run may
start at most ``MAX_SERVERS`` of them, not counting those started by tests marked
``@pytest.mark.server_process_subject`` (tests whose subject is the process itself: signals, environment
variables, HAProxy replicas, the CLI), which the summary names. Going over the limit is flagged ``EXCEEDED``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import gc_pauses, lineless, moshi_client
from tests.support.llm_server import LlmServer, running_llm_server
from tests.support.scheduling import nice_if_batch_worker, scope_of_tests
from tests.support.servers import (
    BROWSER,
    LIFECYCLE,
    LIMITS,
    OPENAI,
    SECURED,
    SHARED,
    TOOLS,
    LlmStandins,
    SharedServer,
    start_shared,
)
from tests.support.turn import TURN_PASSWORD, TURN_USER, Turn, running_coturn
from tests.support.vllm_like_server import running_vllm_like_server

os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One thread per numeric library in this process and every process it starts (servers, ``kame mic``): up to
# seven servers and four workers share two cores, and OpenBLAS's, libgomp's and torch's idle threads
# spin-wait for work. Measured on the 2-core machine, two speaking sessions of 20 s on the CPU demo: server
# 29-30 core-s with the defaults, 25 with OMP_NUM_THREADS=1, 18-20 with it and one Whisper thread
# (tests/support/moshi_client.py), with frame lateness p99 52 ms instead of 91-106 ms.
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: Server processes a full run may start beyond those of ``server_process_subject`` tests.
MAX_SERVERS = 8
SUBJECT = "server_process_subject"
#: Tests whose assertion is timing under a load they make themselves (another worker's load would blur
#: it): under xdist they run last, on one worker, once the others have finished (tests/support/xdist_alone.py).
ALONE = "alone"
#: Tests that start their own server (or a process that runs one) or assert the wall clock without a shared
#: server: under xdist they run on a real-time worker (tests/support/xdist_alone.py says why).
REALTIME = "realtime"
#: The workers of the real-time lane under xdist (the others run the batch units, niced): two cores hold two
#: real-time loads of the CPU demo.
REALTIME_WORKERS = int(os.environ.get("PYTEST_KAME_REALTIME_WORKERS", "2"))
#: How much lower the batch workers' priority is (``nice``): they take the CPU the real-time lane leaves.
BATCH_NICE = 10
_STARTS_KEY = "kame_server_starts"
#: The files that take longest (a run's ``--durations``), collected first. Order only, and only for a run
#: of one process: under xdist the units go largest (most tests) first, xdist's own order, which measured
#: better than this one (2026-12-03, -n 3: 395 and 454 s against 485 s, with fewer real-time failures).
SLOW_FIRST = (
    "test_eval_duplex_e2e.py", "test_eval_e2e.py", "test_live_server.py", "test_haproxy.py", "test_webrtc_page.py",
    "test_browser.py", "test_run_cli.py", "test_live_responses_server.py", "test_chat_mcp.py",
    "test_tools_refused_server.py", "test_server_lifecycle.py", "test_oracle_loop.py", "test_eval_session.py",
    "test_mcp_tools.py", "test_server_chat.py", "test_realtime_tools.py", "test_webrtc_server.py",
    "test_realtime_turns.py", "test_realtime_server.py",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{ALONE}: the test asserts timing under a load it makes itself; under xdist it runs "
        "last, on one worker, with nothing else running"
    )
    config.addinivalue_line(
        "markers", f"{REALTIME}: the test starts its own server or asserts the wall clock; under xdist it runs on a "
        "real-time worker, never on a niced batch worker"
    )
    batch_worker = nice_if_batch_worker(config, REALTIME_WORKERS, BATCH_NICE)
    if batch_worker:
        os.environ[moshi_client.BATCH_LANE_ENV] = batch_worker
    config.addinivalue_line(
        "markers", f"{SUBJECT}: the test's subject is the server process itself (signals, environment, replicas, CLI); "
        "the servers it starts are not counted against the limit of shared and own servers"
    )


def pytest_collection(session: pytest.Session) -> None:
    gc_pauses.collection_started()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Full garbage collections between tests, not during one (tests/support/gc_pauses.py says why)."""
    gc_pauses.collection_finished()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        gc_pauses.test_finished()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist, the tests that share a server run on one worker (tests/support/scheduling.py),
    so that each shared server starts once per run; the other files go one at a time to a free worker;
    the tests marked ``alone`` run last, on one worker, with nothing else running (tests/support/xdist_alone.py)."""
    from tests.support.xdist_alone import AloneLastScheduling

    return AloneLastScheduling(config, log, scope_of_tests(Path(__file__).parent, [*SHARED, "demo"], ALONE, REALTIME),
                               REALTIME_WORKERS)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests stay in order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _requester(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _requester(item):
        return (yield)


class _requester:
    """Who starts a server: a module or session fixture is charged to the test that first needs it."""

    def __init__(self, item: pytest.Item) -> None:
        subject = item.get_closest_marker(SUBJECT) is not None
        self.name = ("subject " if subject else "") + item.nodeid

    def __enter__(self) -> None:
        moshi_client.CURRENT_REQUESTER.append(self.name)

    def __exit__(self, *exc: object) -> None:
        moshi_client.CURRENT_REQUESTER.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A traceback entry without a line number (tests/support/lineless.py) would end the session in an
    INTERNALERROR that hides the failure: the entry gets the nearest line, the report names the frame."""
    mended: list[str] = []
    if call.excinfo is not None:
        mended = lineless.lineless_frames(call.excinfo.value)
        if mended and lineless.fill_lines(call.excinfo.value):
            call.excinfo = pytest.ExceptionInfo.from_exception(call.excinfo.value)
    report = yield
    if mended:
        report.sections.append(("frames without a line number", "\n".join(mended)))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A pytest-xdist worker hands its server starts to the controller (``workeroutput``)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_STARTS_KEY] = json.dumps([dataclasses.asdict(s) for s in moshi_client.SERVER_STARTS])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controller of a pytest-xdist run collects each worker's server starts."""
    data = getattr(node, "workeroutput", {}).get(_STARTS_KEY)
    if data:
        moshi_client.SERVER_STARTS.extend(moshi_client.ServerStart(**s) for s in json.loads(data))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    starts = list(moshi_client.SERVER_STARTS)
    counted = [s for s in starts if not s.requested_by.startswith("subject ")]
    subject = [s for s in starts if s.requested_by.startswith("subject ")]
    tr = terminalreporter
    tr.section("server processes")
    for s in counted:
        tr.write_line(f"  {s.label:<24} ready in {s.seconds:5.1f} s  first for {s.requested_by}")
    for s in subject:
        tr.write_line(f"  {s.label:<24} ready in {s.seconds:5.1f} s  process subject: {s.requested_by[len('subject '):]}")
    over = len(counted) > MAX_SERVERS
    tr.write_line(
        f"server processes: {len(counted)} shared or own (limit {MAX_SERVERS}{', EXCEEDED' if over else ''}) "
        f"+ {len(subject)} by tests whose subject is the process; "
        f"{sum(s.seconds for s in starts if s.seconds == s.seconds):.0f} s starting them"
    )


@pytest.fixture(scope="session")
def kame_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory shared by the whole run (tiny checkpoints live here)."""
    path = Path(os.environ.get("PYTEST_KAME_CACHE_DIR") or tmp_path_factory.mktemp("kame-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests leave files for people to look at (screenshots, wavs)."""
    path = Path(os.environ.get("PYTEST_KAME_ARTIFACTS") or (Path(__file__).resolve().parent.parent / "artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_kame_ckpt(kame_cache_dir: Path) -> Path:
    """A tiny KAME-format checkpoint (with oracle_emb), made once per run."""
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0)


@pytest.fixture(scope="session")
def tiny_moshi_ckpt(kame_cache_dir: Path) -> Path:
    """A tiny plain-Moshi checkpoint (no oracle_emb)."""
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0, with_oracle=False)


@pytest.fixture(scope="session")
def tiny_personaplex_ckpt(kame_cache_dir: Path) -> Path:
    """A tiny checkpoint in PersonaPlex's layout with two voices (tests/support/personaplex_tiny.py)."""
    from tests.support.personaplex_tiny import ensure_tiny_personaplex

    return ensure_tiny_personaplex(kame_cache_dir)


@pytest.fixture
def llm_server() -> Iterator[LlmServer]:
    """A fresh scriptable OpenAI-compatible server on 127.0.0.1 (``.base_url`` ends in ``/v1``)."""
    with running_llm_server() as server:
        yield server


@pytest.fixture(scope="session")
def encode(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A real SentencePiece model (the tiny checkpoints' tokenizer recipe): text -> token ids."""
    import sentencepiece as spm

    from kame.frontend.tiny import train_tokenizer

    path: Path = tmp_path_factory.mktemp("sp") / "tok.model"
    train_tokenizer(path, vocab_size=400)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return lambda text: list(sp.encode(text, out_type=int))


def _shared(spec: SharedServer, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory,
            values: dict[str, str] | None = None) -> Iterator[moshi_client.ServerProcess]:
    srv = start_shared(spec, cache_dir, tmp_path_factory.mktemp(f"{spec.name}-server"), values)
    yield srv
    srv.stop()


def _shared_fixture(spec: SharedServer, doc: str) -> Any:
    """The session fixture ``<name>_server`` of one shared configuration (the ``openai`` one needs more)."""

    def fixture(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[moshi_client.ServerProcess]:
        yield from _shared(spec, kame_cache_dir, tmp_path_factory)

    fixture.__doc__ = f"tests/support/servers.py ``{spec.name.upper()}``: {doc}"
    return pytest.fixture(scope="session", name=f"{spec.name}_server")(fixture)


browser_server = _shared_fixture(BROWSER, "the page, no token, one slot, sessions recorded.")
tools_server = _shared_fixture(TOOLS, "the scripted back-end with a stdio MCP server's tools.")
limits_server = _shared_fixture(LIMITS, "the CPU demo without ASR, low client limits, eight slots.")
lifecycle_server = _shared_fixture(LIFECYCLE, "no ASR, two slots, 1 s idle, 3 s maximum duration.")
secured_server = _shared_fixture(SECURED, "a token, an origin allow-list, two slots, a 4 s idle timeout.")


@pytest.fixture(scope="session")
def llm_standins() -> Iterator[LlmStandins]:
    with running_llm_server(["tools-model", "plain-model"]) as llm, \
            running_vllm_like_server(["served-model"]) as rt, running_vllm_like_server(["served-model"]) as live, \
            running_vllm_like_server(["served-model"], refuse_tools=False) as ok:
        yield LlmStandins(llm, rt, live, ok)


@pytest.fixture(scope="session")
def coturn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Turn]:
    """A real TURN server on loopback (tests/support/turn.py), once per run: the ``openai`` server's relay."""
    with running_coturn(tmp_path_factory.mktemp("coturn")) as turn:
        yield turn


@pytest.fixture(scope="session")
def openai_server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory, llm_standins: LlmStandins,
                  coturn: Turn) -> Iterator[moshi_client.ServerProcess]:
    """tests/support/servers.py ``OPENAI``: OpenAI-compatible back-ends on loopback, a token, two slots,
    WebRTC relayed through ``coturn`` only."""
    values = {name: getattr(llm_standins, name).base_url for name in ("llm", "rt", "live", "ok")}
    values |= {"turn_port": str(coturn.port), "turn_user": TURN_USER, "turn_password": TURN_PASSWORD}
    yield from _shared(OPENAI, kame_cache_dir, tmp_path_factory, values)


@pytest.fixture(scope="session")
def demo_server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[moshi_client.ServerProcess]:
    """The stock CPU demo (``--config cpu-demo``), one process for the whole run; see the module docstring."""
    log = tmp_path_factory.mktemp("demo-server") / "server.log"
    srv = moshi_client.ServerProcess(cache_dir=kame_cache_dir, log_path=log, label="cpu-demo (shared)").start()
    yield srv
    srv.stop()
