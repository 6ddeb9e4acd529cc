"""Streamed LLM answer -> oracle token ids, one SentencePiece encode of the whole text.

Training wrote each prediction as ONE ``encode`` of the whole (sanitized)
text. Encoding streamed deltas separately gives other pieces (``"▁,"`` for
``","``, an extra ``"▁"`` where a chunk split a word), so this tokenizer
re-encodes the answer up to its last settled word on every chunk and yields
only the ids beyond those already yielded.

Yielded ids can never be taken back (they are already queued for the model),
so the re-encode must extend what was yielded. SentencePiece models trained
with the default ``split_by_whitespace`` never put a piece across a space,
so appending whole words does not change earlier ids; the tests check that
for unigram and BPE models. For a tokenizer where it does change them:

* ``lookahead_words=k`` commits a word only once ``k`` more words are settled
  and the encoding up to it is a prefix of the encoding of all settled words
  (prevents most changes, costs ``k`` words of latency).
* If a re-encode still disagrees with the yielded ids (a *resync*), the
  yielded ids stay, and the words after them start a new *segment* encoded
  on its own. The result is the concatenation of whole-word encodings: no
  text lost or repeated, only a different split at one word boundary.
  :attr:`WordStreamTokenizer.resyncs` counts these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kame.oracle.sanitize import SanitizeOptions, settled_words, spoken_words

if TYPE_CHECKING:
    from kame.oracle.config import OracleConfig

Encode = Callable[[str], Sequence[int]]


def _extends(longer: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(longer) >= len(prefix) and list(longer[: len(prefix)]) == list(prefix)


class WordStreamTokenizer:
    """Feed an answer chunk by chunk; get the new oracle ids of each settled word.

    Invariant (no resync, no ``max_words`` cut): after each :meth:`feed`,
    ``ids == encode(" ".join(settled_words(text_so_far)))``; after
    :meth:`flush`, ``ids == encode(sanitize(full_text))``. A word is settled
    when it is complete (followed by whitespace) and a token that cannot add
    punctuation to it has begun: with LLM chunks like ``" word"`` that is the
    chunk that completes it.

    The first non-empty return value holds exactly the first word's ids: the
    caller resets the oracle FIFO with ``[start_id, *those]``.
    """

    def __init__(
        self,
        encode: Encode,
        *,
        options: SanitizeOptions | None = None,
        max_words: int | None = None,
        lookahead_words: int = 0,
    ) -> None:
        if lookahead_words < 0:
            raise ValueError("lookahead_words must be >= 0")
        if max_words is not None and max_words < 1:
            raise ValueError("max_words must be >= 1 or None")
        self._encode = encode
        self._options = options or SanitizeOptions()
        self._max_words = max_words
        self._lookahead = lookahead_words
        self._raw = ""
        self._carried: list[str] = []  # words of an earlier answer this one continues
        self._skip = 0  # leading words of this answer that the carried words stand for
        self._words: list[str] = []  # committed words of the sequence
        self._ids: list[int] = []  # yielded ids of the sequence
        self._seg_word = 0  # current segment: first word index ...
        self._seg_id = 0  # ... and first id index
        self._flushed = False
        self.resyncs = 0

    @classmethod
    def from_config(cls, encode: Encode, config: OracleConfig) -> WordStreamTokenizer:
        return cls(
            encode,
            options=config.sanitize.options(),
            max_words=config.max_fed_words,
            lookahead_words=config.tokenizer_lookahead_words,
        )

    # ------------------------------------------------------------------ state
    @property
    def ids(self) -> tuple[int, ...]:
        """Every id yielded for this sequence (carried ids of a continuation included)."""
        return tuple(self._ids)

    @property
    def words(self) -> tuple[str, ...]:
        """The sanitized words whose ids were yielded."""
        return tuple(self._words)

    @property
    def text(self) -> str:
        return " ".join(self._words)

    @property
    def done(self) -> bool:
        """Flushed, or ``max_words`` reached: nothing more will be yielded (cancel the LLM)."""
        return self._flushed or (self._max_words is not None and len(self._words) >= self._max_words)

    # ------------------------------------------------------------------ feeding
    def feed(self, chunk: str) -> list[int]:
        """Add a chunk of the answer; return the ids of newly settled words."""
        if self._flushed:
            raise RuntimeError("feed() after flush()")
        self._raw += chunk
        if self.done:
            return []
        return self._advance(settled_words(self._raw, self._options), final=False)

    def flush(self) -> list[int]:
        """The answer is complete: return the ids of its remaining words."""
        if self._flushed:
            return []
        new = [] if self.done else self._advance(spoken_words(self._raw, self._options), final=True)
        self._flushed = True
        return new

    def continuation(self, skip_words: int) -> WordStreamTokenizer:
        """A tokenizer for a NEW answer that continues this sequence.

        The new answer's first ``skip_words`` words are taken as already fed
        (the answer-switch policy found they match); only its later words are
        yielded, encoded together with the words already fed.
        """
        if not 0 <= skip_words <= len(self._words):
            raise ValueError("skip_words must be between 0 and the number of fed words")
        nxt = WordStreamTokenizer(
            self._encode, options=self._options, max_words=self._max_words, lookahead_words=self._lookahead
        )
        nxt._carried = list(self._words)
        nxt._words = list(self._words)
        nxt._ids = list(self._ids)
        nxt._seg_word, nxt._seg_id = self._seg_word, self._seg_id
        nxt._skip = skip_words
        nxt.resyncs = self.resyncs
        return nxt

    # ------------------------------------------------------------------ internals
    def _advance(self, answer_words: list[str], final: bool) -> list[int]:
        candidate = self._carried + answer_words[self._skip :]
        if self._max_words is not None:
            candidate = candidate[: self._max_words]
            final = final or len(candidate) == self._max_words
        upto = len(candidate) if final else len(candidate) - self._lookahead
        if upto <= len(self._words):
            return []
        if final or self._lookahead == 0:
            encoded = self._encode_segment(candidate, upto)
            if not _extends(encoded, self._segment_ids()):
                self._resync()
                encoded = self._encode_segment(candidate, upto)
            target = upto
        else:
            reference = self._encode_segment(candidate, len(candidate))
            if not _extends(reference, self._segment_ids()):
                self._resync()
                reference = self._encode_segment(candidate, len(candidate))
            for target in range(upto, len(self._words), -1):
                encoded = self._encode_segment(candidate, target)
                if _extends(reference, encoded) and _extends(encoded, self._segment_ids()):
                    break
            else:
                return []
        new = [int(i) for i in encoded[len(self._segment_ids()) :]]
        self._ids.extend(new)
        self._words = candidate[:target]
        return new

    def _segment_ids(self) -> list[int]:
        return self._ids[self._seg_id :]

    def _encode_segment(self, words: list[str], end: int) -> list[int]:
        return list(self._encode(" ".join(words[self._seg_word : end])))

    def _resync(self) -> None:
        """Yielded ids disagree with a re-encode: start a new segment after them."""
        self.resyncs += 1
        self._seg_word = len(self._words)
        self._seg_id = len(self._ids)
