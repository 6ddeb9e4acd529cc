"""kame/session/answer_source.py: the one writer of a session's oracle stream, and the answer-source interface a
new source (a phone call's, a resumed session's) builds on, without an engine, a tokenizer model or torch."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kame.oracle.config import OracleConfig
from kame.session.answer_source import AnswerSource, OracleWriter, SourceIO
from kame.session.answers import AnswerWritten
from kame.session.commands import AddContext, AppendAnswer, CommandRefused, ContextItem, Delegate
from kame.session.delegated_answers import ClientDelegation
from kame.session.events import AnswerSpoken, ContextAppended, DelegationOpened, PipelineEvent
from kame.session.settings import Delegation


class Slot:
    """The slot's oracle FIFO, recorded; a reset is in the FIFO at ``in_fifo`` (monotonic)."""

    def __init__(self, in_fifo: float = 10.25) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.in_fifo = in_fifo

    def oracle_reset(self, first_ids: list[int], done: Callable[[float], None] | None = None) -> None:
        self.calls.append(("reset", first_ids))
        if done is not None:
            done(self.in_fifo)

    def oracle_push(self, ids: list[int]) -> None:
        self.calls.append(("push", ids))

    def oracle_clear(self) -> None:
        self.calls.append(("clear", []))


def test_the_writer_meters_what_delegated_answers_write_and_not_the_llms_own() -> None:
    slot, written = Slot(), []
    writer = OracleWriter(lambda: slot, written.append)
    writer.reset([5, 6, 7], received_t=10.0)
    writer.push([8])
    writer.reset([])  # nothing to say: nothing written, nothing counted
    assert slot.calls == [("reset", [5, 6, 7]), ("push", [8])]
    assert written == [AnswerWritten(4, True, 0.25), AnswerWritten(1, False)]  # the start id counts
    writer.oracle_reset([1, 2])  # the own LLM's loop: counted from its own events, not here
    writer.oracle_push([3])
    writer.oracle_clear()
    assert [c[0] for c in slot.calls[2:]] == ["reset", "push", "clear"] and len(written) == 2
    detached = OracleWriter(lambda: None, written.append)
    detached.reset([1])  # no slot (closing): nothing happens
    assert len(written) == 2


def test_the_base_source_answers_nothing_and_refuses_delegation_commands() -> None:
    source = AnswerSource()
    source.partial(1, "what is", "what", 1.0)
    source.final(1, "what is it", "utterance:1", 2.0)
    source.tick(3.0)
    assert source.apply(AddContext(ContextItem("k", "user", "hi"))) == []  # no conversation to change
    with pytest.raises(CommandRefused) as refused:
        source.apply(Delegate("e1"))
    assert refused.value.code == "unsupported_event"


def test_client_delegation_opens_on_new_stable_words_and_speaks_through_the_writer() -> None:
    slot, written, emitted = Slot(), [], []
    io = SourceIO(OracleWriter(lambda: slot, written.append), emitted.append, lambda work: None)  # type: ignore[arg-type,return-value]
    source = ClientDelegation(Delegation("speculative", 3, id_prefix="abcd"), io,
                              encode=lambda text: [100 + len(w) for w in text.split()], oracle_config=OracleConfig())
    source.speech_started(1, 0.0)
    source.partial(1, "book a", "book a table for", 1.0)
    opened = [e for e in emitted if isinstance(e, DelegationOpened)]
    assert len(opened) == 1 and opened[0].delegation_id == "dlg_abcd000001"
    source.partial(1, "book a table for", "book a table for", 9.0)  # no new stable word: nothing to decide
    assert len([e for e in emitted if isinstance(e, DelegationOpened)]) == 1
    out: list[PipelineEvent] = source.apply(
        AppendAnswer("commentary", "Sure, for how many?", opened[0].delegation_id, 1200, 20.0, "c1"))
    appended, spoken = out
    assert isinstance(appended, ContextAppended) and appended.client_event_id == "c1" and appended.unspoken is None
    assert isinstance(spoken, AnswerSpoken) and spoken.text.startswith("Sure, for how many") and spoken.tokens == 5
    assert slot.calls == [("reset", [100 + len(w) for w in spoken.text.split()])] and written[0].new_sequence
    with pytest.raises(CommandRefused):
        source.apply(AppendAnswer("commentary", "Hm.", "dlg_unknown", 1300, 21.0, "c2"))


def test_a_new_source_needs_only_what_it_uses() -> None:
    class Echo(AnswerSource):
        """A toy source: says back each final, through the writer it is lent."""

        kind = "echo"

        def __init__(self, io: SourceIO) -> None:
            self.io = io

        def final(self, utterance: int, text: str, key: str, now: float) -> None:
            self.io.writer.reset([len(w) for w in text.split()])

    slot = Slot()
    echo = Echo(SourceIO(OracleWriter(lambda: slot), lambda e: None, lambda w: None))  # type: ignore[arg-type,return-value]
    echo.partial(1, "hel", "", 1.0)
    echo.final(1, "hello there", "utterance:1", 2.0)
    assert slot.calls == [("reset", [5, 5])]
    assert echo.apply(AddContext(ContextItem("k", "user", "x"))) == []


