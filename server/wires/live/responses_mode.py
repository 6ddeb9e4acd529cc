"""Responses delegation on the Live wire: the runtime's hooks, and the answer source's events as Live events.

The answer source itself (kame's back-end with the client's functions) is
:class:`kame.session.responses.source.ResponsesAnswerSource`; the wire only
starts it at ``session.start`` (:func:`answer_source`), hands it the client's
``response.item.create`` / ``response.create`` and encodes what it emits:
a nested Responses event as ``response.event``, a notice as ``info``, its
progress as a ``kame.*`` event (:func:`live_event`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kame.oracle.config import OracleConfig
from kame.server.wires.live.events import Info, KameEvent, LiveEvent, ResponseEventOut
from kame.session.answers import Encode
from kame.session.delegation import DelegationBook
from kame.session.responses.settings import ResponsesDelegationSettings
from kame.session.responses.source import (
    Notice,
    ResponseEvent,
    ResponsesAnswerSource,
    SourceEvent,
    SourceHooks,
)


@dataclass(frozen=True, kw_only=True)
class ResponsesHooks(SourceHooks):
    """What the runtime gives a Live session that uses Responses delegation: the source's hooks and the
    Live send queue (see :mod:`kame.session.responses.source` on its order)."""

    send: Callable[[LiveEvent], None]  #: queue an event for the client


def live_event(event: SourceEvent) -> LiveEvent:
    """The Live event of what the answer source emitted."""
    if isinstance(event, ResponseEvent):
        return ResponseEventOut(event.event, event.delegation_id)
    if isinstance(event, Notice):
        return Info(event.code, event.message)
    return KameEvent(event.name, event.fields)


def answer_source(
    settings: Callable[[], ResponsesDelegationSettings],
    hooks: ResponsesHooks,
    *,
    book: DelegationBook,
    encode: Encode,
    oracle_config: OracleConfig,
    history: Sequence[tuple[str, str]] = (),
) -> ResponsesAnswerSource:
    """The session's Responses answer source; its rounds are judged by the wire's delegation book."""
    send = hooks.send

    def judge(delegation_id: str) -> tuple[bool, str]:
        verdict = book.judge(delegation_id, kind="response")
        return verdict.speak, verdict.standing

    return ResponsesAnswerSource(settings, hooks, lambda event: send(live_event(event)), judge=judge, encode=encode,
                                 oracle_config=oracle_config, history=history)
