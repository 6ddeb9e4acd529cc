"""Client delegation, an answer source: when kame hands work to the application, and what its answer does. No I/O.

In client delegation kame asks no LLM: the application answers each delegation with
``session.commentary.append`` (spoken) or ``session.thinking.append`` (silent context). How often
kame delegates is ``session.kame.delegation``: ``turn`` (default: one per finalised user turn with
words, what GPT-Live clients such as Pipecat expect) or ``speculative`` (KAME's
:class:`~kame.oracle.debounce.Debouncer` on the stable transcript, each delegation superseding the last).

:class:`DelegationBook` judges appends: no delegation id is general context, the latest is current, an
older one is *late* and admitted only if every user turn since was a backchannel (the rule of answers
built on tools, docs/oracle.md, :func:`~kame.oracle.switch.only_backchannels`), else superseded (a
commentary is then not spoken). An id kame never issued is an error.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from kame.oracle.debounce import Debouncer
from kame.oracle.switch import only_backchannels
from kame.session.commands import CommandRefused

#: How often kame delegates (``session.kame.delegation``).
DelegationMode = Literal["turn", "speculative"]
DELEGATION_MODES: tuple[DelegationMode, ...] = ("turn", "speculative")
Standing = Literal["general", "current", "late", "superseded"]
#: Delegations remembered for appends (older ids are answered as superseded, not unknown).
MAX_REMEMBERED = 256


@dataclass(frozen=True)
class Delegation:
    id: str
    seq: int
    utterance: int
    offset_ms: int
    words: int  #: user words of its turn when it was created


@dataclass(frozen=True)
class Verdict:
    standing: Standing
    delegation: Delegation | None = None

    @property
    def speak(self) -> bool:
        """A commentary with this standing becomes an oracle answer."""
        return self.standing != "superseded"


#: Forgotten delegation ids still answered "superseded" (older ones: unknown, as if never issued).
MAX_FORGOTTEN = 4096


class DelegationBook:
    """The delegations of one session, and the user turns since each."""

    def __init__(self, backchannel_words: int = 3) -> None:
        self.backchannel_words = backchannel_words
        self._by_id: OrderedDict[str, Delegation] = OrderedDict()
        #: ids pushed out of ``_by_id``, themselves bounded (an hour's call has a few hundred turns)
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self.latest: Delegation | None = None
        self._turn_words: dict[int, int] = {}  # utterance -> most words heard in it
        self._seq = 0

    def add(self, delegation_id: str, utterance: int, offset_ms: int, words: int) -> Delegation:
        self._seq += 1
        d = Delegation(delegation_id, self._seq, utterance, offset_ms, words)
        self._by_id[delegation_id] = d
        while len(self._by_id) > MAX_REMEMBERED:
            old, _ = self._by_id.popitem(last=False)
            self._forgotten[old] = None
            if len(self._forgotten) > MAX_FORGOTTEN:
                self._forgotten.popitem(last=False)
        self.latest = d
        return d

    def heard(self, utterance: int, words: int) -> None:
        """The user's turn ``utterance`` has ``words`` words so far."""
        if words > self._turn_words.get(utterance, 0):
            self._turn_words[utterance] = words
        if len(self._turn_words) > MAX_REMEMBERED:
            del self._turn_words[min(self._turn_words)]

    def judge(self, delegation_id: str | None, *, kind: str = "commentary") -> Verdict:
        """The standing of an append (or a Responses round) for ``delegation_id``; an id never issued is refused."""
        if delegation_id is None:
            return Verdict("general")
        d = self._by_id.get(delegation_id)
        if d is None:
            if delegation_id in self._forgotten:
                return Verdict("superseded")
            raise CommandRefused("unknown_delegation",
                                 f"session.{kind}.append: no delegation {delegation_id[:48]!r} in this session",
                                 param="delegation_id")
        latest = self.latest
        if latest is None or d.id == latest.id:
            return Verdict("current", d)
        if self._only_backchannels_since(d):
            return Verdict("late", d)
        return Verdict("superseded", d)

    def _only_backchannels_since(self, d: Delegation) -> bool:
        latest = self.latest
        if latest is not None and latest.utterance == d.utterance:
            return False  # superseded within its own turn: a speculative delegation the transcript outgrew
        later = [words for utt, words in self._turn_words.items() if utt > d.utterance]
        return only_backchannels(later, self.backchannel_words)


@dataclass(frozen=True)
class Delegate:
    """Create a delegation now for ``utterance`` (its stable transcript has ``words`` words)."""

    utterance: int
    words: int
    reason: str


class DelegationPolicy:
    """User transcript progress -> when to delegate (``turn`` or ``speculative``)."""

    def __init__(self, mode: DelegationMode = "turn", *, min_new_words: int = 2, max_restarts: int = 5,
                 window_s: float = 2.0) -> None:
        self.mode: DelegationMode = mode
        self._debounce_args = (min_new_words, max_restarts, window_s)
        self._debouncer = self._new_debouncer()
        self._turn_words: dict[int, int] = {}
        self._pending_utterance: int | None = None

    def _new_debouncer(self) -> Debouncer:
        n, k, w = self._debounce_args
        return Debouncer(min_new_words=n, max_restarts=k, window_s=w, final_restarts="if_changed")

    def set_mode(self, mode: DelegationMode) -> None:
        if mode != self.mode:
            self.mode = mode
            self._debouncer = self._new_debouncer()

    def stable(self, now: float, utterance: int, stable_text: str) -> Delegate | None:
        """The utterance's stable transcript (as sent to the client) is now ``stable_text``."""
        words = len(stable_text.split())
        self._turn_words[utterance] = max(words, self._turn_words.get(utterance, 0))
        if self.mode != "speculative":
            return None
        trigger = self._debouncer.on_partial(now, utterance, stable_text)
        return self._take(trigger.start, trigger.retry_at, utterance, "words", words)

    def final(self, now: float, utterance: int, text: str) -> Delegate | None:
        """The utterance is final with ``text`` (kame has sent all its words by now)."""
        words = len(text.split())
        self._turn_words.pop(utterance, None)
        if self.mode == "turn":
            return Delegate(utterance, words, "turn") if words > 0 else None
        trigger = self._debouncer.on_final(now, utterance, text)
        return self._take(trigger.start, trigger.retry_at, utterance, "final", words)

    def poll(self, now: float) -> Delegate | None:
        """A speculative delegation the rate limit held back, if it may go now."""
        if self.mode != "speculative" or self._pending_utterance is None:
            return None
        utterance = self._pending_utterance
        trigger = self._debouncer.poll(now)
        return self._take(trigger.start, trigger.retry_at, utterance, "words", self._turn_words.get(utterance, 0))

    def _take(self, start: bool, retry_at: float | None, utterance: int, reason: str, words: int) -> Delegate | None:
        if start:
            self._pending_utterance = None
            return Delegate(utterance, words, reason)
        self._pending_utterance = utterance if retry_at is not None else None
        return None
