"""A failing test whose traceback holds a frame without a line number is a failure, not an INTERNALERROR
(tests/support/lineless.py, the hook in tests/conftest.py)."""

from __future__ import annotations

import types

import pytest

from tests.support.lineless import fill_lines, lineless_frames, without_locations


def _boom() -> None:
    raise ValueError("boom")


def _call() -> None:
    _boom()


def _lineless_error() -> ValueError:
    """A ValueError raised through a copy of ``_call`` whose instructions have no location."""
    f = types.FunctionType(without_locations(_call.__code__), globals())
    try:
        f()
    except ValueError as exc:
        return exc
    raise AssertionError("no error")


def test_fill_lines_names_and_mends_the_frame() -> None:
    exc = _lineless_error()
    assert [s.rsplit(":", 1)[-1].split(" ")[0] for s in lineless_frames(exc)] == ["_call"]
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = exc
    assert fill_lines(wrapped) and lineless_frames(wrapped) == []
    assert not fill_lines(wrapped)  # nothing left to mend


INNER = '''
import types

from tests.support.lineless import without_locations

def _boom():
    raise ValueError("boom")

def _call():
    _boom()

def test_lineless():
    types.FunctionType(without_locations(_call.__code__), globals())()
'''


def test_a_lineless_traceback_is_reported_as_a_failure(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "INTERNALERROR" not in text and "ValueError: boom" in text
    assert "frames without a line number" in text and "test_inner.py:_call" in text
