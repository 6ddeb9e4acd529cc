"""Transcripts as the Live API delivers them: append-only fragments on the session timeline. No I/O.

A Live client builds each transcript by appending ``delta`` fragments in
delivery order; there is no revision and no "done" event
(``input_transcript_delta_event.py``). So:

- **User**: only words the recogniser will not change are sent. The ASR
  reports, per utterance, a ``stable`` prefix (local agreement) and at the
  end a final text. :class:`UserTranscript` sends the words beyond those
  already sent for that utterance, counting words, so a final that differs
  from the stable prefix in an earlier word (``free`` -> ``three``) adds its
  later words and never rewrites what the client has. Each fragment after
  the first starts with a space, so fragments concatenate into text.
- **Assistant**: Moshi's text pieces (SentencePiece, ``▁`` starts a word)
  become fragments as they are generated, one 80 ms step each.

Times are milliseconds on the session timeline: audio fed since the
session started (the ASR's ``audio_s``; Moshi's step index times 80 ms).
Fragments never go back in time: each starts where the previous one ended
at the earliest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kame.server.wires.live.events import InputTranscriptDelta, OutputTranscriptDelta
from kame.vocab import MOSHI_VOCAB

FRAME_MS = 80


def ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


@dataclass
class _Utterance:
    start_ms: int
    sent_words: int = 0
    words: int = 0  #: words heard so far (stable or final), for the backchannel rule


@dataclass
class UserTranscript:
    """ASR hypotheses -> append-only user transcript fragments."""

    text: str = ""
    last_end_ms: int = 0
    utterances: dict[int, _Utterance] = field(default_factory=dict)
    max_open: int = 8

    def _utterance(self, utterance: int, at_ms: int | None = None) -> _Utterance:
        """The utterance's state; one never announced (no ``speech_started``) starts where the last
        fragment ended."""
        u = self.utterances.get(utterance)
        if u is None:
            while len(self.utterances) >= self.max_open:  # a recogniser that never finalises
                del self.utterances[min(self.utterances)]
            u = _Utterance(start_ms=self.last_end_ms if at_ms is None else at_ms)
            self.utterances[utterance] = u
        return u

    def speech_started(self, utterance: int, audio_s: float) -> None:
        self._utterance(utterance, ms(audio_s))

    def _advance(self, utterance: int, words: list[str], audio_s: float) -> InputTranscriptDelta | None:
        end = ms(audio_s)
        u = self._utterance(utterance)
        u.words = max(u.words, len(words))
        if len(words) <= u.sent_words:
            return None
        new = " ".join(words[u.sent_words:])
        u.sent_words = len(words)
        delta = (" " + new) if self.text else new
        self.text += delta
        start = max(self.last_end_ms, min(u.start_ms, end))
        end = max(end, start)
        self.last_end_ms = end
        return InputTranscriptDelta(delta, start, end)

    def stable(self, utterance: int, stable: str, audio_s: float) -> InputTranscriptDelta | None:
        """A partial hypothesis whose ``stable`` prefix may have grown."""
        return self._advance(utterance, stable.split(), audio_s)

    def final(self, utterance: int, text: str, audio_s: float) -> InputTranscriptDelta | None:
        """The utterance's final text: its words not yet sent (then the utterance is closed)."""
        delta = self._advance(utterance, text.split(), audio_s)
        self.utterances.pop(utterance, None)
        return delta


@dataclass
class AssistantTranscript:
    """Moshi's text pieces -> assistant transcript fragments."""

    text: str = ""

    def piece(self, piece: str, step: int) -> OutputTranscriptDelta | None:
        delta = MOSHI_VOCAB.piece_text(piece)
        if not self.text:
            delta = delta.lstrip()
        if not delta:
            return None
        self.text += delta
        start = max(0, step) * FRAME_MS
        return OutputTranscriptDelta(delta, start, start + FRAME_MS)
