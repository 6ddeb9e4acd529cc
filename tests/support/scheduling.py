"""Which test files must run on the same pytest-xdist worker: those that share a server.

A shared server (tests/support/servers.py, ``demo_server``) starts once per worker that asks for it, and
a run may start at most ``conftest.MAX_SERVERS`` of them. Under ``--dist loadfile`` two workers would
each start most of them. So the files that ask for the same shared server, and, transitively, those
that ask for a server one of them also asks for, form one group (a connected component): the whole
group goes to one worker, which starts its servers once. Files that ask for no shared server stay one
unit each and fill the gaps on whichever worker is free.

A file asks for a server by naming its fixture (``browser_server``, ``demo_server``, ...) anywhere in
its source: as a test argument, in its own module fixture's arguments, or in ``request.getfixturevalue``.
Reading the source, not the collected items, is what the xdist controller can do: it collects nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path


def server_fixtures(names: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching the fixture names of the shared servers ``names`` (``<name>_server``)."""
    alternatives = "|".join(sorted(re.escape(n) for n in names))
    return re.compile(rf"\b(?:{alternatives})_server\b")


def servers_of(source: str, pattern: re.Pattern[str]) -> frozenset[str]:
    """The shared servers' fixture names one test file's source asks for."""
    return frozenset(pattern.findall(source))


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


def group_of_files(tests_dir: Path, names: Iterable[str]) -> dict[str, str]:
    """``server_groups`` of every ``test_*.py`` under ``tests_dir``, keyed by file name."""
    pattern = server_fixtures(names)
    files = {p.name: servers_of(p.read_text(encoding="utf-8"), pattern) for p in sorted(tests_dir.glob("test_*.py"))}
    return server_groups(files)
