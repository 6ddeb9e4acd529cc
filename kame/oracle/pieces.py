"""Moshi's text tokens (SentencePiece pieces, one per step) -> words.

The assistant's turn goes into the LLM prompt as words ("Hello there"), not
as pieces joined by spaces ("Hel lo there", the published server's bug).
A piece starting with ``▁`` starts a new word, so a word is complete when
the next word begins, or after ``idle_steps_end_word`` steps without a
piece (Moshi writes a word's pieces on consecutive steps, then pads).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kame.vocab import MOSHI_VOCAB, TextVocab

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_CONTROL_PIECES = frozenset({"<unk>", "<s>", "</s>", "<pad>"})


class PieceWords:
    """Rebuilds words from a stream of text token ids (every step, pads included)."""

    def __init__(
        self,
        piece_of: Callable[[int], str] | None = None,
        *,
        vocab: TextVocab = MOSHI_VOCAB,
        idle_steps_end_word: int | None = 3,
    ) -> None:
        """``piece_of`` maps an id to its piece (SentencePiece ``id_to_piece``).

        Ids without text (``vocab``: pad, end of padding; negative ids, -1 zero and -2
        ungenerated) and ids ``piece_of`` rejects are steps without a piece.
        ``idle_steps_end_word=None`` ends a word only when the next one starts.
        """
        if idle_steps_end_word is not None and idle_steps_end_word < 1:
            raise ValueError("idle_steps_end_word must be >= 1 or None")
        self._piece_of = piece_of
        self._vocab = vocab
        self._idle_end = idle_steps_end_word
        self._buffer = ""
        self._bytes = bytearray()
        self.idle_steps = 0  #: steps since the last piece

    @property
    def pending(self) -> str:
        """The word being spelled (may be incomplete), "" if none."""
        return self._buffer + self._decoded_bytes()

    def push(self, token_id: int) -> list[str]:
        """One step's text token; returns the words this step completed."""
        if not self._vocab.is_text(token_id) or self._piece_of is None:
            return self.idle()
        try:
            piece = self._piece_of(int(token_id))
        except (IndexError, KeyError, ValueError):
            return self.idle()
        if piece in _CONTROL_PIECES:
            return self.idle()
        return self.push_piece(piece)

    def idle(self) -> list[str]:
        """A step without a piece."""
        self.idle_steps += 1
        if self._idle_end is not None and self.idle_steps == self._idle_end:
            return self.flush()
        return []

    def push_piece(self, piece: str) -> list[str]:
        """A piece as text (``"▁Hel"``); returns the words it completed."""
        self.idle_steps = 0
        byte = _BYTE_PIECE.match(piece)
        if byte:
            self._bytes.append(int(byte.group(1), 16))
            return []
        self._buffer += self._decoded_bytes()
        self._bytes.clear()
        parts = (self._buffer + self._vocab.piece_text(piece)).split(" ")
        self._buffer = parts[-1]
        return [p for p in parts[:-1] if p]

    def flush(self) -> list[str]:
        """End the pending word now (turn end); returns it if any."""
        word = self.pending
        self._buffer = ""
        self._bytes.clear()
        return [word] if word else []

    def _decoded_bytes(self) -> str:
        return self._bytes.decode("utf-8", errors="ignore") if self._bytes else ""


def pieces_to_text(pieces: list[str]) -> str:
    """Whole-sequence helper: ``["▁Hel", "lo", "▁there"] -> "Hello there"``."""
    assembler = PieceWords()
    words: list[str] = []
    for piece in pieces:
        words += assembler.push_piece(piece)
    return " ".join(words + assembler.flush())
