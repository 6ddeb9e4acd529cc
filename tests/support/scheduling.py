"""Which tests must run on the same pytest-xdist worker: those that share a server.

A shared server (tests/support/servers.py, ``demo_server``) starts once per worker that asks for it, and
a run may start at most ``conftest.MAX_SERVERS`` of them. Under ``--dist loadfile`` two workers would
each start most of them. So the tests that ask for the same shared server, and, transitively, those
that ask for a server one of them also asks for, form one group (a connected component): the whole
group goes to one worker, which starts its servers once. Tests that ask for no shared server stay in
one unit per file and fill the gaps on whichever worker is free.

The unit is the test, not the file: a file whose tests each use one of two servers (most of
test_eval_duplex_e2e.py the CPU demo, one test the browser server) would otherwise tie both servers'
groups into one worker's queue, the longest of the run.

A test asks for a server through its arguments, its file's fixtures (transitively, and the autouse
ones) or ``request.getfixturevalue("x_server")``; all read from the file's syntax tree, which is what
the xdist controller can do: it collects nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path


def server_fixtures(names: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching the fixture names of the shared servers ``names`` (``<name>_server``)."""
    alternatives = "|".join(sorted(re.escape(n) for n in names))
    return re.compile(rf"\b(?:{alternatives})_server\b")


def server_groups(files: Mapping[str, frozenset[str]]) -> dict[str, str]:
    """File -> its group's name, for the files that ask for at least one shared server.

    A group is named by its servers, sorted and joined with ``+`` (``browser_server+demo_server``), so
    that a run's log says why files travel together.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for servers in files.values():
        ordered = sorted(servers)
        for other in ordered[1:]:
            parent[find(other)] = find(ordered[0])
        if ordered:
            find(ordered[0])  # a server asked for alone is a group of its own
    members: dict[str, set[str]] = {}
    for server in parent:
        members.setdefault(find(server), set()).add(server)
    name_of = {root: "+".join(sorted(m)) for root, m in members.items()}
    return {f: name_of[find(min(s))] for f, s in files.items() if s}


@dataclasses.dataclass(frozen=True)
class FileServers:
    """The shared servers one test file asks for, test by test (``tests``: test name -> servers; a method
    is ``Class::test``), and those asked for where no single test can be told (``whole``: a helper
    function or module-level code naming one, which every test of the file then gets)."""

    tests: Mapping[str, frozenset[str]]
    whole: frozenset[str]

    def of(self, test: str) -> frozenset[str]:
        return self.tests.get(test, frozenset()) | self.whole


def _is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
            isinstance(target, ast.Name) and target.id == "fixture"
        ):
            return True
    return False


def _is_autouse(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(dec, ast.Call) and any(k.arg == "autouse" and getattr(k.value, "value", False) for k in dec.keywords)
        for dec in node.decorator_list
    )


def _requested(node: ast.AST, pattern: re.Pattern[str]) -> set[str]:
    """Shared servers asked for by name inside ``node``: ``request.getfixturevalue("x_server")``."""
    return {
        arg.value
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "getfixturevalue"
        for arg in call.args[:1]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and pattern.fullmatch(arg.value)
    }


def _asked(node: ast.FunctionDef | ast.AsyncFunctionDef, pattern: re.Pattern[str]) -> set[str]:
    """Fixture names a test or fixture asks for: its parameters and ``getfixturevalue`` names."""
    args = node.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} | _requested(node, pattern)


def servers_by_test(source: str, pattern: re.Pattern[str]) -> FileServers:
    """Which shared servers each test of one file asks for, directly or through the file's own fixtures
    (and its autouse fixtures); read from the source's syntax tree, as the xdist controller can (it
    collects nothing). A ``getfixturevalue`` outside any test or fixture (a helper's) counts for all."""
    tree = ast.parse(source)
    fixtures: dict[str, set[str]] = {}
    autouse: set[str] = set()
    tests: dict[str, set[str]] = {}
    whole: set[str] = set()

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}::")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _is_fixture(node):
                    fixtures[node.name] = _asked(node, pattern)
                    if _is_autouse(node):
                        autouse.add(node.name)
                elif node.name.startswith("test"):
                    tests[prefix + node.name] = _asked(node, pattern)
                else:
                    whole.update(_requested(node, pattern))
            else:
                whole.update(_requested(node, pattern))

    visit(tree.body, "")

    def closure(names: set[str]) -> frozenset[str]:
        seen: set[str] = set()
        todo = list(names | autouse)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(fixtures.get(name, ()))
        return frozenset(n for n in seen if pattern.fullmatch(n))

    return FileServers({name: closure(asked) for name, asked in tests.items()}, frozenset(whole))


def marked_tests(source: str, marker: str) -> frozenset[str]:
    """The tests of one file marked ``@pytest.mark.<marker>`` (on the test, its class, or the module's
    ``pytestmark``), read from the syntax tree."""
    tree = ast.parse(source)

    def marks(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr == marker and "mark" in ast.unparse(n) for n in ast.walk(node))

    module = any(
        isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets) and marks(node.value)
        for node in tree.body
    )
    found: set[str] = set()

    def visit(body: list[ast.stmt], prefix: str, inherited: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}::", inherited or any(marks(d) for d in node.decorator_list))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if inherited or any(marks(d) for d in node.decorator_list):
                    found.add(prefix + node.name)

    visit(tree.body, "", module)
    return frozenset(found)


ALONE_PREFIX = "alone:"
#: The scope prefix of a unit marked ``realtime`` that asks for no shared server (those that do are real-time
#: already: ``servers:``).
REALTIME_PREFIX = "realtime:"


def is_realtime(scope: str) -> bool:
    """A unit that holds a server or the wall clock: it runs on a real-time worker (tests/support/xdist_alone.py)."""
    return scope.startswith(("servers:", ALONE_PREFIX, REALTIME_PREFIX))


def realtime_worker(worker: str, count: int, realtime_workers: int) -> bool:
    """Whether pytest-xdist worker ``worker`` (``gw3``) of ``count`` is one of the real-time lane's: the first
    ``realtime_workers``, or all of them when there are no more than that."""
    return count <= realtime_workers or int(worker.removeprefix("gw") or 0) < realtime_workers


def nice_if_batch_worker(config: object, realtime_workers: int, nice: int) -> str | None:
    """In a pytest-xdist worker of the batch lane: lower this process's priority by ``nice`` (what it starts
    inherits it) and return the worker's name; else None. Read from the worker's own input (``workerinput``),
    not the environment: a pytest run started by a test of a worker inherits its ``PYTEST_XDIST_*``."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or not realtime_workers:
        return None
    worker, count = str(workerinput["workerid"]), int(workerinput["workercount"])
    if realtime_worker(worker, count, realtime_workers):
        return None
    os.nice(nice)
    return worker


def scope_of_tests(
    tests_dir: Path, names: Iterable[str], alone: str | None = None, realtime: str | None = None
) -> Callable[[str], str]:
    """The xdist scope of a test's node id: ``servers:<group>`` for a test that asks for a shared server,
    where the group is a connected component of servers over *tests* (not files: a file whose tests use
    two servers, each test one, joins neither group to the other), else the test's file. A test marked
    ``alone`` gets ``alone:`` before that (its own unit, run after all others: tests/support/xdist_alone.py);
    one marked ``realtime`` (it starts its own server or asserts the wall clock) ``realtime:`` before its
    file, so that it runs on a real-time worker.

    A file split between groups runs its module fixtures once per worker that runs part of it; no module
    fixture of ours starts a server for tests that also ask for a shared one (the run's server count,
    printed at its end, would show it).
    """
    pattern = server_fixtures(names)
    # the main run's files and those of the phases in sub-folders (tests/eval_e2e, tests/calls...; not
    # the frameworks', which run in their own virtualenvs): names are unique
    sources = {p.name: p.read_text(encoding="utf-8") for p in sorted(tests_dir.rglob("test_*.py"))
               if "frameworks" not in p.relative_to(tests_dir).parts}
    by_file = {name: servers_by_test(source, pattern) for name, source in sources.items()}
    marked = {name: marked_tests(source, alone) for name, source in sources.items()} if alone else {}
    timed = {name: marked_tests(source, realtime) for name, source in sources.items()} if realtime else {}
    units = {f"{f}::{t}": fs.of(t) for f, fs in by_file.items() for t in fs.tests}
    groups = server_groups(units)

    def scope(nodeid: str) -> str:
        path, _, rest = nodeid.partition("::")
        file = path.rsplit("/", 1)[-1]
        test = rest.split("[", 1)[0]
        group = groups.get(f"{file}::{test}")
        if group is None and file in by_file and by_file[file].whole:  # a test the tree missed: the file's
            group = server_groups({file: by_file[file].whole})[file]
        unit = f"servers:{group}" if group else path
        if test in marked.get(file, ()):
            return ALONE_PREFIX + unit
        return REALTIME_PREFIX + unit if test in timed.get(file, ()) and not group else unit

    return scope
