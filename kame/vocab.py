"""The text vocabulary of Moshi's text stream: which ids carry no text, where words start.

Moshi samples one text token per 80 ms frame. Most frames carry a *pad* (no text),
and the frame before a word starts may carry *end of padding*; both ids are the LM's
(``text_padding_token_id``, ``end_of_text_padding_id``). The text itself comes as
SentencePiece pieces, where ``▁`` marks the start of a word. Everything that turns
text tokens into words (transcripts, the wires, the ASR's turn detection) asks a
:class:`TextVocab` rather than hard-coding the ids.

Build it from the loaded model with :meth:`TextVocab.from_model`; :data:`MOSHI_VOCAB`
holds the values of Moshi's published checkpoints, for code that never sees a
model (clients, tests of pure logic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: SentencePiece's word-boundary meta symbol (U+2581), the first character of a piece that starts a word.
WORD_START = "\u2581"


@dataclass(frozen=True)
class TextVocab:
    """What a text token id means beyond its piece."""

    pad_id: int = 3  #: the LM's ``text_padding_token_id``: a frame without text
    end_of_padding_id: int = 0  #: the LM's ``end_of_text_padding_id``: padding ends, a word follows
    word_start: str = WORD_START  #: the tokenizer's word-boundary symbol

    @property
    def silent_ids(self) -> frozenset[int]:
        """Ids that carry no text."""
        return frozenset({self.pad_id, self.end_of_padding_id})

    def is_text(self, token_id: int | None) -> bool:
        """Whether a sampled id carries text (negative ids are moshi's "zero" and "ungenerated" markers)."""
        return token_id is not None and token_id >= 0 and token_id not in self.silent_ids

    def piece_text(self, piece: str) -> str:
        """A piece as text: the word-start symbol becomes a space (``"▁Hel"`` -> ``" Hel"``)."""
        return piece.replace(self.word_start, " ")

    def starts_word(self, piece: str) -> bool:
        return piece.startswith(self.word_start)

    @classmethod
    def from_model(cls, lm: Any, tokenizer: Any) -> TextVocab:
        """The ids from a loaded moshi ``LMModel``; the word-start symbol checked against the loaded
        SentencePiece tokenizer (a tokenizer without it would make every word run into the next)."""
        pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode("a b")]
        if not any(p.startswith(WORD_START) for p in pieces):
            raise ValueError(f"the text tokenizer does not mark word starts with {WORD_START!r} (pieces {pieces})")
        return cls(pad_id=int(lm.text_padding_token_id), end_of_padding_id=int(lm.end_of_text_padding_id))


#: Moshi's published checkpoints (moshiko, moshika, KAME's): pad 3, end of padding 0, ``▁``.
MOSHI_VOCAB = TextVocab()
