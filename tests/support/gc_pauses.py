"""Garbage collection between tests, not in the middle of one.

Why: a test process that has imported torch, aiortc, the ``openai`` SDK and the rest holds 500,000-700,000
objects, and CPython's automatic full collection walks them all. Measured in a four-worker run on the
2-core machine (a thread that sleeps 10 ms, and ``gc.callbacks``): every pause of a worker longer than
0.3 s was a full collection, 10-13 per worker, each 0.4-1.0 s of wall time while the cores were shared,
one of them in the middle of ``test_maximum_duration_expires`` (its microphone stopped for 0.7 s). A
client that pauses that long looks idle to the server, or its packets arrive too late to be heard.

So the test process does what the server does with its models (``kame.server.app.gc_schedule``): it
freezes what it holds (``gc.freeze``: the permanent generation, never walked again) once the tests are
collected, and after each test, first collecting what that test left behind. A collection then walks
only the objects of one test, and so do the automatic ones during a test. Measured in the same run: no
pause over 0.35 s during a test, and 1.3 s of collections per worker in all, instead of 4-5 s.

What this gives up: a reference cycle among objects frozen while alive (a module fixture's, freed at the
end of its file) is never collected. Workers peaked at 0.7-1.2 GB, and unfreezing at the end of each file
to collect them cost 25-30 full collections per worker (22-31 s of wall time in all), so they stay.
"""

from __future__ import annotations

import gc


def collection_started() -> None:
    """Importing the test files makes little garbage: no collection until they are all imported."""
    gc.disable()


def collection_finished() -> None:
    gc.enable()
    gc.freeze()


def test_finished() -> None:
    """Collect what the test left, then freeze what survived."""
    gc.collect()
    gc.freeze()
