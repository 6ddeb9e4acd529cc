"""Transcript: user turns and ids, assistant words, who spoke last, bounded history."""

from __future__ import annotations

import pytest

from kame.oracle.config import OracleConfig
from kame.oracle.transcript import Transcript, Turn, tail_words

TABLE = ["<unk>", "<s>", "</s>", "<pad>", "▁Sure", ",", "▁Par", "is", "▁it", "▁is"]


def test_user_turns_and_ids() -> None:
    tr = Transcript()
    assert tr.user_turn_id == 0 and not tr.user_open
    assert tr.user_partial("   ") is None and tr.user_turn_id == 0
    up = tr.user_partial("what is")
    assert up is not None and up.new_turn and up.words_grew and up.turn_id == 1 and up.word_count == 2
    up = tr.user_partial("what  is the")
    assert up is not None and not up.new_turn and up.words_grew and up.text == "what is the"
    up = tr.user_partial("what's the")  # revision, no new word
    assert up is not None and not up.words_grew
    assert tr.pending_user == "what's the" and tr.user_open
    fin = tr.user_final("What is the capital of France?")
    assert fin.final and fin.turn_id == 1 and fin.words_grew and not fin.new_turn
    assert tr.turns == (Turn("user", "What is the capital of France?"),)
    assert tr.pending_user == "" and not tr.user_open
    assert tr.is_current(1)
    # Next utterance: new id, answers for turn 1 are now stale.
    up = tr.user_partial("and")
    assert up is not None and up.new_turn and up.turn_id == 2
    assert not tr.is_current(1)


def test_final_without_partial_and_empty_final() -> None:
    tr = Transcript()
    fin = tr.user_final("Yes.")
    assert fin.new_turn and fin.turn_id == 1 and tr.turns == (Turn("user", "Yes."),)
    tr.user_partial("uh")
    fin = tr.user_final("")  # noise: closes the utterance, commits nothing
    assert fin.turn_id == 2 and not tr.user_open and tr.turns == (Turn("user", "Yes."),)


def test_assistant_words_from_pieces_and_turn_order() -> None:
    tr = Transcript(piece_of=TABLE.__getitem__, word_end_idle_steps=2)
    tr.user_final("Capital of France?")
    assert not tr.assistant_spoke and tr.last_word_by == "user"
    assert tr.assistant_token(4) == []
    assert tr.assistant_speaking(12) and tr.assistant_pending == "Sure"
    assert not tr.assistant_spoke  # the first word has not ended yet
    assert tr.assistant_token(5) == []
    assert tr.assistant_token(6) == ["Sure,"]
    assert tr.assistant_spoke
    tr.assistant_token(7)
    tr.assistant_token(3)
    assert tr.assistant_token(3) == ["Paris"]  # two idle steps end the word
    assert tr.turns == (Turn("user", "Capital of France?"), Turn("assistant", "Sure, Paris"))
    # The user speaks again: the user is the last to finish a word.
    tr.user_partial("and Germany")
    assert not tr.assistant_spoke
    tr.assistant_piece("▁Berlin")
    tr.assistant_piece("▁is")  # assistant words during the user's utterance join the current assistant turn
    assert tr.turns[-1] == Turn("assistant", "Sure, Paris Berlin")
    assert tr.assistant_spoke
    tr.user_final("and Germany?")
    tr.add_assistant_words(["Berlin."])
    assert [t.role for t in tr.turns] == ["user", "assistant", "user", "assistant"]
    assert tr.assistant_flush() == ["is"]


def test_assistant_speaking_window() -> None:
    tr = Transcript(piece_of=TABLE.__getitem__)
    assert not tr.assistant_speaking(12)  # never spoke
    tr.assistant_token(4)
    for _ in range(11):
        tr.assistant_idle()
    assert tr.assistant_speaking(12)
    tr.assistant_token(3)
    assert not tr.assistant_speaking(12)


def test_history_is_bounded() -> None:
    tr = Transcript(max_turns=3, max_chars=None)
    for i in range(5):
        tr.user_final(f"question {i}")
        tr.add_assistant_words([f"answer {i}"])
    assert [t.text for t in tr.turns] == ["answer 3", "question 4", "answer 4"]
    tr = Transcript(max_turns=None, max_chars=30)
    tr.user_final("a" * 10)
    tr.add_assistant_words(["b" * 10])
    tr.user_final("c" * 15)
    assert [t.text for t in tr.turns] == ["b" * 10, "c" * 15]
    tr.add_assistant_words(["one two three four five six seven eight nine ten"])
    assert tr.turns[-1].text == "two three four five six seven eight nine ten"[-30:].lstrip()
    assert len(tr.turns) == 1 and len(tr.turns[0].text) <= 30


def test_tail_words() -> None:
    assert tail_words("hello big world", 100) == "hello big world"
    assert tail_words("hello big world", 9) == "big world"
    assert tail_words("hello big world", 8) == "world"
    assert tail_words("hello big world", 5) == "world"


def test_from_config() -> None:
    cfg = OracleConfig(history_max_turns=2, word_end_pad_steps=None)
    tr = Transcript.from_config(cfg, piece_of=TABLE.__getitem__)
    tr.assistant_token(4)
    for _ in range(10):
        tr.assistant_idle()
    assert tr.turns == ()  # no idle end of word configured
    for i in range(3):
        tr.user_final(f"q{i}")
        tr.add_assistant_words(["a"])
    assert len(tr.turns) == 2
    with pytest.raises(ValueError):
        Transcript(max_turns=0)
