"""Responses delegation on the Live wire: how the protocol asks for the answer source, and its events as Live events.

The answer source itself (kame's back-end with the client's functions) is
:class:`kame.session.responses.source.ResponsesAnswerSource`, and the
session side creates it: at ``session.start`` the wire only sends the
command :class:`~kame.session.responses.source.UseResponses`
(:func:`use_responses`) through its :class:`ResponsesPort`, then hands the
source the client's ``response.item.create`` / ``response.create`` and
encodes what it emits: a nested Responses event as ``response.event``, a
notice as ``info``, its progress as a ``kame.*`` event (:func:`live_event`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kame.oracle.config import OracleConfig
from kame.server.wires.live.events import Info, KameEvent, LiveEvent, ResponseEventOut
from kame.session.answers import Encode
from kame.session.responses.settings import ResponsesDelegationSettings
from kame.session.responses.source import (
    Notice,
    ResponseEvent,
    ResponsesAnswerSource,
    SourceEvent,
    UseResponses,
)


@dataclass(frozen=True)
class ResponsesPort:
    """How a Live session in Responses delegation reaches the session side (its pipeline, through the runtime's ``WireIO``, on a server)."""

    use: Callable[[UseResponses], ResponsesAnswerSource]  #: the session creates the answer source
    send: Callable[[LiveEvent], None]  #: queue an event for the client (in order with what the calls return)


def live_event(event: SourceEvent) -> LiveEvent:
    """The Live event of what the answer source emitted."""
    if isinstance(event, ResponseEvent):
        return ResponseEventOut(event.event, event.delegation_id)
    if isinstance(event, Notice):
        return Info(event.code, event.message)
    return KameEvent(event.name, event.fields)


def use_responses(
    settings: Callable[[], ResponsesDelegationSettings],
    port: ResponsesPort,
    *,
    judge: Callable[[str], tuple[bool, str]],
    encode: Encode,
    oracle_config: OracleConfig,
    history: Sequence[tuple[str, str]] = (),
) -> UseResponses:
    """The command for the session's Responses answer source; ``judge`` tells how its delegations stand
    (:meth:`kame.session.delegated_answers.DelegatedAnswers.judge`), its events go to the client as Live events."""
    send = port.send
    return UseResponses(settings, lambda event: send(live_event(event)), judge, encode, oracle_config, history)
