"""Delegated answers: who answers a session whose answers are written outside kame's own LLM request. No I/O.

In client delegation the application answers (its appends); in Responses
delegation a Responses conversation does (kame's back-end with the client's
functions, :class:`~kame.session.responses.source.ResponsesAnswerSource`).
Either way the session decides *when* to delegate
(:class:`~kame.session.delegation_rules.DelegationPolicy` on the user's transcript,
or the client's own request), keeps the book of open delegations
(:class:`~kame.session.delegation_rules.DelegationBook`: is a late answer still
spoken?), turns a spoken commentary into an oracle answer
(:func:`~kame.session.answers.commentary_answer`) and keeps what was appended
as context. :class:`DelegatedAnswers` holds all of that for one session;
:class:`ClientDelegation` and :class:`ResponsesDelegation` are the session's
two :class:`~kame.session.answer_source.AnswerSource` built on it (the
pipeline picks one from ``SessionSettings.delegation``): a wire only decodes
the client's events into session commands and encodes the events they emit.

Nothing here waits or reads a clock: ``now`` and the session timeline
(``offset_ms``) are passed in, so every rule is tested without a server.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kame.oracle.config import OracleConfig
from kame.session.answer_source import AnswerSource, SourceIO
from kame.session.answers import Encode, OracleAnswer, commentary_answer
from kame.session.commands import AppendAnswer, CommandRefused, ConversationCommand, Delegate, DeliverItem
from kame.session.delegation_rules import Delegate as Decision
from kame.session.delegation_rules import DelegationBook, DelegationMode, DelegationPolicy
from kame.session.events import (
    AnswerSpoken,
    ContextAppended,
    DelegationOpened,
    PipelineEvent,
)
from kame.session.responses.settings import ResponsesDelegationSettings
from kame.session.responses.source import ResponsesAnswerSource, UseResponses
from kame.session.settings import Delegation, SessionSettings

if TYPE_CHECKING:
    from kame.session.responses.backend import ResponsesOffer
    from kame.session.responses.conversation import ConversationLog

#: What a client appends: a spoken answer (``commentary``) or silent context.
AppendKind = Literal["instructions", "thinking", "commentary"]
#: Characters of appended context kept for later delegations (oldest dropped first).
MAX_CONTEXT_CHARS = 64_000
#: One oracle step on the session timeline (ms).
FRAME_MS = 80
#: Utterances whose stable words are followed at once (the oldest is forgotten beyond).
MAX_OPEN_UTTERANCES = 8


@dataclass(frozen=True)
class ContextItem:
    """An append kept as context (never spoken directly)."""

    kind: AppendKind
    text: str
    delegation_id: str | None
    at_ms: int
    spoken: bool = False  #: a commentary that became an oracle answer


@dataclass(frozen=True)
class Delegated:
    """A delegation opened at ``offset_ms`` on the session timeline; ``response_id`` names the Responses
    response that answers it (None: the client answers with appends)."""

    delegation_id: str
    offset_ms: int
    response_id: str | None = None


@dataclass(frozen=True)
class AppendResult:
    """What one append did: the oracle answer it became (a spoken commentary), when on the session timeline
    it was taken and until when its answer runs, and why a commentary was not spoken."""

    answer: OracleAnswer | None
    at_ms: int
    end_ms: int
    unspoken: Literal["superseded", "nothing_to_speak"] | None = None


class DelegatedAnswers:
    """The delegations of one session and what their answers do (single owner: the session's event loop)."""

    def __init__(
        self,
        mode: DelegationMode,
        backchannel_words: int,
        *,
        encode: Encode,
        oracle_config: OracleConfig,
        new_id: Callable[[], str],
    ) -> None:
        oc = oracle_config
        self.policy = DelegationPolicy(mode, min_new_words=oc.min_new_words, max_restarts=oc.max_restarts,
                                       window_s=oc.restart_window_s)
        self.book = DelegationBook(backchannel_words)
        self.encode = encode
        self.oracle_config = oracle_config
        self.new_id = new_id
        self.context: deque[ContextItem] = deque()
        self._context_chars = 0
        #: Set when the session answers in Responses delegation (created by the session side).
        self.responses: ResponsesAnswerSource | None = None
        #: Delegations open only once the session started (decisions before are dropped).
        self.started = False
        self._last_utterance = -1  #: the latest user utterance the recogniser reported

    def configure(self, mode: DelegationMode, backchannel_words: int) -> None:
        """The session's settings changed."""
        self.policy.set_mode(mode)
        self.book.backchannel_words = backchannel_words

    def judge(self, delegation_id: str) -> tuple[bool, str]:
        """A Responses round of ``delegation_id``: is it still spoken, and its standing."""
        verdict = self.book.judge(delegation_id, kind="response")
        return verdict.speak, verdict.standing

    # ------------------------------------------------------------------ the user's transcript
    def speech_started(self, utterance: int) -> None:
        self._last_utterance = max(self._last_utterance, utterance)

    def stable(self, now: float, utterance: int, stable: str, offset_ms: int) -> Delegated | None:
        """The utterance's stable words grew to ``stable`` (as sent to the client): maybe a delegation."""
        self.book.heard(utterance, len(stable.split()))
        if self.responses is not None:
            self.responses.partial(now, utterance, stable)
        return self._open(self.policy.stable(now, utterance, stable), offset_ms)

    def final(self, now: float, utterance: int, text: str, offset_ms: int) -> Delegated | None:
        """The utterance is final with ``text``: maybe a delegation."""
        self.book.heard(utterance, len(text.split()))
        self._last_utterance = max(self._last_utterance, utterance)
        if self.responses is not None:
            self.responses.heard(text)
        return self._open(self.policy.final(now, utterance, text), offset_ms)

    def poll(self, now: float, offset_ms: int) -> Delegated | None:
        """A speculative delegation the rate limit held back, if it may go now."""
        opened = self._open(self.policy.poll(now), offset_ms)
        if self.responses is not None:
            self.responses.tick(now)
        return opened

    def _open(self, decision: Decision | None, offset_ms: int) -> Delegated | None:
        if decision is None or not self.started:
            return None
        d = self.book.add(self.new_id(), decision.utterance, offset_ms, decision.words)
        if self.responses is not None:
            return Delegated(d.id, offset_ms, self.responses.delegate(d.id))
        return Delegated(d.id, offset_ms)

    # ------------------------------------------------------------------ the client's commands
    def requested(self, offset_ms: int) -> Delegated | None:
        """The client asked for a response (Responses delegation): a delegation of its own on the conversation
        so far, or None when it resumed a response waiting for its function outputs."""
        assert self.responses is not None
        if self.responses.response_create() != "new":
            return None
        d = self.book.add(self.new_id(), self._last_utterance, offset_ms, 0)
        return Delegated(d.id, offset_ms, self.responses.delegate(d.id))

    def item_create(self, item: dict[str, Any]) -> None:
        """A client's function output or message (Responses delegation; raises ``ResponsesError``)."""
        assert self.responses is not None
        self.responses.item_create(item)

    def append(self, kind: AppendKind, content: str, delegation_id: str | None, now_ms: int) -> AppendResult:
        """An append: a commentary for an open (or general) delegation becomes an oracle answer; every
        append is kept as context. Raises :class:`CommandRefused` for an id the book refuses."""
        if self.responses is not None and delegation_id is not None:
            raise CommandRefused("invalid_value",
                                 f"session.{kind}.append: delegation_id must be null with Responses delegation",
                                 param="delegation_id")
        if self.responses is not None and kind in ("instructions", "thinking"):
            self.responses.note(kind, content)
        verdict = self.book.judge(delegation_id, kind=kind)
        answer = None
        if kind == "commentary" and verdict.speak:
            answer = commentary_answer(content, self.encode, self.oracle_config, delegation_id)
        end_ms = now_ms + answer.steps * FRAME_MS if answer is not None else now_ms
        self.keep(ContextItem(kind, content, delegation_id, now_ms, answer is not None))
        unspoken: Literal["superseded", "nothing_to_speak"] | None = None
        if kind == "commentary" and verdict.standing == "superseded":
            unspoken = "superseded"
        elif kind == "commentary" and answer is None:
            unspoken = "nothing_to_speak"
        return AppendResult(answer, now_ms, end_ms, unspoken)

    def keep(self, item: ContextItem) -> None:
        """Keep ``item`` as context, dropping the oldest beyond :data:`MAX_CONTEXT_CHARS`."""
        self.context.append(item)
        self._context_chars += len(item.text)
        while self._context_chars > MAX_CONTEXT_CHARS and len(self.context) > 1:
            self._context_chars -= len(self.context.popleft().text)


class ClientDelegation(AnswerSource):
    """Client delegation as the session's answer source: the client answers with its appends (Live
    ``session.commentary.append``); the session opens delegations on the user's transcript and speaks the
    commentaries that still stand."""

    kind = "client"

    def __init__(self, delegation: Delegation, io: SourceIO, *, encode: Encode, oracle_config: OracleConfig) -> None:
        self.delegation = delegation
        self.io = io
        ids = itertools.count(1)
        self.answers = DelegatedAnswers(delegation.mode, delegation.backchannel_words, encode=encode,
                                        oracle_config=oracle_config,
                                        new_id=lambda: f"dlg_{delegation.id_prefix}{next(ids):06x}")
        self.answers.started = True
        for kind, text in delegation.context:
            self.answers.keep(ContextItem("instructions" if kind == "instructions" else "thinking", text, None, 0))
        self._stable: dict[int, int] = {}  #: stable words seen of each open utterance (a delegation needs more)

    @property
    def context(self) -> Sequence[ContextItem]:
        return self.answers.context

    def _utterance(self, utterance: int) -> int:
        if utterance not in self._stable:
            while len(self._stable) >= MAX_OPEN_UTTERANCES:  # a recogniser that never finalises
                del self._stable[min(self._stable)]
            self._stable[utterance] = 0
        return self._stable[utterance]

    def speech_started(self, utterance: int, now: float) -> None:
        self._utterance(utterance)
        self.answers.speech_started(utterance)

    def partial(self, utterance: int, text: str, stable: str, now: float) -> None:
        words = len(stable.split())
        if words <= self._utterance(utterance):
            return  # no new stable word: nothing new to decide on
        self._stable[utterance] = words
        self._opened(self.answers.stable(now, utterance, stable, 0))

    def final(self, utterance: int, text: str, key: str, now: float) -> None:
        self._stable.pop(utterance, None)
        self._opened(self.answers.final(now, utterance, text, 0))

    def tick(self, now: float) -> None:
        self._opened(self.answers.poll(now, 0))

    def _opened(self, opened: Delegated | None, client_event_id: str | None = None) -> None:
        if opened is not None:
            self.io.emit(DelegationOpened(delegation_id=opened.delegation_id, response_id=opened.response_id,
                                          client_event_id=client_event_id))

    def apply(self, command: ConversationCommand) -> list[PipelineEvent]:
        if not isinstance(command, AppendAnswer):
            return super().apply(command)
        result = self.answers.append(command.kind, command.content, command.delegation_id, command.at_ms)
        events: list[PipelineEvent] = [ContextAppended(
            kind=command.kind, delegation_id=command.delegation_id, at_ms=result.at_ms, end_ms=result.end_ms,
            unspoken=result.unspoken, client_event_id=command.event_id)]
        answer = result.answer
        if answer is not None:
            self.io.writer.reset(answer.ids, command.received_t)
            events.append(AnswerSpoken(delegation_id=answer.delegation_id, text=answer.text, tokens=answer.steps))
        return events

    def configure(self, settings: SessionSettings) -> None:
        if settings.delegation is not None:
            self.delegation = settings.delegation
            self.answers.configure(settings.delegation.mode, settings.delegation.backchannel_words)


class ResponsesDelegation(ClientDelegation):
    """Responses delegation as the session's answer source: a Responses conversation on the server's back-ends
    (``offer``) with the client's functions answers (:class:`~kame.session.responses.source.ResponsesAnswerSource`);
    the client's appends are context, its function outputs and ``response.create`` go to the conversation."""

    kind = "responses"

    def __init__(self, delegation: Delegation, io: SourceIO, *, encode: Encode, oracle_config: OracleConfig,
                 offer: ResponsesOffer) -> None:
        super().__init__(delegation, io, encode=encode, oracle_config=oracle_config)
        use = UseResponses(self._settings, io.emit, self.answers.judge, encode, oracle_config, delegation.history)
        self.responses = offer.answer_source(use, oracle_reset=lambda answer: io.writer.reset(answer.ids),
                                             oracle_push=io.writer.push, spawn=io.spawn)
        self.answers.responses = self.responses

    @property
    def conversation(self) -> ConversationLog:
        """The back-end's conversation (what a session resumed on another replica carries over)."""
        return self.responses.conversation

    def _settings(self) -> ResponsesDelegationSettings:
        assert self.delegation.responses is not None
        return self.delegation.responses

    def apply(self, command: ConversationCommand) -> list[PipelineEvent]:
        if isinstance(command, DeliverItem):
            self.answers.item_create(command.item)
            return []
        if isinstance(command, Delegate):
            opened = self.answers.requested(0)
            if opened is None:
                return []
            return [DelegationOpened(delegation_id=opened.delegation_id, response_id=opened.response_id,
                                     client_event_id=command.event_id)]
        return super().apply(command)

    async def aclose(self) -> None:
        await self.responses.aclose()


def delegation_source(delegation: Delegation, io: SourceIO, *, encode: Encode, oracle_config: OracleConfig,
                      offer: ResponsesOffer | None) -> ClientDelegation:
    """The answer source of a delegated session: Responses delegation on ``offer`` (``ValueError`` where the server
    offers none), else client delegation."""
    if delegation.responses is None:
        return ClientDelegation(delegation, io, encode=encode, oracle_config=oracle_config)
    if offer is None:
        raise ValueError("Responses delegation is not offered by this server")
    return ResponsesDelegation(delegation, io, encode=encode, oracle_config=oracle_config, offer=offer)
