"""From Kyutai STT tokens (one per 80 ms frame) to turn events.

Pure: fed one token per frame, returns :class:`~kame.asr.events.Emission`\\ s.
Pieces are rebuilt into words (the STT model's :class:`~kame.vocab.TextVocab`: ``▁`` starts a
word, the pad and end-of-padding ids carry no text).
A turn starts with its first word (``speech_started``); every new piece
updates the partial. A turn ends when the model's end-of-turn head says so
for ``eot_frames`` frames in a row, or after ``silence_frames`` frames without
text (models without that head, or a head that never fires); then
``speech_stopped`` and ``final``. Text lags audio by the model's delay, so a
session that ends must be flushed with that much silence first.
"""

from __future__ import annotations

from collections.abc import Callable

from kame.asr.events import Emission, EventType
from kame.vocab import MOSHI_VOCAB, TextVocab


class SttTurns:
    """Turn segmentation and word rebuilding for one Kyutai STT stream."""

    def __init__(
        self,
        piece_of: Callable[[int], str],
        *,
        vocab: TextVocab = MOSHI_VOCAB,
        silence_frames: int = 10,
        eot_threshold: float = 0.6,
        eot_frames: int = 2,
    ) -> None:
        self.piece_of = piece_of
        self.vocab = vocab
        self.silence_frames = silence_frames
        self.eot_threshold = eot_threshold
        self.eot_frames = eot_frames
        self.utterance = 0
        self._words: list[str] = []
        self._in_turn = False
        self._idle = 0
        self._eot_run = 0
        self._last_partial = ""

    @property
    def text(self) -> str:
        return " ".join(w for w in self._words if w)

    @property
    def in_turn(self) -> bool:
        return self._in_turn

    def feed(self, token_id: int, end_prob: float | None = None) -> list[Emission]:
        out: list[Emission] = []
        piece = self.piece_of(token_id) if self.vocab.is_text(token_id) else ""
        if piece and not (piece.startswith("<") and piece.endswith(">")):
            self._idle = 0
            self._eot_run = 0
            if not self._in_turn:
                self._in_turn = True
                out.append(Emission(EventType.SPEECH_STARTED, utterance=self.utterance))
            if self.vocab.starts_word(piece) or not self._words:
                self._words.append(piece.lstrip(self.vocab.word_start))
            else:
                self._words[-1] += piece
            text = self.text
            if text and text != self._last_partial:
                self._last_partial = text
                out.append(Emission(EventType.PARTIAL, text=text, stable=" ".join(self._words[:-1]), utterance=self.utterance))
            return out
        if not self._in_turn:
            return out
        self._idle += 1
        if end_prob is not None and end_prob >= self.eot_threshold:
            self._eot_run += 1
        else:
            self._eot_run = 0
        if self._eot_run >= self.eot_frames or self._idle >= self.silence_frames:
            out.extend(self.end_turn())
        return out

    def end_turn(self) -> list[Emission]:
        """Close the open turn (if any): speech_stopped then final."""
        if not self._in_turn:
            return []
        text = self.text
        out = [
            Emission(EventType.SPEECH_STOPPED, utterance=self.utterance),
            Emission(EventType.FINAL, text=text, stable=text, utterance=self.utterance),
        ]
        self.utterance += 1
        self._words = []
        self._in_turn = False
        self._idle = 0
        self._eot_run = 0
        self._last_partial = ""
        return out
