"""A commentary's text -> the oracle sequence it becomes. No I/O.

In client delegation the application's ``session.commentary.append`` is the
oracle's only source: each one becomes a new oracle answer (a reset: start
id, then its tokens, no pad inside), sanitized and cut exactly as an LLM
answer is (:mod:`kame.oracle.sanitize`; :class:`WordStreamTokenizer` with
the server's ``oracle.*`` settings: one SentencePiece encode of the whole
spoken text, at most ``max_fed_words`` words).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kame.oracle.config import OracleConfig
from kame.oracle.word_tokenizer import WordStreamTokenizer
from kame.server.wires.live.events import LiveError

Encode = Callable[[str], Sequence[int]]
#: The contract's limit on one append's content.
MAX_APPEND_TOKENS = 500


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


def estimated_tokens(text: str) -> int:
    """The contract's tokens, estimated as GPT-Live clients estimate them before they split a long append:
    about four ASCII characters a token, a whole token for any other character.

    The limit is OpenAI's tokenizer's, not Moshi's: SentencePiece with a 32k vocabulary cuts English into
    more pieces, so counting Moshi's tokens would refuse appends the contract allows (Pipecat splits
    answers into 450-token pieces by this same estimate, and treats any ``error`` as a failure)."""
    quarters = sum(1 if ch.isascii() else 4 for ch in text)
    return (quarters + 3) // 4


def check_length(content: str, kind: str, event_id: str | None) -> None:
    """The contract's limit on one append: 500 tokens (:func:`estimated_tokens`)."""
    if estimated_tokens(content) > MAX_APPEND_TOKENS:
        raise LiveError("content_too_long", f"session.{kind}.append: content is limited to {MAX_APPEND_TOKENS} tokens",
                        param="content", client_event_id=event_id)


def commentary_answer(content: str, encode: Encode, config: OracleConfig, delegation_id: str | None) -> OracleAnswer | None:
    """The oracle answer of a commentary, or None when it has no spoken word (only symbols, markup)."""
    tok = WordStreamTokenizer.from_config(encode, config)
    ids = tok.feed(content) + tok.flush()
    if not ids:
        return None
    return OracleAnswer(tuple(ids), tok.text, delegation_id)
