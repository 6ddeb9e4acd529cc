"""The xdist grouping (tests/support/scheduling.py): the tests sharing a server, even through a third
test, travel together; files without one stay alone; every shared server of conftest.py is seen."""

from __future__ import annotations

import ast
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.scheduling import marked_tests, scope_of_tests, server_fixtures, server_groups, servers_by_test
from tests.support.servers import SHARED

TESTS = Path(__file__).resolve().parent


def test_files_sharing_a_server_even_transitively_form_one_group() -> None:
    groups = server_groups({
        "test_a.py": frozenset({"x_server"}),
        "test_b.py": frozenset({"x_server", "y_server"}),
        "test_c.py": frozenset({"y_server"}),
        "test_d.py": frozenset({"z_server"}),
        "test_e.py": frozenset(),
    })
    assert groups == {
        "test_a.py": "x_server+y_server",
        "test_b.py": "x_server+y_server",
        "test_c.py": "x_server+y_server",
        "test_d.py": "z_server",
    }


def test_a_fixture_is_found_as_an_argument_or_by_name_but_not_inside_another_word() -> None:
    pattern = server_fixtures(["demo", "browser"])
    source = "def test_x(demo_server):\n    request.getfixturevalue('browser_server')\n    my_demo_server_url = 1\n"
    assert servers_by_test(source, pattern).of("test_x") == frozenset({"demo_server", "browser_server"})
    assert servers_by_test("def test_y(nondemo_server): ...", pattern).of("test_y") == frozenset()


def test_every_session_server_fixture_of_conftest_is_grouped() -> None:
    """A new shared server must be in ``SHARED`` (or be ``demo``), or its files would each start it."""
    tree = ast.parse((TESTS / "conftest.py").read_text())
    defined = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Name) and t.id.endswith("_server")}
    defined |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                and node.name.endswith("_server") and node.name != "llm_server"}  # llm_server: one per test
    assert defined == {f"{name}_server" for name in [*SHARED, "demo"]}


def test_the_real_tree_groups_tests_by_the_server_each_asks_for() -> None:
    """A file whose tests use two servers, each test one, no longer ties those servers' groups together
    (test_eval_duplex_e2e.py: the CPU demo for most, the browser server for one)."""
    scope = scope_of_tests(TESTS, [*SHARED, "demo"])
    duplex = "tests/eval_e2e/test_eval_duplex_e2e.py"
    evals = "tests/eval_e2e/test_eval_e2e.py"
    assert scope(f"{duplex}::test_smoke_chat_turn_taking") == scope(f"{evals}::test_eval_records_judges_and_summarizes")
    assert scope(f"{duplex}::test_refused_session_is_retried") == scope("tests/test_browser.py::test_voice_conversation_in_chromium")
    assert scope(f"{duplex}::test_smoke_chat_turn_taking") == "servers:demo_server"
    assert scope(f"{duplex}::test_refused_session_is_retried") == "servers:browser_server"
    assert scope(f"{duplex}::test_generated_set_is_reproducible") == duplex  # asks for no shared server
    assert scope("tests/test_engine.py::test_fifo_reset_queues_start_with_first_word_and_bounds") == "tests/test_engine.py"
    assert scope("tests/test_live_server.py::test_audio_formats_both_ways[pcm16k]") == "servers:secured_server"


def test_a_test_asks_through_its_files_fixtures_and_autouse_ones() -> None:
    pattern = server_fixtures(["demo", "browser", "secured"])
    source = textwrap.dedent('''
        import pytest

        @pytest.fixture
        def server(demo_server):
            return demo_server

        @pytest.fixture
        def client(server, tmp_path):
            return server

        @pytest.fixture(autouse=True)
        def _quiet(monkeypatch):
            pass

        def helper(request):
            return request.getfixturevalue("secured_server")

        def test_a(client): ...

        def test_b(browser_server, tmp_path): ...

        def test_c(request):
            request.getfixturevalue("browser_server")
            text = "demo_server"

        class TestD:
            def test_e(self, server): ...
    ''')
    found = servers_by_test(source, pattern)
    assert found.whole == {"secured_server"}  # a helper's: every test gets it
    assert found.of("test_a") == {"demo_server", "secured_server"}
    assert found.of("test_b") == found.of("test_c") == {"browser_server", "secured_server"}
    assert found.of("TestD::test_e") == {"demo_server", "secured_server"}


_SUITE_CONFTEST = '''
import json, os, time
from pathlib import Path

import pytest

import pytest

from tests.support.scheduling import scope_of_tests

LOG = Path(__file__).parent / "log.jsonl"


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: timing under its own load")


def pytest_xdist_make_scheduler(config, log):
    from tests.support.xdist_alone import AloneLastScheduling

    return AloneLastScheduling(config, log, scope_of_tests(Path(__file__).parent, ["shared"], "alone"))


def record(name, start):
    with LOG.open("a") as f:
        f.write(json.dumps({"name": name, "pid": os.getpid(), "start": start, "end": time.time()}) + "\\n")


@pytest.fixture(scope="session")
def shared_server():
    record("shared_server started", time.time())
    return "server"


@pytest.fixture
def timed(request):
    t0 = time.time()
    yield
    record(request.node.name, t0)
'''

_SUITE = {
    "test_a.py": '''
import time
import pytest

def test_a1(shared_server, timed):
    time.sleep(0.5)

@pytest.mark.alone
def test_a_alone(shared_server, timed):
    time.sleep(0.2)
''',
    "test_b.py": "import time\n" + "".join(f"\ndef test_b{i}(timed):\n    time.sleep(0.4)\n" for i in range(5)),
    "test_c.py": '''
import time
import pytest

pytestmark = pytest.mark.alone

def test_c_alone(timed):
    time.sleep(0.2)
''',
}


def _run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str, suite: dict[str, str], *,
               workers: int, passed: int) -> list[dict[str, Any]]:
    """Run ``suite`` under ``conftest`` in a real xdist run of ``workers``; the tests' log lines."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS.parent))
    pytester.makeconftest(conftest)
    for name, source in suite.items():
        pytester.makepyfile(**{name[:-3]: source})
    result = pytester.runpytest_subprocess("-n", str(workers), "-p", "xdist", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=passed)
    return [json.loads(line) for line in (pytester.path / "log.jsonl").read_text().splitlines()]


def test_alone_tests_run_last_on_the_worker_that_has_their_server(pytester: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A real two-worker xdist run of a small suite: the ``alone`` tests start only after every other
    test ended, one after another on one worker, the one whose shared server is already up (started once)."""
    log = _run_suite(pytester, monkeypatch, _SUITE_CONFTEST, _SUITE, workers=2, passed=8)
    by_name = {e["name"]: e for e in log}
    alone = sorted((by_name["test_a_alone"], by_name["test_c_alone"]), key=lambda e: e["start"])
    others = [e for e in log if e["name"].startswith("test_") and "alone" not in e["name"]]
    assert len(others) == 6 and len({e["pid"] for e in others}) == 2  # both workers had work
    assert alone[0]["start"] >= max(e["end"] for e in others), log
    assert alone[1]["start"] >= alone[0]["end"]
    assert [e["name"] for e in log].count("shared_server started") == 1, log
    assert by_name["test_a_alone"]["pid"] == by_name["test_c_alone"]["pid"] == by_name["test_a1"]["pid"]


def test_alone_marks_are_read_from_the_tree() -> None:
    source = "import pytest\n@pytest.mark.alone\ndef test_x(): ...\ndef test_y(): ...\n" \
             "@pytest.mark.alone\nclass TestZ:\n    def test_w(self): ...\n"
    assert marked_tests(source, "alone") == {"test_x", "TestZ::test_w"}
    assert marked_tests("import pytest\npytestmark = [pytest.mark.alone]\ndef test_v(): ...\n", "alone") == {"test_v"}
    assert marked_tests(source, "slow") == frozenset()


_LANES_CONFTEST = '''
import json, os, time
from pathlib import Path

import pytest

from tests.support.scheduling import nice_if_batch_worker, scope_of_tests

LOG = Path(__file__).parent / "log.jsonl"


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: timing under its own load")
    config.addinivalue_line("markers", "realtime: holds the wall clock")
    nice_if_batch_worker(config, 1, 5)


def pytest_xdist_make_scheduler(config, log):
    from tests.support.xdist_alone import AloneLastScheduling

    return AloneLastScheduling(config, log, scope_of_tests(Path(__file__).parent, ["shared"], "alone", "realtime"), 1)


@pytest.fixture(scope="session")
def shared_server():
    return "server"


@pytest.fixture
def timed(request):
    t0 = time.time()
    yield
    with LOG.open("a") as f:
        f.write(json.dumps({"name": request.node.name, "pid": os.getpid(), "nice": os.nice(0), "start": t0,
                            "end": time.time()}) + "\\n")
'''

_LANES_SUITE = {
    "test_s.py": "import time\n" + "".join(f"\ndef test_s{i}(shared_server, timed):\n    time.sleep(0.3)\n" for i in range(3)),
    "test_r.py": "import time\nimport pytest\n\npytestmark = pytest.mark.realtime\n"
                 + "".join(f"\ndef test_r{i}(timed):\n    time.sleep(0.3)\n" for i in range(2)),
    "test_alone.py": "import time\nimport pytest\n\n@pytest.mark.alone\ndef test_alone(timed):\n    time.sleep(0.1)\n",
    **{f"test_b{k}.py": "import time\n" + "".join(f"\ndef test_b{k}_{i}(timed):\n    time.sleep(0.2)\n" for i in range(2))
       for k in range(4)},
}


def test_real_time_units_run_on_the_real_time_workers_and_batch_ones_niced(pytester: pytest.Pytester,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A real three-worker xdist run with one real-time worker: the shared server's tests, those marked
    ``realtime`` and the ``alone`` one all run on it at the normal priority, never on a niced batch worker;
    the batch workers run only batch files, niced, and the real-time worker helps with them once its lane
    is empty."""
    log = _run_suite(pytester, monkeypatch, _LANES_CONFTEST, _LANES_SUITE, workers=3, passed=14)
    timed = [e for e in log if e["name"].startswith(("test_s", "test_r", "test_alone"))]
    batch = [e for e in log if e["name"].startswith("test_b")]
    base = os.nice(0)  # this run's own priority (a batch worker of the suite runs this test niced)
    realtime_pid = {e["pid"] for e in timed}
    assert len(realtime_pid) == 1 and {e["nice"] for e in timed} == {base}, timed
    niced = [e for e in batch if e["pid"] not in realtime_pid]
    assert niced and {e["nice"] for e in niced} == {base + 5}, batch  # batch workers are niced, and had work
    assert len({e["pid"] for e in niced}) == 2
    alone = next(e for e in log if e["name"] == "test_alone")
    assert alone["start"] >= max(e["end"] for e in log if e is not alone)
