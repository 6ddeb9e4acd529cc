"""Debounce: scripted partials/finals with times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kame.oracle.config import OracleConfig
from kame.oracle.debounce import Debouncer, Trigger


def test_word_growth_triggers() -> None:
    d = Debouncer()
    assert d.on_partial(0.0, 1, "what") == Trigger(False)
    t = d.on_partial(0.1, 1, "what is")
    assert t.start and t.reason == "words" and t.turn_id == 1
    assert not d.on_partial(0.2, 1, "what is the").start  # +1 since the last start
    assert d.on_partial(0.3, 1, "what is the capital").start  # +2
    assert not d.on_partial(0.4, 1, "what's the capital").start  # revision, no growth
    assert not d.on_partial(0.5, 1, "what is the").start  # shrink
    assert d.on_partial(0.6, 1, "what is the capital of France").start


def test_final_always_triggers_and_new_turn_resets_the_count() -> None:
    d = Debouncer()
    assert d.on_partial(0.0, 1, "hello there").start
    t = d.on_final(0.5, 1, "hello there")
    assert t.start and t.reason == "final"
    assert not d.on_final(0.6, 2, "").start  # empty final: nothing to answer
    assert not d.on_partial(1.0, 3, "so").start  # new turn: the count starts from 0
    assert d.on_partial(1.1, 3, "so what").start


def test_final_if_changed() -> None:
    d = Debouncer(final_restarts="if_changed")
    assert d.on_partial(0.0, 1, "hello there").start
    assert not d.on_final(0.5, 1, "hello  there").start
    assert d.on_final(0.6, 1, "Hello there.").start


def test_rate_limit_keeps_the_trigger_pending_until_the_window_allows() -> None:
    d = Debouncer(min_new_words=1, max_restarts=5, window_s=2.0)
    times = [0.0, 0.1, 0.2, 0.3, 0.4]
    words = ["one", "two", "three", "four", "five"]
    for i, now in enumerate(times):
        assert d.on_partial(now, 1, " ".join(words[: i + 1])).start
    t = d.on_partial(0.5, 1, "one two three four five six")
    assert not t.start and t.pending and t.retry_at == pytest.approx(2.0) and t.reason == "words"
    assert d.pending
    assert not d.on_partial(0.9, 1, "one two three four five six seven").start  # still limited
    assert not d.poll(1.5).start
    t = d.poll(2.0)
    assert t.start and t.reason == "words" and not d.pending
    # The start used the latest state: the next start needs growth beyond 7 words.
    assert not d.on_partial(2.1, 1, "one two three four five six seven").start
    assert d.poll(2.2) == Trigger(False)


def test_pending_final_keeps_priority_and_turn_change_drops_pending() -> None:
    d = Debouncer(min_new_words=1, max_restarts=1, window_s=1.0)
    assert d.on_partial(0.0, 1, "hi").start
    assert d.on_partial(0.2, 1, "hi there").pending
    t = d.on_final(0.3, 1, "hi there")
    assert t.pending and t.reason == "final" and t.retry_at == pytest.approx(1.0)
    assert d.on_partial(0.4, 1, "hi there you").reason == "final"
    fired = d.poll(1.0)
    assert fired.start and fired.reason == "final"
    # A trigger pending for turn 2 is dropped when turn 3 begins.
    d = Debouncer(min_new_words=2, max_restarts=1, window_s=1.0)
    assert d.on_partial(0.0, 1, "a b").start
    assert d.on_partial(0.5, 2, "c d").pending
    assert d.on_partial(0.6, 3, "x") == Trigger(False)
    assert not d.pending and d.poll(5.0) == Trigger(False)


def test_event_arriving_after_the_window_fires_the_pending_start() -> None:
    d = Debouncer(min_new_words=2, max_restarts=1, window_s=1.0)
    assert d.on_partial(0.0, 1, "a b").start
    assert d.on_partial(0.5, 1, "a b c d").pending
    t = d.on_partial(1.2, 1, "a b c d e")  # +1 only, but the pending trigger fires now
    assert t.start and t.reason == "words"


def test_next_allowed_and_starts() -> None:
    d = Debouncer(min_new_words=1, max_restarts=2, window_s=1.0)
    assert d.next_allowed(0.0) == 0.0
    d.on_partial(0.0, 1, "a")
    d.on_partial(0.5, 1, "a b")
    assert d.starts == 2 and d.next_allowed(0.6) == pytest.approx(1.0)
    assert d.next_allowed(1.0) == 1.0 and d.starts == 1


def test_from_config_and_validation() -> None:
    d = Debouncer.from_config(OracleConfig(min_new_words=3, max_restarts=1, restart_window_s=5.0))
    assert not d.on_partial(0.0, 1, "a b").start
    assert d.on_partial(0.0, 1, "a b c").start
    assert d.on_partial(1.0, 1, "a b c d e f").retry_at == pytest.approx(5.0)
    with pytest.raises(ValueError):
        Debouncer(min_new_words=0)


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.floats(0.0, 0.7), st.integers(0, 3), st.sampled_from(["partial", "partial", "final", "poll"])),
        max_size=60,
    ),
    max_restarts=st.integers(1, 5),
    window_s=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_never_more_than_max_restarts_in_any_window(
    events: list[tuple[float, int, str]], max_restarts: int, window_s: float
) -> None:
    d = Debouncer(max_restarts=max_restarts, window_s=window_s)
    now, turn, words, starts = 0.0, 1, 0, []
    for dt, grow, kind in events:
        now += dt
        words += grow
        text = " ".join(["w"] * words)
        if kind == "partial":
            trig = d.on_partial(now, turn, text)
        elif kind == "final":
            trig = d.on_final(now, turn, text)
        else:
            trig = d.poll(now)
        if trig.start:
            starts.append(now)
        elif trig.pending:
            assert trig.retry_at is not None and trig.retry_at > now
        if kind == "final":
            turn, words = turn + 1, 0
    for i, t0 in enumerate(starts):
        in_window = [t for t in starts[i:] if t < t0 + window_s]
        assert len(in_window) <= max_restarts
