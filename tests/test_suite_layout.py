"""The suite's layout rules (issue 23): no test file imports another test file, helpers live in
tests/support/, and no bench puts tests/ itself on sys.path; and the test process collects its garbage
between tests (tests/support/gc_pauses.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def imported_modules(path: Path) -> list[str]:
    """Every module an ``import``/``from ... import`` names in ``path`` (relative imports resolved under tests)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            out.append(("tests." + base if node.level else base) if base else "tests")
            out.extend(f"{base}.{alias.name}" if base else alias.name for alias in node.names if node.level and not base)
    return out


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return any(p.startswith("test_") or p == "conftest" for p in parts)


def test_no_test_file_imports_another_test_file() -> None:
    offenders = {
        str(path.relative_to(ROOT)): bad
        for path in sorted(TESTS.rglob("*.py"))
        if (bad := [m for m in imported_modules(path) if is_test_module(m)])
    }
    assert offenders == {}, f"import helpers from tests/support/ instead: {offenders}"


def test_the_check_sees_an_import_of_a_test_file(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text("import os\nfrom test_browser import Console\nfrom tests.test_config import X\nfrom . import test_hub\n")
    found = [m for m in imported_modules(sample) if is_test_module(m)]
    assert "test_browser" in found and "tests.test_config" in found and "test_hub" in found


def test_helpers_are_in_the_support_package() -> None:
    stray = sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name not in ("conftest.py", "__init__.py"))
    assert stray == [], f"move helper modules into tests/support/: {stray}"


def test_no_bench_puts_tests_on_sys_path() -> None:
    bad = [p.name for p in sorted((ROOT / "bench").glob("*.py")) if '/ "tests"' in p.read_text() or "tests\")" in p.read_text()]
    assert bad == [], f"benches import tests.support with the repository root on sys.path: {bad}"


def test_support_modules_are_imported_from_the_package() -> None:
    """A bare ``from llm_server import ...`` only works while tests/support/ happens to be on sys.path."""
    support = {p.stem for p in (TESTS / "support").glob("*.py") if p.stem != "__init__"}
    offenders = {
        str(path.relative_to(ROOT)): bad
        for path in sorted(TESTS.rglob("*.py"))
        if (bad := [m for m in imported_modules(path) if m.split(".")[0] in support])
    }
    assert offenders == {}, f"import them as tests.support.X: {offenders}"


def test_what_earlier_tests_left_is_frozen_so_collections_here_stay_short() -> None:
    """The collection's imports and what earlier tests kept are in the permanent generation: a full
    collection during this test walks only this test's objects (tests/support/gc_pauses.py)."""
    import gc

    frozen = gc.get_freeze_count()
    assert frozen > 20_000, frozen  # pytest and the test files' imports alone (about 45,000 for this file)
    assert len(gc.get_objects()) < frozen / 10, (len(gc.get_objects()), frozen)
