"""Answers and the oracle stream they are written to. No I/O.

Every answer source of a session (:mod:`kame.session.answer_source`) writes
the slot's oracle stream through one writer, the pipeline's
:class:`~kame.session.answer_source.OracleWriter`: the own LLM's
:class:`~kame.oracle.loop.OracleLoop` (its sink), a Live client's commentary
and the Responses delegation's rounds. What the last two write is reported to
the session's owner as :class:`AnswerWritten` (the own LLM's writes are the
pipeline events ``oracle.reset`` / ``oracle.text``).

A Live client's commentary, a Responses round's text and a speculative
request's answer all reach Moshi the same way: a new oracle
sequence (a reset: start id, then its tokens, no pad inside), sanitized and
cut exactly as an LLM answer is (:mod:`kame.oracle.sanitize`;
:class:`~kame.oracle.word_tokenizer.WordStreamTokenizer` with the server's
``oracle.*`` settings: one SentencePiece encode of the whole spoken text, at
most ``max_fed_words`` words).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kame.oracle.config import OracleConfig
from kame.oracle.word_tokenizer import WordStreamTokenizer

Encode = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class AnswerWritten:
    """What an answer source other than the own LLM wrote to the oracle stream: ``tokens`` queued (a new
    sequence counts its start id); ``fifo_s``, for a new sequence, the seconds from the answer's arrival
    until it was in the FIFO (None for a push)."""

    tokens: int
    new_sequence: bool
    fifo_s: float | None = None


@dataclass(frozen=True)
class OracleAnswer:
    """What the runtime hands the oracle: ``reset(ids)`` (the start id is the FIFO's)."""

    ids: tuple[int, ...]
    text: str  #: the sanitized words that ``ids`` encode
    delegation_id: str | None

    @property
    def steps(self) -> int:
        """Steps (80 ms) the sequence occupies in the oracle stream, start id included."""
        return len(self.ids) + 1


def commentary_answer(content: str, encode: Encode, config: OracleConfig, delegation_id: str | None) -> OracleAnswer | None:
    """The oracle answer of a commentary, or None when it has no spoken word (only symbols, markup)."""
    tok = WordStreamTokenizer.from_config(encode, config)
    ids = tok.feed(content) + tok.flush()
    if not ids:
        return None
    return OracleAnswer(tuple(ids), tok.text, delegation_id)
