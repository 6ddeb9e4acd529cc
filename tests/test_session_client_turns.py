"""Client turns in the pipeline (kame.session.pipeline): a commit takes exactly the ASR's finals of the audio
before it, however late the recogniser reports them (it reaches the cut after them); a clear drops what came
before it; an answer requested while a commit waits is asked once the words are in; a recogniser that cannot
cut is covered by the timeout. The real SegmentingTranscriber's cut is checked on Whisper-free audio too."""

from __future__ import annotations

import asyncio
from typing import Any

from kame.asr.events import AsrEvent, EventType
from kame.session import pipeline as pl
from kame.session.commands import ClearTurn, CommitTurn
from kame.session.events import UserTurnCommitted
from kame.session.settings import SessionSettings


class FakeAsr:
    done = False
    cuts_supported = True

    @property
    def cuts(self) -> bool:  # the AsrStream attribute (a recogniser that answers cut() with a CUT event)
        return self.cuts_supported

    def __init__(self) -> None:
        self.count = 0

    def cut(self) -> None:
        self.count += 1


def _pipeline() -> tuple[pl.Pipeline, FakeAsr]:
    p = pl.Pipeline(engine=None, oracle_config=None, registry=None, recognizer=None, encode=lambda t: [],  # type: ignore[arg-type]
                    piece_of=None, settings=SessionSettings(turn_detection="client"))
    asr = FakeAsr()
    p.asr = asr  # type: ignore[assignment]
    return p, asr


def _ev(kind: EventType, text: str = "", utterance: int = 0) -> AsrEvent:
    return AsrEvent(kind, text, 0.0, 0.0, utterance)


def _committed(p: pl.Pipeline) -> list[UserTurnCommitted]:
    return [e for e in p.drain_events() if isinstance(e, UserTurnCommitted)]


def test_a_commit_takes_the_finals_before_its_cut_even_when_they_come_late() -> None:
    async def main() -> None:
        p, asr = _pipeline()
        p.apply(CommitTurn())  # the recogniser lags: nothing reported yet
        assert asr.count == 1 and _committed(p) == []
        p._on_asr(_ev(EventType.SPEECH_STARTED, utterance=0))
        p._on_asr(_ev(EventType.PARTIAL, "what is", utterance=0))
        p._on_asr(_ev(EventType.FINAL, "what is the weather", utterance=0))
        assert _committed(p) == []
        p._on_asr(_ev(EventType.CUT))
        assert [(e.turn, e.text) for e in _committed(p)] == [(1, "what is the weather")]
        # a clear drops what was said before it (even words the recogniser reports after the clear)
        p.apply(ClearTurn())
        p._on_asr(_ev(EventType.FINAL, "forget the zebra", utterance=1))
        p._on_asr(_ev(EventType.CUT))
        p._on_asr(_ev(EventType.FINAL, "and tomorrow", utterance=2))
        p.apply(CommitTurn())
        p._on_asr(_ev(EventType.CUT))
        assert [(e.turn, e.text) for e in _committed(p)] == [(2, "and tomorrow")]

    asyncio.run(main())


def test_a_commit_the_recogniser_never_reaches_takes_the_last_partial(monkeypatch: Any) -> None:
    monkeypatch.setattr(pl, "COMMIT_FINAL_WAIT_S", 0.05)

    async def main() -> None:
        p, _ = _pipeline()
        p._on_asr(_ev(EventType.SPEECH_STARTED, utterance=0))
        p._on_asr(_ev(EventType.PARTIAL, "book a table", utterance=0))
        p.apply(CommitTurn())
        await asyncio.sleep(0.2)
        assert [(e.turn, e.text) for e in _committed(p)] == [(1, "book a table")]
        p._on_asr(_ev(EventType.FINAL, "book a table for two", utterance=0))  # late: taken already
        p._on_asr(_ev(EventType.CUT))
        p.apply(CommitTurn())
        p._on_asr(_ev(EventType.CUT))
        assert [(e.turn, e.text) for e in _committed(p)] == [(2, "")]

    asyncio.run(main())


def test_the_transcribers_cut_ends_the_turn_and_reports_its_final_before_the_cut() -> None:
    from kame.asr.config import AsrConfig
    from kame.asr.transcriber import SegmentingTranscriber, Utterance

    class Counting(SegmentingTranscriber):
        def partial_text(self, utt: Utterance) -> str:
            return "partial"

        def final_text(self, utt: Utterance) -> str:
            return f"final of {utt.samples} samples"

    from tests.support.speech import synthesize

    t = Counting(AsrConfig())
    kinds = [e.type for e in t.push(synthesize("Hello there, how are you doing today?"))]
    assert EventType.SPEECH_STARTED in kinds
    out = t.cut()
    assert [e.type for e in out] == [EventType.SPEECH_STOPPED, EventType.FINAL, EventType.CUT]
    assert [e.type for e in t.cut()] == [EventType.CUT]  # nothing open: only the cut


def test_a_recogniser_that_cannot_cut_gives_its_last_partial_at_once() -> None:
    async def main() -> None:
        p, asr = _pipeline()
        asr.cuts_supported = False
        p._on_asr(_ev(EventType.FINAL, "hello there", utterance=0))
        p._on_asr(_ev(EventType.PARTIAL, "how are", utterance=1))
        p.apply(CommitTurn())
        assert [(e.turn, e.text) for e in _committed(p)] == [(1, "hello there how are")]
        p._on_asr(_ev(EventType.FINAL, "how are you", utterance=1))  # its final: given already
        p.apply(CommitTurn())
        assert [(e.turn, e.text) for e in _committed(p)] == [(2, "")]

    asyncio.run(main())


def test_back_to_server_turns_a_clear_the_recogniser_has_not_reached_still_drops_its_words() -> None:
    async def main() -> None:
        p, asr = _pipeline()
        p.apply(ClearTurn())  # the recogniser lags: "forget the zebra" is still to come
        p.update(SessionSettings(turn_detection="server_vad"))
        assert asr.count == 2  # the clear's cut, and the switch's
        p._on_asr(_ev(EventType.SPEECH_STARTED, utterance=0))
        p._on_asr(_ev(EventType.FINAL, "forget the zebra", utterance=0))
        p._on_asr(_ev(EventType.CUT))  # the clear's
        p._on_asr(_ev(EventType.CUT))  # the switch's
        events = p.drain_events()
        assert not [e for e in events if getattr(e, "text", "") == "forget the zebra"], events
        # from here on the server's turns as usual
        p._on_asr(_ev(EventType.SPEECH_STARTED, utterance=1))
        assert [type(e).__name__ for e in p.drain_events()] == ["SpeechStarted"]

    asyncio.run(main())
