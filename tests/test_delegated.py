"""kame/session/delegated_answers.py: who answers a delegated session, without a wire, a tokenizer model or torch."""

from __future__ import annotations

import itertools

import pytest

from kame.oracle.config import OracleConfig
from kame.session.commands import CommandRefused
from kame.session.delegated_answers import MAX_CONTEXT_CHARS, ContextItem, DelegatedAnswers


def word_ids(text: str) -> list[int]:
    """A stand-in encoder: one id per character (what matters here is only whether there are words)."""
    return [100 + (ord(c) % 50) for c in text]


def answers(mode: str = "turn") -> DelegatedAnswers:
    counter = itertools.count(1)
    a = DelegatedAnswers(mode, 3, encode=word_ids, oracle_config=OracleConfig(),  # type: ignore[arg-type]
                         new_id=lambda: f"dlg_{next(counter)}")
    a.started = True
    return a


def test_a_turn_opens_one_delegation_and_nothing_before_the_session_started() -> None:
    a = answers()
    a.started = False
    assert a.final(1.0, 1, "book a table", 400) is None  # decided, but the session had not started
    a.started = True
    assert a.stable(2.0, 2, "what is", 800) is None  # turn mode waits for the final text
    opened = a.final(2.5, 2, "what is the weather", 900)
    assert opened is not None and opened.delegation_id == "dlg_1" and opened.offset_ms == 900
    assert opened.response_id is None  # the client answers
    assert a.final(3.0, 3, "", 1000) is None  # a turn without words delegates nothing


def test_a_commentary_for_a_superseded_delegation_is_kept_but_not_spoken() -> None:
    a = answers()
    first = a.final(1.0, 1, "book a table for two tonight", 400)
    second = a.final(2.0, 2, "no actually make it four people", 900)
    assert first is not None and second is not None
    late = a.append("commentary", "Booked for two.", first.delegation_id, 1000)
    assert late.answer is None and late.unspoken == "superseded" and late.end_ms == late.at_ms == 1000
    current = a.append("commentary", "Booked for four.", second.delegation_id, 1100)
    assert current.answer is not None and current.unspoken is None
    assert current.end_ms == 1100 + current.answer.steps * 80
    assert [(c.text, c.spoken) for c in a.context] == [("Booked for two.", False), ("Booked for four.", True)]


def test_unknown_ids_are_refused_and_symbols_are_not_spoken() -> None:
    a = answers()
    with pytest.raises(CommandRefused) as refused:
        a.append("commentary", "Hello.", "dlg_never", 0)
    assert refused.value.code == "unknown_delegation" and refused.value.param == "delegation_id"
    assert not a.context  # a refused append is not kept
    silent = a.append("commentary", "*** ...", None, 0)
    assert silent.answer is None and silent.unspoken == "nothing_to_speak"
    thought = a.append("thinking", "The user is vegetarian.", None, 0)
    assert thought.answer is None and thought.unspoken is None


def test_context_keeps_the_newest_within_its_budget() -> None:
    a = answers()
    chunk = "x" * (MAX_CONTEXT_CHARS // 3)
    for i in range(5):
        a.keep(ContextItem("thinking", chunk, None, i))
    assert sum(len(c.text) for c in a.context) <= MAX_CONTEXT_CHARS
    assert [c.at_ms for c in a.context] == [2, 3, 4]


def test_speculative_mode_delegates_on_growing_words() -> None:
    a = answers("speculative")
    assert a.stable(1.0, 1, "what is", 100) is not None  # the published debounce: two new stable words
    a.configure("turn", 3)
    assert a.stable(1.5, 1, "what is the weather", 200) is None
