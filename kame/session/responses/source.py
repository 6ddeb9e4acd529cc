"""The Responses conversation as an answer source: who answers a Live session in Responses delegation.

:class:`ResponsesAnswerSource` joins the delegation driver (:mod:`.rounds`) and the speculative
requests (:mod:`.speculation`) to the session: final transcripts, instructions and thinking notes go
into the back-end conversation; function outputs and ``response.create`` go to the driver; each
round's text becomes a new oracle sequence, judged like a late commentary (docs/oracle.md).

``emit`` goes to the session's event queue, after the delegation's own ``delegation.opened`` (a
delegation's rounds run in tasks). Its tasks and oracle stream are the session's (``SourceHooks``).
The session's answer source for Responses delegation
(:class:`kame.session.delegated_answers.ResponsesDelegation`) starts it through
:meth:`.backend.ResponsesOffer.answer_source`; no wire does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kame.backend.speculation import ToolCallEvent
from kame.oracle.config import OracleConfig
from kame.oracle.debounce import Debouncer
from kame.oracle.word_tokenizer import WordStreamTokenizer
from kame.session.answers import Encode, OracleAnswer, commentary_answer
from kame.session.events import ResponsesStreamed, SourceNotice, SourceProgress
from kame.session.responses.conversation import ClientMessage, ConversationLog, Note, UserSpeech
from kame.session.responses.rounds import (
    DEFAULT_FUNCTION_TIMEOUT_S,
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_MAX_ROUNDS,
    DelegationDone,
    PromptOptions,
    ResponsesDelegator,
    RoundSource,
    RoundText,
    ServerTools,
    TextOut,
)
from kame.session.responses.settings import ResponsesDelegationSettings
from kame.session.responses.speculation import Speculator
from kame.session.responses.stream import Event, new_id

_SPEAKERS: dict[str, Literal["user", "assistant"]] = {"user": "user", "assistant": "assistant"}


#: What the source reports (pipeline events: the session's queue, encoded by the wire).
SourceEvent = ResponsesStreamed | SourceNotice | SourceProgress
#: A delegation id -> (speak, standing): may an answer for it still be spoken, and why.
Judge = Callable[[str], tuple[bool, str]]


@dataclass(frozen=True, kw_only=True)
class SourceHooks:
    """What the session gives a Responses answer source (the back-end, its oracle stream, its tasks)."""

    source: RoundSource  #: the back-end rounds (:func:`.backend.registry_source`)
    oracle_reset: Callable[[OracleAnswer], None]  #: reset the session's oracle with an answer
    #: Run a delegation or a speculative request (the session's task factory; default: a loop task).
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]] | None = None
    function_timeout_s: float = DEFAULT_FUNCTION_TIMEOUT_S
    max_rounds: int = DEFAULT_MAX_ROUNDS
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS  #: longest function_call_output accepted
    #: Operator-configured MCP tools kame runs itself (:class:`.backend.McpServerTools`).
    server_tools: ServerTools | None = None
    #: Ask the back-end on the growing transcript too (:mod:`.speculation`), as KAME does.
    speculate: bool = True
    #: Append token ids to the oracle sequence started by ``oracle_reset``: with it, a round's text reaches
    #: Moshi word by word as it streams; without it, whole at the round's end.
    oracle_push: Callable[[Sequence[int]], None] | None = None
    #: Tool-call metrics: (event, label) with label ``client_function`` or the MCP tool's name
    #: (``Metrics.on_tool_call(event, tool=label)``).
    on_tool_call: Callable[[ToolCallEvent, str], None] | None = None


@dataclass(frozen=True)
class UseResponses:
    """What the session's Responses delegation starts the source with: the settings as the client changes them,
    where the source's events go (``emit``), how its delegations stand (``judge``), and the conversation the
    client started with; the server's back-ends and the session's oracle and tasks come as :class:`SourceHooks`.
    """

    settings: Callable[[], ResponsesDelegationSettings]
    emit: Callable[[SourceEvent], None]
    judge: Judge
    encode: Encode
    oracle_config: OracleConfig
    history: Sequence[tuple[str, str]] = ()


class ResponsesAnswerSource:
    """The Responses delegation of one session (single owner: the session's event loop)."""

    @classmethod
    def start(cls, use: UseResponses, hooks: SourceHooks) -> ResponsesAnswerSource:
        """The source :class:`UseResponses` describes, on the session's ``hooks``."""
        return cls(use.settings, hooks, use.emit, judge=use.judge, encode=use.encode,
                   oracle_config=use.oracle_config, history=use.history)

    def __init__(
        self,
        settings: Callable[[], ResponsesDelegationSettings],
        hooks: SourceHooks,
        emit: Callable[[SourceEvent], None],
        *,
        judge: Judge,
        encode: Encode,
        oracle_config: OracleConfig,
        history: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.hooks = hooks
        self.emit = emit
        self.judge = judge
        self.encode = encode
        self.oracle_config = oracle_config
        self.conversation = ConversationLog()
        for role, text in history:
            if role == "developer":
                self.conversation.add(Note("developer", text))
            elif role in _SPEAKERS:
                self.conversation.add(ClientMessage(_SPEAKERS[role], text))
        self._heard: list[str] = []
        self._feeds: dict[tuple[str, int], _Feed] = {}
        prompt = PromptOptions(
            max_words=oracle_config.max_answer_words,
            language=oracle_config.language,
            max_chars=16_000,  # its own bound, as before: oracle.history_max_chars is now a memory bound
        )
        self.delegator = ResponsesDelegator(
            settings=settings,
            source=hooks.source,
            send=self._send,
            on_text=self._text,
            on_round_text=self._round_text,
            on_done=self._done,
            conversation=self.conversation,
            prompt=prompt,
            function_timeout_s=hooks.function_timeout_s,
            max_rounds=hooks.max_rounds,
            max_output_chars=hooks.max_output_chars,
            spawn=hooks.spawn,
            server_tools=hooks.server_tools,
            on_tool_call=hooks.on_tool_call,
        )
        self.speculator: Speculator | None = None
        if hooks.speculate:
            self.speculator = Speculator(
                settings=settings,
                source=hooks.source,
                conversation=self.conversation,
                answer=self._speculative_answer,
                notify=lambda name, fields: emit(SourceProgress(event=name, data=fields)),
                debouncer=Debouncer.from_config(oracle_config),
                prompt=prompt,
                spawn=hooks.spawn,
            )

    # ------------------------------------------------------------------ the wire's calls

    def partial(self, now: float, utterance: int, stable: str) -> None:
        """The user's stable words grew: maybe a speculative request (never the client's functions)."""
        if self.speculator is not None:
            self.speculator.stable(now, utterance, stable)

    def tick(self, now: float) -> None:
        if self.speculator is not None:
            self.speculator.poll(now)

    def heard(self, text: str) -> None:
        """A user turn's final transcript (it goes to the back-end with the next delegation)."""
        if self.speculator is not None:
            self.speculator.final()
        if text.strip():
            self._heard.append(" ".join(text.split()))

    def delegate(self, delegation_id: str) -> str:
        """Start a delegation now (the user's words since the last one go first); returns its response id."""
        if self._heard:
            self.conversation.add(UserSpeech(" ".join(self._heard)))
            self._heard.clear()
        response_id = new_id("resp")
        self.delegator.start(delegation_id, response_id)
        return response_id

    def note(self, kind: Literal["instructions", "thinking"], text: str) -> None:
        self.conversation.add(Note(kind, text))

    def item_create(self, item: dict[str, Any]) -> None:
        """A client's function output or message (raises :class:`~.settings.ResponsesError`)."""
        self.delegator.item_create(item)

    def response_create(self) -> Literal["resumed", "new"]:
        """A client's ``response.create`` (raises :class:`~.settings.ResponsesError`)."""
        return self.delegator.response_create()

    async def aclose(self) -> None:
        if self.speculator is not None:
            await self.speculator.aclose()
        await self.delegator.aclose()

    def _speculative_answer(self, text: str) -> None:
        answer = commentary_answer(text, self.encode, self.oracle_config, None)
        if answer is None:
            return
        self.hooks.oracle_reset(answer)
        self.emit(
            SourceProgress(
                event="kame.oracle.reset",
                data={"delegation_id": None, "source": "speculation", "text": answer.text, "tokens": answer.steps},
            )
        )

    # ------------------------------------------------------------------ the driver's output

    def _send(self, event: Event) -> None:
        if event.get("type") == "response.event":
            self.emit(ResponsesStreamed(event=event["event"], delegation_id=event.get("delegation_id")))
        elif event.get("type") == "info":
            self.emit(SourceNotice(code=str(event.get("code")), message=str(event.get("message"))))
        else:  # pragma: no cover - the driver sends nothing else
            raise ValueError(f"unexpected event {event.get('type')!r}")

    def _text(self, out: TextOut) -> None:
        """A round's text as it streams: settled words go to the oracle at once (when the session can push)."""
        if self.hooks.oracle_push is None:
            return
        feed = self._feed(out.delegation_id, out.round)
        if feed.speak:
            self._deliver(feed, feed.tokenizer.feed(out.delta))

    def _round_text(self, out: RoundText) -> None:
        """A round ended: the rest of its words, and what reached Moshi."""
        feed = self._feeds.pop((out.delegation_id, out.round), None)
        ids: list[int] = []
        if feed is None:  # no streaming (or no delta came through it)
            feed = self._new_feed(out.delegation_id)
            if feed.speak:
                ids = feed.tokenizer.feed(out.text)
        if not feed.speak:
            self.emit(
                SourceNotice(
                    code="delegation_superseded",
                    message=f"the answer of delegation {out.delegation_id} is kept in the back-end's conversation "
                    "but not spoken: the user has spoken since (more than a backchannel)",
                )
            )
            return
        ids += feed.tokenizer.flush()
        if not feed.started and not ids:
            return  # nothing speakable (symbols, markup)
        self._deliver(feed, ids)
        self.emit(
            SourceProgress(
                event="kame.responses.answer",
                data={
                    "delegation_id": out.delegation_id,
                    "round": out.round,
                    "after_tools": out.after_tools,
                    "standing": feed.standing,
                    "text": feed.tokenizer.text,
                    "tokens": len(feed.tokenizer.ids),
                },
            )
        )

    def _done(self, done: DelegationDone) -> None:
        for key in [k for k in self._feeds if k[0] == done.delegation_id]:
            del self._feeds[key]  # a failed or cancelled round: what was said stays said

    def _feed(self, delegation_id: str, round_no: int) -> _Feed:
        key = (delegation_id, round_no)
        feed = self._feeds.get(key)
        if feed is None:
            feed = self._feeds[key] = self._new_feed(delegation_id)
        return feed

    def _new_feed(self, delegation_id: str) -> _Feed:
        speak, standing = self.judge(delegation_id)
        tokenizer = WordStreamTokenizer.from_config(self.encode, self.oracle_config)
        return _Feed(delegation_id, tokenizer, speak, standing)

    def _deliver(self, feed: _Feed, ids: Sequence[int]) -> None:
        """The first ids start the round's oracle sequence (a reset), the next ones extend it."""
        if not ids:
            return
        if not feed.started:
            feed.started = True
            self.hooks.oracle_reset(OracleAnswer(tuple(ids), feed.tokenizer.text, feed.delegation_id))
        elif self.hooks.oracle_push is not None:
            self.hooks.oracle_push(list(ids))


@dataclass
class _Feed:
    """One round's text on its way to the oracle."""

    delegation_id: str
    tokenizer: WordStreamTokenizer
    speak: bool
    standing: str
    started: bool = False
