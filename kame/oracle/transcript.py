"""Conversation state the oracle loop needs: turns, the user's partial, who spoke last.

* User input comes from the ASR as *utterances*: ``user_partial(text)`` is the
  full current hypothesis of the utterance in progress, ``user_final(text)``
  commits it. The first event of an utterance opens a new user turn and
  increments :attr:`Transcript.user_turn_id`; an LLM request is tagged with
  that id, and an answer whose id is no longer current is stale.
* Assistant words (rebuilt from Moshi's pieces) go to the current assistant
  turn: the one after the last committed user turn.
* :attr:`Transcript.assistant_spoke` mirrors the training data: oracle events
  existed only while the *user* was the last to finish a word; once the
  assistant finishes a word after the user's last one, training never starts
  a new sequence (the ``freeze_when_speaking`` policy reads this).
* History is bounded (characters: a memory bound; turns if set); the oldest turns are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kame.oracle.pieces import PieceWords
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from kame.oracle.config import OracleConfig

Role = Literal["user", "assistant", "system"]


@dataclass(frozen=True)
class Turn:
    """One stretch of the conversation.

    ``key`` names a turn a client can refer to (a message it added, a user
    turn the ASR heard): turns with different keys are never merged, so one
    can be removed alone. ``steps``: for the assistant's words, the output
    step at which each word was completed (one per word of ``text``), so
    that what the user did not hear can be removed.
    """

    role: Role
    text: str
    key: str | None = None
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class UserUpdate:
    """What a user event changed (the debouncer and barge-in logic read it)."""

    turn_id: int  #: user turn the event belongs to
    text: str  #: the utterance's text (partial hypothesis or final)
    word_count: int
    new_turn: bool  #: this event opened the turn (the user started speaking)
    words_grew: bool  #: the user finished at least one more word
    final: bool


@dataclass(frozen=True)
class TranscriptView:
    """Immutable snapshot for prompt building."""

    turns: tuple[Turn, ...]
    pending_user: str  #: partial text of the utterance in progress ("" if none)
    user_turn_id: int


def _clean(text: str) -> str:
    return " ".join(text.split())


class Transcript:
    def __init__(
        self,
        *,
        max_turns: int | None = None,
        max_chars: int | None = 400_000,
        piece_of: Callable[[int], str] | None = None,
        vocab: TextVocab = MOSHI_VOCAB,
        word_end_idle_steps: int | None = 3,
    ) -> None:
        """``piece_of`` (SentencePiece ``id_to_piece``) enables :meth:`assistant_token`."""
        if max_turns is not None and max_turns < 1:
            raise ValueError("max_turns must be >= 1 or None")
        if max_chars is not None and max_chars < 1:
            raise ValueError("max_chars must be >= 1 or None")
        self._max_turns = max_turns
        self._max_chars = max_chars
        self._pieces = PieceWords(piece_of, vocab=vocab, idle_steps_end_word=word_end_idle_steps)
        self._turns: list[Turn] = []
        self._chars = 0  #: characters of the turns' texts (kept up to date: an hour-long call has thousands of turns)
        self._pending = ""
        self._pending_count = 0
        self._open = False
        self._since_piece: int | None = None
        self._step: int | None = None
        self.user_turn_id = 0
        self.last_word_by: Role | None = None

    @classmethod
    def from_config(cls, config: OracleConfig, piece_of: Callable[[int], str] | None = None,
                    vocab: TextVocab = MOSHI_VOCAB) -> Transcript:
        return cls(
            max_turns=config.history_max_turns,
            max_chars=config.history_max_chars,
            piece_of=piece_of,
            vocab=vocab,
            word_end_idle_steps=config.word_end_pad_steps,
        )

    # ------------------------------------------------------------------ reading
    @property
    def turns(self) -> tuple[Turn, ...]:
        return tuple(self._turns)

    @property
    def pending_user(self) -> str:
        return self._pending

    @property
    def user_open(self) -> bool:
        """A user utterance is in progress (partials seen, no final yet)."""
        return self._open

    @property
    def assistant_spoke(self) -> bool:
        """The assistant finished a word after the user's last word."""
        return self.last_word_by == "assistant"

    @property
    def assistant_pending(self) -> str:
        """The assistant word being spelled right now (not yet in the history)."""
        return self._pieces.pending

    def assistant_speaking(self, idle_steps: int) -> bool:
        """The assistant produced a text piece within the last ``idle_steps`` steps."""
        return self._since_piece is not None and self._since_piece < idle_steps

    def view(self) -> TranscriptView:
        return TranscriptView(tuple(self._turns), self._pending, self.user_turn_id)

    def is_current(self, turn_id: int) -> bool:
        """Whether an answer requested for ``turn_id`` still belongs to the current user turn."""
        return turn_id == self.user_turn_id

    # ------------------------------------------------------------------ user
    def user_partial(self, text: str) -> UserUpdate | None:
        """The current utterance's hypothesis so far; None if it is empty."""
        text = _clean(text)
        if not text:
            return None
        new_turn = self._open_turn()
        count = len(text.split())
        grew = count > self._pending_count
        self._pending, self._pending_count = text, count
        if grew:
            self.last_word_by = "user"
        return UserUpdate(self.user_turn_id, text, count, new_turn, grew, final=False)

    def user_final(self, text: str, key: str | None = None) -> UserUpdate:
        """The utterance is over: commit ``text`` as (part of) the user's turn (``key``: see :class:`Turn`)."""
        text = _clean(text)
        new_turn = self._open_turn() if text else False
        count = len(text.split())
        grew = count > self._pending_count
        if grew:
            self.last_word_by = "user"
        if text:
            self._append("user", text, key)
        self._pending, self._pending_count, self._open = "", 0, False
        return UserUpdate(self.user_turn_id, text, count, new_turn, grew, final=True)

    def _open_turn(self) -> bool:
        if self._open:
            return False
        self._open = True
        self._pending_count = 0
        self.user_turn_id += 1
        return True

    # ------------------------------------------------------------------ assistant
    def assistant_token(self, token_id: int, step: int | None = None) -> list[str]:
        """Moshi's text token of one step (call every step, pads included); ``step``: the output step."""
        self._step = step
        words = self._pieces.push(token_id)
        self._tick(self._pieces.idle_steps == 0)
        return self._assistant_words(words)

    def assistant_piece(self, piece: str) -> list[str]:
        """One step's piece as text (for callers that decode ids themselves)."""
        words = self._pieces.push_piece(piece)
        self._tick(True)
        return self._assistant_words(words)

    def assistant_idle(self, step: int | None = None) -> list[str]:
        """A step with no assistant text."""
        self._step = step
        words = self._pieces.idle()
        self._tick(False)
        return self._assistant_words(words)

    def assistant_flush(self) -> list[str]:
        """End the assistant word being spelled (e.g. at session end)."""
        return self._assistant_words(self._pieces.flush())

    def add_assistant_words(self, words: Iterable[str]) -> None:
        """Append complete words to the current assistant turn."""
        self._assistant_words([w for w in words if w.strip()])

    def _tick(self, had_piece: bool) -> None:
        if had_piece:
            self._since_piece = 0
        elif self._since_piece is not None:
            self._since_piece += 1

    def _assistant_words(self, words: list[str]) -> list[str]:
        if words:
            text = " ".join(words)
            steps = (self._step,) * len(text.split()) if self._step is not None else ()
            self._append("assistant", text, steps=steps)
            self.last_word_by = "assistant"
        return words

    # ------------------------------------------------------------------ what a client changes
    def add_item(self, key: str, role: Role, text: str) -> None:
        """A message a client put into the conversation: a turn of its own, at the end."""
        text = _clean(text)
        if text:
            self._turns.append(Turn(role, text, key))
            self._chars += len(text)
            self._trim()

    def forget(self, key: str) -> bool:
        """Remove the turns named ``key``; False when there were none."""
        kept = [t for t in self._turns if t.key != key]
        removed = len(kept) != len(self._turns)
        self._turns = kept
        self._chars = sum(len(t.text) for t in kept)
        return removed

    def forget_steps(self, start_step: int, end_step: int) -> int:
        """Remove the assistant's words completed at steps in ``[start_step, end_step)``; how many went."""
        removed = 0
        out: list[Turn] = []
        for turn in self._turns:
            if turn.role != "assistant" or not turn.steps:
                out.append(turn)
                continue
            words = turn.text.split()
            keep = [(w, s) for w, s in zip(words, turn.steps) if not start_step <= s < end_step]
            removed += len(words) - len(keep)
            if keep:
                out.append(Turn(turn.role, " ".join(w for w, _ in keep), turn.key, tuple(s for _, s in keep)))
        self._turns = out
        self._chars = sum(len(t.text) for t in out)
        return removed

    # ------------------------------------------------------------------ history
    def _append(self, role: Role, text: str, key: str | None = None, steps: tuple[int, ...] = ()) -> None:
        last = self._turns[-1] if self._turns else None
        if last is not None and last.role == role and last.key == key and role != "system":
            merged = last.steps + steps if last.steps and steps else ()
            self._turns[-1] = Turn(role, f"{last.text} {text}", key, merged)
            self._chars += 1 + len(text)
        else:
            self._turns.append(Turn(role, text, key, steps))
            self._chars += len(text)
        self._trim()

    def _trim(self) -> None:
        if self._max_turns is not None and len(self._turns) > self._max_turns:
            del self._turns[: len(self._turns) - self._max_turns]
            self._chars = sum(len(t.text) for t in self._turns)
        if self._max_chars is None or self._chars <= self._max_chars:
            return
        drop = 0
        while drop < len(self._turns) - 1 and self._chars > self._max_chars:
            self._chars -= len(self._turns[drop].text)
            drop += 1
        del self._turns[:drop]  # at once: popping the front one by one is quadratic
        if self._chars > self._max_chars:
            last = self._turns[0]
            text = tail_words(last.text, self._max_chars)
            steps = last.steps[len(last.steps) - len(text.split()):] if last.steps else ()
            self._turns[0] = Turn(last.role, text, last.key, steps)
            self._chars = len(text)


def tail_words(text: str, max_chars: int) -> str:
    """The longest run of whole final words of ``text`` within ``max_chars``."""
    if len(text) <= max_chars:
        return text
    cut = text[len(text) - max_chars :]
    if text[len(text) - max_chars - 1] != " ":
        cut = cut.partition(" ")[2]
    return cut
