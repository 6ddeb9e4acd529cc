"""Answer-switch and barge-in decisions."""

from __future__ import annotations

import pytest

from kame.oracle.switch import FeedState, decide_barge_in, decide_switch, same_words

FED = FeedState(turn_id=2, fed_words=("Paris", "is", "the"), assistant_spoke=False)


def decide(policy, state=FED, words=("Paris", "is", "the", "capital"), complete=False, answer_turn=2, current=2):  # type: ignore[no-untyped-def]
    return decide_switch(
        policy,
        state,
        answer_turn_id=answer_turn,
        current_turn_id=current,
        answer_words=list(words),
        answer_complete=complete,
    )


@pytest.mark.parametrize("policy", ["reset", "keep_if_same_start", "freeze_when_speaking"])
def test_common_rules(policy) -> None:  # type: ignore[no-untyped-def]
    assert decide(policy, answer_turn=1).action == "ignore"  # stale
    assert decide(policy, words=(), complete=False).action == "wait"
    assert decide(policy, words=(), complete=True).action == "ignore"
    first = decide(policy, state=FeedState())
    assert first.action == "reset" and "first" in first.reason
    # A sequence fed for an older turn does not count as this turn's.
    assert decide(policy, state=FeedState(turn_id=1, fed_words=("x",), assistant_spoke=True)).action == "reset"


def test_reset_policy_always_resets() -> None:
    assert decide("reset").action == "reset"
    assert decide("reset", state=FeedState(2, ("Paris",), True)).action == "reset"


def test_keep_if_same_start() -> None:
    d = decide("keep_if_same_start")
    assert d.action == "append" and d.skip_words == 3
    # Case and punctuation do not matter for the match.
    assert decide("keep_if_same_start", words=("paris", "is", "the,", "capital.")).action == "append"
    assert decide("keep_if_same_start", words=("Paris", "was")).action == "reset"
    assert decide("keep_if_same_start", words=("Paris", "is")).action == "wait"
    assert decide("keep_if_same_start", words=("Paris", "is"), complete=True).action == "ignore"
    same = decide("keep_if_same_start", words=("Paris", "is", "the"))
    assert same.action == "append" and same.skip_words == 3


def test_freeze_when_speaking() -> None:
    assert decide("freeze_when_speaking").action == "reset"
    spoke = FeedState(turn_id=2, fed_words=("Paris",), assistant_spoke=True)
    assert decide("freeze_when_speaking", state=spoke).action == "ignore"
    # Nothing fed for this turn yet: the first answer still goes in.
    assert decide("freeze_when_speaking", state=FeedState(2, (), True)).action == "reset"


def test_unknown_policy() -> None:
    with pytest.raises(ValueError):
        decide("sometimes")
    with pytest.raises(ValueError):
        decide_barge_in("maybe", new_user_turn=True, assistant_speaking=True)  # type: ignore[arg-type]


def test_barge_in() -> None:
    assert not decide_barge_in("clear", new_user_turn=True, assistant_speaking=False).barge_in
    assert not decide_barge_in("clear", new_user_turn=False, assistant_speaking=True).clear_queue
    keep = decide_barge_in("keep", new_user_turn=True, assistant_speaking=True)
    assert keep.barge_in and not keep.clear_queue
    clear = decide_barge_in("clear", new_user_turn=True, assistant_speaking=True)
    assert clear.barge_in and clear.clear_queue


def test_same_words() -> None:
    assert same_words(["Don't", "go."], ["don't", "go"])
    assert not same_words(["a"], ["a", "b"])
    assert not same_words(["a"], ["b"])
