"""The xdist grouping (tests/support/scheduling.py): the files sharing a server, even through a third
file, travel together; files without one stay alone; every shared server of conftest.py is seen."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.scheduling import group_of_files, server_fixtures, server_groups, servers_of
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
    assert servers_of(source, pattern) == frozenset({"demo_server", "browser_server"})
    assert servers_of("def test_y(nondemo_server): ...", pattern) == frozenset()


def test_every_session_server_fixture_of_conftest_is_grouped() -> None:
    """A new shared server must be in ``SHARED`` (or be ``demo``), or its files would each start it."""
    tree = ast.parse((TESTS / "conftest.py").read_text())
    defined = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Name) and t.id.endswith("_server")}
    defined |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                and node.name.endswith("_server") and node.name != "llm_server"}  # llm_server: one per test
    assert defined == {f"{name}_server" for name in [*SHARED, "demo"]}


def test_the_real_tree_groups_the_browser_and_demo_files() -> None:
    groups = group_of_files(TESTS, [*SHARED, "demo"])
    assert groups["test_browser.py"] == groups["test_eval_duplex_e2e.py"] == groups["test_eval_e2e.py"]
    assert "test_engine.py" not in groups  # asks for no shared server
