"""Who answers a session: one interface, owned by the pipeline, and the one writer of the oracle stream. No I/O.

The pipeline (:class:`~kame.session.pipeline.Pipeline`) picks one :class:`AnswerSource` from the session's
settings (:func:`kame.session.sources.source_for`): the session's own LLM (:class:`~kame.session.llm_answers.LlmAnswers`),
client delegation or Responses delegation (:mod:`kame.session.delegated_answers`). A source hears the user
(partials, finals, the turn's end), takes the session's commands, writes only through :class:`OracleWriter`
(metered: :class:`~kame.session.answers.AnswerWritten`) and reports through ``emit`` (pipeline events a wire
encodes). Every method has a no-op default, so a new source (a phone call's, a resumed session's) overrides
only what it uses. Nothing here blocks: work that waits runs in ``spawn``'s tasks, which end with the session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kame.session.answers import AnswerWritten
from kame.session.commands import AppendAnswer, CommandRefused, ConversationCommand, Delegate, DeliverItem
from kame.session.events import PipelineEvent

if TYPE_CHECKING:
    from kame.session.settings import SessionSettings


class OracleSlot(Protocol):
    """The engine slot's side of the oracle stream (:class:`~kame.frontend.engine_thread.AsyncSlot`)."""

    def oracle_reset(self, first_ids: list[int], done: Callable[[float], None] | None = None) -> None: ...

    def oracle_push(self, ids: list[int]) -> None: ...

    def oracle_clear(self) -> None: ...


class OracleWriter:
    """The one writer of a session's oracle stream (its slot's FIFO), whoever answers.

    :meth:`reset` and :meth:`push` report what they queued as :class:`AnswerWritten` (``on_written``: the
    server counts it). The own LLM's loop writes through the :class:`~kame.oracle.loop.OracleSink` methods
    (``oracle_*``); those writes are counted from the loop's own events (``oracle.reset``, ``oracle.text``),
    so they are not reported twice.
    """

    def __init__(self, slot: Callable[[], OracleSlot | None], on_written: Callable[[AnswerWritten], None] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._slot = slot
        self.on_written = on_written
        self._clock = clock

    def reset(self, ids: Sequence[int], received_t: float | None = None) -> None:
        """A new sequence, in the FIFO at once (not behind the step in progress); reported with the seconds since
        ``received_t`` (monotonic; None: now)."""
        slot = self._slot()
        if slot is None or not ids:
            return
        if received_t is None:
            received_t = self._now()
        written: list[float] = []
        slot.oracle_reset(list(ids), written.append)
        self._report(AnswerWritten(len(ids) + 1, True, max(0.0, written[0] - received_t) if written else None))

    def push(self, ids: Sequence[int]) -> None:
        """More of the sequence :meth:`reset` started (an answer that streams)."""
        slot = self._slot()
        if slot is None or not ids:
            return
        slot.oracle_push(list(ids))
        self._report(AnswerWritten(len(ids), False))

    # the own LLM's loop (kame.oracle.loop.OracleSink): counted from its events
    def oracle_reset(self, first_ids: list[int]) -> None:
        slot = self._slot()
        if slot is not None and first_ids:
            slot.oracle_reset(list(first_ids))

    def oracle_push(self, ids: list[int]) -> None:
        slot = self._slot()
        if slot is not None and ids:
            slot.oracle_push(list(ids))

    def oracle_clear(self) -> None:
        slot = self._slot()
        if slot is not None:
            slot.oracle_clear()

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    def _report(self, written: AnswerWritten) -> None:
        if self.on_written is not None:
            self.on_written(written)


#: Run a coroutine in one of the session's tasks (a failure is logged, never ends the session).
Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


@dataclass(frozen=True)
class SourceIO:
    """What the pipeline lends its answer source: the writer, its event queue and its tasks."""

    writer: OracleWriter
    emit: Callable[[PipelineEvent], None]
    spawn: Spawn


class AnswerSource:
    """Who answers a session (see the module docstring). The base class answers nothing: a source overrides
    what it uses, and only that.

    ``now`` is ``time.monotonic()`` of the event heard; ``key`` names a user turn in the conversation
    (:func:`~kame.session.commands.utterance_key`, :func:`~kame.session.commands.commit_key`).
    """

    #: For logs and recordings: ``none``, ``llm``, ``client``, ``responses``.
    kind = "none"

    def speech_started(self, utterance: int, now: float) -> None:
        """The user started an utterance."""

    def partial(self, utterance: int, text: str, stable: str, now: float) -> None:
        """A partial transcript of the utterance (``stable``: its prefix that no longer changes)."""

    def final(self, utterance: int, text: str, key: str, now: float) -> None:
        """The utterance's final transcript (server turns: the turn may end here)."""

    def turn_end(self, text: str, key: str) -> None:
        """With client turns: the client committed the user's turn, whose transcript is ``text``."""

    def turn_cleared(self) -> None:
        """The client dropped the user's turn in progress (what was asked on it goes too)."""

    def step(self, text_id: int | None, step: int) -> None:
        """The assistant's output step ``step`` (its text token ``text_id``): what it said."""

    def tick(self, now: float) -> None:
        """Time passes (after each output frame): what waits for a moment may go now."""

    def apply(self, command: ConversationCommand) -> list[PipelineEvent]:
        """A session command (:mod:`kame.session.commands`): the events it gives at once (reported before anything
        the session reports later). Raises :class:`CommandRefused` for what this source cannot honour; the base
        class ignores a change to a conversation it does not keep, and refuses the delegation commands."""
        if isinstance(command, (AppendAnswer, DeliverItem, Delegate)):
            raise CommandRefused("unsupported_event", "this session does not delegate its answers", param="type")
        return []

    def configure(self, settings: SessionSettings) -> None:
        """The session's settings changed (applied as a whole)."""

    async def aclose(self) -> None:
        """The session ends: stop what runs (requests, tasks)."""
