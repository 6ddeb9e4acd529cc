"""Local agreement: turn a flickering re-decoded hypothesis into a stable partial.

Whisper re-decodes the whole growing utterance each time, and its last
words change while they are still being spoken. A word is *committed* once
the last ``n`` hypotheses agree on it (and on every word before it);
committed words never change within a turn. The partial shown is the
committed words plus the newest hypothesis's tentative tail.
"""

from __future__ import annotations

import re
from collections import deque

_NOT_WORD = re.compile(r"[^\w']+")


def word_key(word: str) -> str:
    """Comparison form of a word: case and punctuation do not count as disagreement."""
    return _NOT_WORD.sub("", word.lower())


def _common_prefix(hyps: list[list[str]]) -> int:
    k = 0
    for column in zip(*hyps):
        if len({word_key(w) for w in column}) != 1:
            break
        k += 1
    return k


class LocalAgreement:
    """Per-turn stabiliser; make a new one for each turn."""

    def __init__(self, n: int = 2) -> None:
        self._history: deque[list[str]] = deque(maxlen=max(1, n))
        self.committed: list[str] = []

    def update(self, hypothesis: str) -> tuple[str, str]:
        """Take the newest hypothesis; return ``(partial, stable)`` texts."""
        words = hypothesis.split()
        self._history.append(words)
        if len(self._history) == self._history.maxlen:
            k = _common_prefix(list(self._history))
            if k > len(self.committed):
                self.committed = self.committed + words[len(self.committed) : k]
        # Committed words keep their identity; only case and punctuation follow the newest hypothesis
        # ("them." committed at a pause becomes "them" once the sentence goes on).
        shown = [
            new if i < len(words) and word_key(new := words[i]) == word_key(old) else old
            for i, old in enumerate(self.committed)
        ]
        tail = words[len(self.committed) :]
        return " ".join(shown + tail), " ".join(shown)


def drop_loops(text: str) -> str:
    """Cut the looping Whisper produces on a cut-off turn.

    Two shapes: a phrase repeated back to back ("for me for me"; a single
    word only from its third time: "that that" is English) and a hypothesis
    that ends by starting the turn over ("Please tell me the way. Please
    tell me"). Both are kept once.
    """
    words = text.split()
    keys = [word_key(w) for w in words]
    for j in range(2, len(keys) - 1):  # restart: the hypothesis ends by starting over
        if keys[j:] == keys[: len(keys) - j]:
            words, keys = words[:j], keys[:j]
            break
    out: list[str] = []
    out_keys: list[str] = []
    i = 0
    while i < len(words):
        for n in (4, 3, 2, 1):
            # A phrase said twice in a row, or a single word a third time ("that that" is English).
            reps = 2 if n > 1 else 3
            phrase = keys[i : i + n]
            if len(phrase) == n and out_keys[len(out_keys) - n * (reps - 1) :] == phrase * (reps - 1):
                i += n
                break
        else:
            out.append(words[i])
            out_keys.append(keys[i])
            i += 1
    return " ".join(out)
