"""What a new LLM answer, or a user barge-in, does to the oracle stream.

Policies for a new answer (see docs/oracle.md):

* ``reset`` - every new answer restarts the stream (the published server).
* ``keep_if_same_start`` - if the new answer begins with the words already
  fed for this user turn, keep the sequence and append only its
  continuation; otherwise reset.
* ``freeze_when_speaking`` - reset as usual until the assistant has finished
  a word after the user's last word; from then on no answer replaces the one
  already fed for this turn (training never starts a sequence then).

An answer for an older user turn is ignored (stale), with one exception.

Answers built on tool results (``built_on_tools``: the LLM called a
function and answered with its result) arrive late by nature, so, under
every policy: such an answer starts a new oracle sequence (reset), even
after the assistant has started speaking; and it is not stale when the only
user turns since its own are backchannels (each shorter than
``oracle.tool_backchannel_words`` words; the caller says so with
``backchannel_only``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["reset", "keep_if_same_start", "freeze_when_speaking"]
BargeInPolicy = Literal["keep", "clear"]
Action = Literal["reset", "append", "wait", "ignore"]

_NOT_WORD = re.compile(r"[^\w']+")


@dataclass(frozen=True)
class FeedState:
    """The oracle sequence currently fed to this session's front-end."""

    turn_id: int | None = None  #: user turn whose answer is being fed; None: nothing fed
    fed_words: tuple[str, ...] = field(default_factory=tuple)  #: sanitized words pushed so far
    assistant_spoke: bool = False  #: the assistant finished a word after the user's last word


@dataclass(frozen=True)
class SwitchDecision:
    """``reset``: clear the FIFO and start a new sequence with this answer.
    ``append``: continue the current sequence, feeding only the answer's words
    after the first ``skip_words`` (use ``WordStreamTokenizer.continuation``).
    ``wait``: undecided, ask again when more of the answer has arrived.
    ``ignore``: drop this answer (cancel its stream)."""

    action: Action
    reason: str
    skip_words: int = 0


def _norm(word: str) -> str:
    return _NOT_WORD.sub("", word.lower())


def same_words(a: Sequence[str], b: Sequence[str]) -> bool:
    """Word lists equal up to case and punctuation."""
    return len(a) == len(b) and all(_norm(x) == _norm(y) for x, y in zip(a, b))


def decide_switch(
    policy: Policy,
    state: FeedState,
    *,
    answer_turn_id: int,
    current_turn_id: int,
    answer_words: Sequence[str],
    answer_complete: bool,
    built_on_tools: bool = False,
    backchannel_only: bool = False,
) -> SwitchDecision:
    """Decide what a new answer does.

    ``answer_words`` are its sanitized words known so far (``settled_words``
    of the text received, or ``spoken_words`` once complete). Call again
    while the result is ``wait``; once it is ``reset`` or ``append`` the
    answer owns the stream and its later words are just fed.
    """
    if answer_turn_id != current_turn_id and not (built_on_tools and backchannel_only):
        return SwitchDecision("ignore", "stale: the answer belongs to an earlier user turn")
    if not answer_words:
        if answer_complete:
            return SwitchDecision("ignore", "empty answer")
        return SwitchDecision("wait", "no complete word yet")
    if built_on_tools:
        return SwitchDecision("reset", "answer built on tool results: a new sequence whatever the policy")
    feeding_this_turn = state.turn_id == current_turn_id and bool(state.fed_words)
    if policy == "reset" or not feeding_this_turn:
        return SwitchDecision("reset", "new answer" if feeding_this_turn else "first answer of the turn")
    if policy == "freeze_when_speaking":
        if state.assistant_spoke:
            return SwitchDecision("ignore", "frozen: the assistant has started its reply")
        return SwitchDecision("reset", "new answer before the assistant spoke")
    if policy == "keep_if_same_start":
        fed = state.fed_words
        n = min(len(fed), len(answer_words))
        if not same_words(fed[:n], answer_words[:n]):
            return SwitchDecision("reset", "the answer starts differently")
        if len(answer_words) >= len(fed):
            return SwitchDecision("append", "the answer continues what was fed", skip_words=len(fed))
        if answer_complete:
            return SwitchDecision("ignore", "the answer only repeats what was fed")
        return SwitchDecision("wait", "the answer so far matches what was fed")
    raise ValueError(f"unknown answer-switch policy {policy!r}")


def only_backchannels(later_turn_words: Sequence[int], max_words: int) -> bool:
    """True when every user turn after the answer's own has fewer than ``max_words`` words."""
    return all(n < max_words for n in later_turn_words)


@dataclass(frozen=True)
class BargeInDecision:
    """``clear_queue``: drop the oracle tokens still queued for the old answer."""

    barge_in: bool
    clear_queue: bool
    reason: str


def decide_barge_in(policy: BargeInPolicy, *, new_user_turn: bool, assistant_speaking: bool) -> BargeInDecision:
    """A user turn starting while the assistant speaks is a barge-in.

    ``keep`` (default) lets the queued answer run out, as in training where a
    written sequence stays in the stream whatever the user does; ``clear``
    empties the queue so the front-end stops being steered by the old answer.
    """
    if not (new_user_turn and assistant_speaking):
        return BargeInDecision(False, False, "no barge-in")
    if policy == "clear":
        return BargeInDecision(True, True, "barge-in: queued answer cleared")
    if policy == "keep":
        return BargeInDecision(True, False, "barge-in: queued answer kept")
    raise ValueError(f"unknown barge-in policy {policy!r}")
