"""A Live protocol joined to the session's answer source as the runtime and the pipeline join them, without a
server, an engine or torch: the client's asks become the session's commands (``session_command``), the source's
events go back through the Live wire's mapping (``live_events``), and what it writes lands in a recorded slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.oracle.config import OracleConfig
from kame.server.wires.live.config import LiveServerInfo
from kame.server.wires.live.events import LiveError, LiveEvent
from kame.server.wires.live.protocol import LiveProtocol, WireOut
from kame.server.wires.live.wire import live_events, session_command
from kame.session.answer_source import AnswerSource, OracleWriter, SourceIO
from kame.session.answers import OracleAnswer
from kame.session.commands import CommandRefused
from kame.session.delegated_answers import ClientDelegation, delegation_source
from kame.session.events import AnswerSpoken, PipelineEvent
from kame.session.responses.backend import ResponsesOffer
from kame.session.responses.source import ResponsesAnswerSource, SourceHooks, UseResponses


@dataclass
class SessionOut(WireOut):
    """What one client message did, the session's side included: the oracle answers it became."""

    answers: list[OracleAnswer] = field(default_factory=list)


class RecordedSlot:
    """The slot's oracle stream, recorded: each new sequence, and what extended the last one."""

    def __init__(self) -> None:
        self.resets: list[list[int]] = []
        self.pushes: list[list[int]] = []

    def oracle_reset(self, first_ids: list[int], done: Callable[[float], None] | None = None) -> None:
        self.resets.append(list(first_ids))
        if done is not None:
            done(0.0)

    def oracle_push(self, ids: list[int]) -> None:
        self.pushes.append(list(ids))

    def oracle_clear(self) -> None:
        pass


class LiveSession:
    """One Live session's protocol and answer source (see the module docstring).

    ``on_events``: where events the source reports between calls go (a Responses round's stream); events
    reported during a call come back with that call's result, in the pipeline's order.
    """

    def __init__(self, info: LiveServerInfo, encode: Callable[[str], Sequence[int]], *,
                 oracle_config: OracleConfig | None = None, offer: ResponsesOffer | None = None,
                 on_events: Callable[[list[LiveEvent]], None] | None = None, **protocol: Any) -> None:
        self.protocol = LiveProtocol(info, **protocol)
        self.encode = encode
        self.oracle_config = oracle_config or OracleConfig()
        self.offer = offer
        self.on_events = on_events
        self.slot = RecordedSlot()
        self.writer = OracleWriter(lambda: self.slot)
        self.source: AnswerSource = AnswerSource()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._pending: list[PipelineEvent] = []
        self._calls = 0

    # ------------------------------------------------------------------ the session's side
    def __getattr__(self, name: str) -> Any:
        return getattr(self.protocol, name)

    @property
    def answers(self) -> Any:
        """The session's delegated answers (its book, policy and context), once started."""
        assert isinstance(self.source, ClientDelegation)
        return self.source.answers

    @property
    def context(self) -> Sequence[Any]:
        return self.source.context if isinstance(self.source, ClientDelegation) else ()

    @property
    def responses(self) -> Any:
        return getattr(self.source, "responses", None)

    def _emit(self, event: PipelineEvent) -> None:
        self._pending.append(event)
        if not self._calls and self.on_events is not None:
            self.on_events(self._drain())

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _drain(self) -> list[LiveEvent]:
        pending, self._pending = self._pending, []
        out: list[LiveEvent] = []
        for event in pending:
            out += live_events(self.protocol, event)
        return out

    def _settings(self) -> None:
        delegation = self.protocol.delegation()
        assert delegation is not None
        if self.source.kind == "none":
            io = SourceIO(self.writer, self._emit, self._spawn)
            self.source = delegation_source(delegation, io, encode=self.encode, oracle_config=self.oracle_config,
                                            offer=self.offer)
        else:
            self.source.configure(_Settings(delegation))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ the runtime's calls
    def message(self, payload: str | bytes | None, now: float) -> SessionOut:
        self._calls += 1
        try:
            wire = self.protocol.message(payload, now)
            out = SessionOut(**{f: getattr(wire, f) for f in WireOut.__dataclass_fields__})
            if wire.settings is not None or wire.started:
                self._settings()
            for ask in wire.asks:
                command = session_command(self.protocol, ask, now)
                try:
                    events = self.source.apply(command)
                except CommandRefused as refused:
                    error = LiveError(refused.code, refused.message, param=refused.param,
                                      client_event_id=getattr(command, "event_id", None))
                    out.errors.append(error)
                    out.events.append(error.event())
                    continue
                for event in events:
                    if isinstance(event, AnswerSpoken):
                        out.answers.append(OracleAnswer(tuple(self.slot.resets[-1]), event.text, event.delegation_id))
                    else:
                        out.events += live_events(self.protocol, event)
            out.events += self._drain()
            return out
        finally:
            self._calls -= 1

    def _heard(self, events: list[LiveEvent], hear: Callable[[], None]) -> list[LiveEvent]:
        self._calls += 1
        try:
            hear()
            return events + self._drain()
        finally:
            self._calls -= 1

    def speech_started(self, utterance: int, audio_s: float, now: float = 0.0) -> list[LiveEvent]:
        return self._heard(self.protocol.speech_started(utterance, audio_s),
                           lambda: self.source.speech_started(utterance, now))

    def partial(self, utterance: int, audio_s: float, stable: str, now: float, *, text: str | None = None,
                latency_s: float | None = None) -> list[LiveEvent]:
        events = self.protocol.partial(utterance, audio_s, stable, now, text=text, latency_s=latency_s)
        return self._heard(events, lambda: self.source.partial(utterance, text or stable, stable, now))

    def final(self, utterance: int, audio_s: float, text: str, now: float) -> list[LiveEvent]:
        events = self.protocol.final(utterance, audio_s, text, now)
        return self._heard(events, lambda: self.source.final(utterance, text, f"utterance:{utterance}", now))

    def tick(self, now: float) -> list[LiveEvent]:
        opened = self._heard([], lambda: self.source.tick(now))
        return opened + self.protocol.tick(now)

    def assistant_frame(self, pcm: np.ndarray, piece: str | None, step: int, *, send_audio: bool = True) -> list[LiveEvent]:
        return self.protocol.assistant_frame(pcm, piece, step, send_audio=send_audio)


@dataclass(frozen=True)
class _Settings:
    """The part of the session's settings a delegated source reads."""

    delegation: Any


@dataclass(frozen=True)
class HookedOffer(ResponsesOffer):
    """Responses delegation whose source runs on a test's own hooks (``hooks()`` when the session starts it):
    what it writes to the oracle is the test's to record, with or without streaming."""

    hooks: Callable[[], SourceHooks] | None = None

    def answer_source(self, use: UseResponses, **session: Any) -> ResponsesAnswerSource:
        assert self.hooks is not None
        return ResponsesAnswerSource.start(use, self.hooks())
