"""Moshi text pieces -> words (hand-made piece tables; real models in test_oracle_tokenizer)."""

from __future__ import annotations

import pytest

from kame.oracle.pieces import PieceWords, pieces_to_text

TABLE = [
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "▁Hel",
    "lo",
    "▁there",
    "▁",
    ",",
    "▁how",
    "'s",
    "▁it",
    "<0xC3>",
    "<0xA9>",
    "▁caf",
]


def piece_of(i: int) -> str:
    return TABLE[i]


def test_pieces_join_into_words_not_spaced_pieces() -> None:
    assert pieces_to_text(["▁Hel", "lo", "▁there"]) == "Hello there"
    assert pieces_to_text(["▁Hel", "lo", ",", "▁how", "'s", "▁it"]) == "Hello, how's it"
    assert pieces_to_text(["▁", "Hel", "lo", "▁", "▁there"]) == "Hello there"
    assert pieces_to_text(["▁of▁the", "▁end"]) == "of the end"  # pieces across spaces


def test_word_completes_when_next_word_starts() -> None:
    words = PieceWords(piece_of, idle_steps_end_word=None)
    assert words.push(4) == [] and words.pending == "Hel"
    assert words.push(5) == [] and words.pending == "Hello"
    assert words.push(3) == [] and words.push(0) == []  # pads never split or end a word here
    assert words.push(6) == ["Hello"]
    assert words.push(8) == [] and words.pending == "there,"
    assert words.flush() == ["there,"] and words.pending == ""
    assert words.flush() == []


def test_idle_steps_end_the_word() -> None:
    words = PieceWords(piece_of, idle_steps_end_word=2)
    words.push(4)
    words.push(5)
    assert words.push(3) == []
    assert words.push(3) == ["Hello"]
    assert words.push(3) == []  # only once
    assert words.idle_steps == 3
    words.push(6)
    assert words.idle_steps == 0


def test_skipped_and_invalid_ids() -> None:
    words = PieceWords(piece_of)
    for token in (0, 3, -1, -2, 1, 2, 999):  # pad, end-of-padding, zero, ungenerated, bos, eos, out of range
        assert words.push(token) == []
    assert words.pending == ""
    assert words.idle_steps == 7
    no_table = PieceWords(None)
    assert no_table.push(4) == [] and no_table.pending == ""


def test_byte_pieces() -> None:
    words = PieceWords(piece_of)
    for token in (14, 12, 13):
        words.push(token)
    assert words.pending == "café"
    assert words.push(6) == ["café"]


def test_invalid_setting() -> None:
    with pytest.raises(ValueError):
        PieceWords(piece_of, idle_steps_end_word=0)
