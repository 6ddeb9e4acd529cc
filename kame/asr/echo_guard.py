"""The echo guard: no user turn (nor barge-in) for speech that only repeats what the assistant just said.

For clients without echo cancellation, whose speakers send the assistant's voice back to the ASR
(the full story, limits and cost: docs/asr.md). Pure: no torch, no I/O, no clock of its own.

* :class:`AssistantWords` - the assistant's recent words, timed on the session's audio clock (output
  step ``n`` is produced when input frame ``n`` is fed), never the wall clock;
* :func:`match_echo` - a fuzzy local alignment of a hypothesis to those words: words outside the
  aligned stretch, or inserted in it, are the user's;
* :class:`EchoGuard` - holds an utterance that starts while assistant words are in the window (no
  ``speech_started``, no partial) until its words decide: the user's speech is released in order, an
  echo is dropped at its final (:class:`EchoVerdict`). A user repeating the assistant verbatim is echo.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache

from kame.asr.events import AsrEvent, EventType
from kame.oracle.numbers import spell_integer
from kame.oracle.pieces import PieceWords

#: The most assistant words one hypothesis is aligned with (the latest; ~40 s of fluent speech).
MAX_SAID_WORDS = 100
#: Output frames per second of the front-end (80 ms steps): step ``n`` starts at ``n * STEP_S``.
STEP_S = 0.08
_SPLIT = re.compile(r"[\s\-\u2010-\u2015/]+")
_NOT_WORD = re.compile(r"[^\w']+")
_DIGITS = re.compile(r"^\d+$")


@dataclass(frozen=True)
class EchoOptions:
    """How the guard judges (``asr.echo_guard`` in the config; see docs/asr.md)."""

    #: Longest delay between the assistant saying a word and its echo reaching the ASR (network, jitter
    #: buffer, playback, the way back): older words cannot be what the user's utterance echoes.
    window_s: float = 3.0
    #: Words of the hypothesis the assistant did not say (before, after or inserted in the matched
    #: stretch) that an echo may still have (0: any word of the user's own makes it the user's turn).
    max_extra_words: int = 0
    #: Matched words the ASR may have mis-heard beyond recognition, as a fraction of the hypothesis.
    max_misheard_fraction: float = 0.5
    #: Two words of at least 4 letters are the same word when their letters are this similar.
    similar: float = 0.75
    #: Garbled words at either end of a long echo taken as mis-heard (see :func:`match_echo`).
    edge_words: int = 3
    edge_min_matched: int = 3
    edge_delay_s: float = 1.0


@dataclass(frozen=True)
class EchoMatch:
    """How a hypothesis aligns with the assistant's recent words."""

    words: int  #: words in the hypothesis
    matched: int  #: its words the assistant said (in order, up to mis-hearing)
    misheard: int  #: its words aligned with an assistant word they do not resemble
    extra: int  #: its words the assistant did not say: outside the matched stretch or inserted in it
    start_s: float | None = None  #: when the assistant said the first matched word

    def is_echo(self, options: EchoOptions) -> bool:
        return (
            self.matched > 0
            and self.extra <= options.max_extra_words
            and self.misheard <= options.max_misheard_fraction * self.words
        )

    def clearly_user(self, options: EchoOptions) -> bool:
        """Whether a *partial* is surely the user's: five words or more and none the assistant's, or three
        extra words more than an echo may have. A partial is released on this stricter test because
        a release is final, and an echo's first partials are short and often mis-heard."""
        if self.matched == 0:
            return self.words >= 5  # Whisper makes up to four garbled words of a quiet echo's start
        return self.extra >= options.max_extra_words + 3


def normalise(text: str) -> list[str]:
    """Words compared by the guard: lower case, no punctuation, numbers spelled ("3" -> "three")."""
    out: list[str] = []
    for raw in _SPLIT.split(text.lower()):
        word = _NOT_WORD.sub("", raw).strip("'")
        if not word:
            continue
        if _DIGITS.match(word) and len(word) <= 9:
            out += spell_integer(int(word)).split()
        else:
            out.append(word)
    return out


@lru_cache(maxsize=8192)
def similarity(a: str, b: str) -> float:
    """1.0 for the same word; letters' similarity for words of 4 letters or more; else 0."""
    if a == b:
        return 1.0
    if min(len(a), len(b)) < 4 or abs(len(a) - len(b)) > 3:
        return 0.0
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    if matcher.real_quick_ratio() < 0.5 or matcher.quick_ratio() < 0.5:  # cheap upper bounds first
        return 0.0
    return matcher.ratio()


# Scores of the local alignment: a matched word gains; a mis-heard one (aligned with an assistant word it
# does not resemble) loses a quarter as much, so an echo garbled in places (three mis-heard words in a
# row) stays one stretch, but a stretch never begins or ends with one; an ASR word with no assistant
# word (an insertion: the user's) loses more, yet less than a mis-heard word plus a dropped one, so a
# word the user adds is counted as theirs; an assistant word the ASR dropped costs little.
_MATCH, _MISMATCH, _INSERT, _DROP = 1.0, -0.25, -0.5, -0.3


def match_echo(
    hypothesis: Sequence[str],
    said: Sequence[tuple[str, float]],
    options: EchoOptions = EchoOptions(),
    *,
    final: bool = True,
    start_s: float | None = None,
) -> EchoMatch:
    """Align ``hypothesis`` (normalised words) with ``said`` (the assistant's normalised words and their
    times, in order). A partial's last word may be cut (``final`` False): when it is the only word left
    over at the end, it is not counted.

    ``start_s``, when the utterance began: the ASR garbles an echo's first and last words most (it hears
    them cut, over the room). When at least ``edge_min_matched`` words matched, up to ``edge_words``
    words before the matched stretch count as mis-heard (not the user's) if the assistant said words
    between ``edge_delay_s`` before the utterance began and the stretch (what they would echo); likewise
    after it, if the assistant said words after the stretch. A user who says "yes" after the assistant
    said "... is Paris" starts later than that, so "yes" stays the user's."""
    if len(said) > MAX_SAID_WORDS:  # the event loop runs this on every partial: bound the work
        said = said[-MAX_SAID_WORDS:]
    n, m = len(hypothesis), len(said)
    if n == 0 or m == 0:
        return EchoMatch(words=n, matched=0, misheard=0, extra=n)
    sim = [[similarity(h, w) for w, _ in said] for h in hypothesis]
    if not final and len(hypothesis[-1]) >= 2:  # a partial's last word may be cut: a prefix is the same word
        sim[-1] = [1.0 if w.startswith(hypothesis[-1]) else s for s, (w, _) in zip(sim[-1], said)]
    # h[i][j]: best score of an alignment ending at hypothesis word i-1 and assistant word j-1
    h = [[0.0] * (m + 1) for _ in range(n + 1)]
    move = [[0] * (m + 1) for _ in range(n + 1)]  # 0 stop, 1 diagonal, 2 insertion, 3 drop
    best, best_at = 0.0, (0, 0)
    for i in range(1, n + 1):
        row, prev = h[i], h[i - 1]
        for j in range(1, m + 1):
            diag = prev[j - 1] + (_MATCH if sim[i - 1][j - 1] >= options.similar else _MISMATCH)
            ins = prev[j] + _INSERT
            drop = row[j - 1] + _DROP
            score, how = max((0.0, 0), (diag, 1), (ins, 2), (drop, 3))
            row[j], move[i][j] = score, how
            matches = how == 1 and sim[i - 1][j - 1] >= options.similar
            if score >= best and matches:  # a stretch ends on a matched word; ties: the longer stretch
                best, best_at = score, (i, j)
    if best <= 0.0:
        return EchoMatch(words=n, matched=0, misheard=0, extra=n)
    i, j = best_at
    last = i - 1
    matched = misheard = inserted = 0
    first, first_said = last, j - 1
    while i > 0 and j > 0 and move[i][j] != 0:
        how = move[i][j]
        if how == 1:
            if sim[i - 1][j - 1] >= options.similar:
                matched += 1
            else:
                misheard += 1
            first, first_said = i - 1, j - 1
            i, j = i - 1, j - 1
        elif how == 2:
            inserted += 1
            i -= 1
        else:
            j -= 1
    leading, trailing = first, n - 1 - last
    if not final and trailing == 1:
        trailing = 0  # a partial's last word is tentative (it may be cut): the final decides on it
    if matched >= (options.edge_min_matched if final else 1):  # a partial only holds: be lenient
        first_t = said[first_said][1]
        if start_s is not None and 0 < leading <= options.edge_words and any(
                start_s - options.edge_delay_s <= t < first_t for _, t in said[:first_said]):
            misheard, leading = misheard + leading, 0
        if 0 < trailing <= options.edge_words and best_at[1] < m:
            misheard, trailing = misheard + trailing, 0
    return EchoMatch(words=n, matched=matched, misheard=misheard, extra=leading + trailing + inserted,
                     start_s=said[first_said][1])


class AssistantWords:
    """The words the assistant said lately, with the time (session audio seconds) each began.

    Fed every output step with the step's text piece (None for a step without one); words are rebuilt
    from SentencePiece pieces (``▁`` starts a word). Only ``keep_s`` seconds are kept.
    """

    def __init__(self, keep_s: float = 40.0, max_words: int = 600) -> None:
        self.keep_s = keep_s
        self._words: deque[tuple[str, float]] = deque(maxlen=max_words)
        self._assembler = PieceWords(idle_steps_end_word=3)
        self._pending_t: float | None = None
        self.last_t: float | None = None  #: when the assistant's last piece came

    def step(self, piece: str | None, step: int) -> None:
        """One output step (``step`` counts from the session's start) and its text piece, if any."""
        t = step * STEP_S
        if piece is None:
            self._add(self._assembler.idle())
            return
        starts = piece.startswith("\u2581") or not self._assembler.pending
        self._add(self._assembler.push_piece(piece), t)
        if starts or self._pending_t is None:
            self._pending_t = t
        self.last_t = t
        while self._words and self._words[0][1] < t - self.keep_s:
            self._words.popleft()

    def _add(self, words: list[str], t: float | None = None) -> None:
        """Words completed: they began when the pending word did (``t`` if none was pending)."""
        if not words:
            return
        at = self._pending_t if self._pending_t is not None else (t or 0.0)
        for word in words:
            for norm in normalise(word):
                self._words.append((norm, at))
        self._pending_t = None

    def said(self, start_s: float, end_s: float) -> list[tuple[str, float]]:
        """The words begun between ``start_s`` and ``end_s`` (the word being spelled included)."""
        out = [(w, t) for w, t in self._words if start_s <= t <= end_s]
        pending = self._assembler.pending
        if pending and self._pending_t is not None and start_s <= self._pending_t <= end_s:
            out += [(w, self._pending_t) for w in normalise(pending)]
        return out

    def spoke_since(self, t: float) -> bool:
        return self.last_t is not None and self.last_t >= t

    def clear(self) -> None:
        self._words.clear()
        self._assembler = PieceWords(idle_steps_end_word=3)
        self._pending_t = self.last_t = None


@dataclass(frozen=True)
class EchoVerdict:
    """How the guard judged an utterance it held: ``echo`` (dropped: no turn) or the user's (released)."""

    utterance: int
    audio_s: float
    echo: bool
    text: str
    match: EchoMatch
    #: How long after the assistant said the matched words their echo began (None: no match).
    delay_s: float | None = None


@dataclass
class _Held:
    """An utterance held back until its words say whose it is."""

    utterance: int
    start_s: float
    started: AsrEvent | None = None
    partial: AsrEvent | None = None  #: the latest
    stopped: AsrEvent | None = None
    judged: str = ""  #: the stable words last judged (a partial repeating them is not judged again)

    def events(self) -> list[AsrEvent]:
        return [e for e in (self.started, self.partial, self.stopped) if e is not None]


class EchoGuard:
    """A session's ASR events in, the events that make user turns out (see the module's docstring).

    :meth:`push` returns, in order, the ASR events to act on and the verdicts on held utterances.
    ``enabled`` False passes everything through (the assistant's words are still kept, so turning the
    guard on mid-session works at once).
    """

    def __init__(self, options: EchoOptions | None = None, *, enabled: bool = True, lead_s: float = 0.5) -> None:
        self.options = options or EchoOptions()
        self.enabled = enabled
        #: Slack for the assistant's step times running ahead of the ASR's audio clock (text before audio).
        self.lead_s = lead_s
        self.assistant = AssistantWords(keep_s=max(40.0, self.options.window_s + 30.0))
        #: Utterances held now. More than one at a time: a recogniser reports the next utterance's start
        #: before the previous one's final (the final decode runs after the turn ended).
        self._held: dict[int, _Held] = {}
        self._passed: set[int] = set()  #: utterances released (or never held) whose later events pass
        self._dropped: set[int] = set()  #: utterances judged an echo before their final: later events dropped
        self.counts = {"held": 0, "echo": 0, "user": 0}

    def assistant_step(self, piece: str | None, step: int) -> None:
        self.assistant.step(piece, step)

    def reset(self) -> None:
        """A fresh session (the slot's steps and the ASR's clock restart at 0)."""
        self.assistant.clear()
        self._held.clear()
        self._passed.clear()
        self._dropped.clear()

    def push(self, ev: AsrEvent) -> list[AsrEvent | EchoVerdict]:
        if ev.type in (EventType.CUT, EventType.ERROR):
            if ev.type is EventType.ERROR:
                self._held.clear()
            return [ev]
        utt = ev.utterance
        held = self._held.get(utt)
        if held is not None:
            return self._judge_held(held, ev)
        if utt in self._dropped:
            if ev.type is EventType.FINAL:
                self._dropped.discard(utt)
            return []
        if utt in self._passed or not self.enabled:
            if ev.type is EventType.FINAL:
                self._passed.discard(utt)
            return [ev]
        out: list[AsrEvent | EchoVerdict] = []
        while len(self._held) >= 4:  # finals that never came: judge the oldest as it is
            oldest = self._held[min(self._held)]
            out += self._decide(oldest, final=True)
        start = max(0.0, ev.audio_s - 0.5)  # the VAD fires a little after speech began
        if not self.assistant.spoke_since(start - self.options.window_s):
            self._pass(ev)
            return [*out, ev]
        self.counts["held"] += 1
        held = self._held[utt] = _Held(utt, start)
        return out + self._judge_held(held, ev)

    def _pass(self, ev: AsrEvent) -> None:
        if ev.type is not EventType.FINAL:
            self._passed.add(ev.utterance)
            while len(self._passed) > 64:
                self._passed.discard(min(self._passed))
        while len(self._dropped) > 64:
            self._dropped.discard(min(self._dropped))

    def _judge_held(self, held: _Held, ev: AsrEvent) -> list[AsrEvent | EchoVerdict]:
        if ev.type is EventType.SPEECH_STARTED:
            held.started = ev
            return []
        if ev.type is EventType.SPEECH_STOPPED:
            held.stopped = ev
            return []
        if ev.type is EventType.PARTIAL:
            held.partial = ev
            if not normalise(ev.stable) or ev.stable == held.judged:  # judged on its stable words, once each
                return []
            held.judged = ev.stable
            verdict = self._verdict(held, ev, final=False)
            if verdict.echo or not verdict.match.clearly_user(self.options):
                return []  # the final (or a longer partial) decides
            return self._release(held, verdict)
        return self._decide(held, final=True, final_event=ev)

    def _decide(self, held: _Held, *, final: bool, final_event: AsrEvent | None = None) -> list[AsrEvent | EchoVerdict]:
        """The held utterance's end: an echo is dropped (with its verdict), the user's speech released."""
        self._held.pop(held.utterance, None)
        last = final_event or held.partial
        if final_event is None:
            self._dropped.add(held.utterance)  # its final, if it comes, is not judged again
        if last is None or not normalise(last.text):  # nothing said (a noise): no turn, nothing to report
            return []
        verdict = self._verdict(held, last, final=final)
        if verdict.echo:
            self.counts["echo"] += 1
            return [verdict]
        self._dropped.discard(held.utterance)
        out = self._release(held, verdict)
        if final_event is not None:
            self._passed.discard(held.utterance)
            out.append(final_event)
        return out

    def _release(self, held: _Held, verdict: EchoVerdict) -> list[AsrEvent | EchoVerdict]:
        self.counts["user"] += 1
        self._held.pop(held.utterance, None)
        self._passed.add(held.utterance)
        return [verdict, *held.events()]

    def _verdict(self, held: _Held, ev: AsrEvent, *, final: bool) -> EchoVerdict:
        said = self.assistant.said(held.start_s - self.options.window_s, ev.audio_s + self.lead_s)
        text = ev.text if final else ev.stable
        match = match_echo(normalise(text), said, self.options, final=final, start_s=held.start_s)
        echo = match.is_echo(self.options)
        delay = None if match.start_s is None else round(held.start_s - match.start_s, 3)
        return EchoVerdict(utterance=held.utterance, audio_s=ev.audio_s, echo=echo, text=text, match=match,
                           delay_s=delay)
