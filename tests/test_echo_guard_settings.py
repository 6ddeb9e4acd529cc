"""The echo guard's per-session setting on every wire (and bad values refused in one sentence each), its
verdicts as kame events and as a metric, and the pipeline switching it mid-session."""

from __future__ import annotations

import pytest

from kame.asr.config import EchoGuardConfig
from kame.asr.events import AsrEvent, EventType
from kame.server.access.params import ParamError, parse_session_params
from kame.server.telemetry.metrics import ServerMetrics
from kame.server.wires.live.config import KameLiveSettings, LiveServerInfo, _kame
from kame.server.wires.live.events import LiveError
from kame.server.wires.realtime.events import ClientError, kame_event
from kame.server.wires.realtime.settings import ServerInfo, parse_session_update, session_object
from kame.session import pipeline as pl
from kame.session.events import EchoJudged, SpeechStarted, UserFinal
from kame.session.settings import SessionSettings


def test_the_query_parameter_turns_it_on_or_off_and_refuses_anything_else() -> None:
    assert parse_session_params({}).settings.echo_guard is None
    assert parse_session_params({"echo_guard": "0"}).settings.echo_guard is False
    assert parse_session_params({"echo_guard": "1"}).settings.echo_guard is True
    with pytest.raises(ParamError, match="echo_guard"):
        parse_session_params({"echo_guard": "maybe"})


def test_realtime_session_update_sets_it_and_the_session_shows_the_value_in_effect() -> None:
    info = ServerInfo(session_id="s", default_echo_guard=True)
    current = SessionSettings()
    assert session_object(current, info)["kame"]["echo_guard"] is True
    off, _ = parse_session_update({"kame": {"echo_guard": False}}, current, info)
    assert off.echo_guard is False and session_object(off, info)["kame"]["echo_guard"] is False
    back, _ = parse_session_update({"kame": {"echo_guard": None}}, off, info)
    assert back.echo_guard is None
    with pytest.raises(ClientError) as err:
        parse_session_update({"kame": {"echo_guard": "yes"}}, current, info)
    assert err.value.code == "invalid_value" and err.value.param == "session.kame.echo_guard"


def test_live_session_kame_sets_it_and_refuses_a_non_boolean() -> None:
    info = LiveServerInfo(session_id="s")
    assert _kame({"echo_guard": False}, KameLiveSettings(), info, None).echo_guard is False
    with pytest.raises(LiveError):
        _kame({"echo_guard": 3}, KameLiveSettings(), info, None)


def test_verdicts_become_a_kame_event_and_a_metric() -> None:
    judged = EchoJudged(utterance=0, audio_s=3.2, echo=True, text="the capital is Paris", words=4, matched=4,
                        extra=0, delay_s=0.3)
    event = kame_event(judged)
    assert event is not None and event["type"] == "kame.echo_guard.verdict" and event["echo"] is True
    metrics = ServerMetrics()
    metrics.on_event(judged)
    metrics.on_event(EchoJudged(utterance=1, audio_s=5.0, echo=False, text="yes Paris", words=2, matched=1, extra=1))
    text = metrics.render().decode()
    assert 'kame_echo_guard_utterances_total{verdict="echo"} 1.0' in text
    assert 'kame_echo_guard_utterances_total{verdict="user"} 1.0' in text


def _pipeline(settings: SessionSettings, enabled: bool = True) -> pl.Pipeline:
    return pl.Pipeline(engine=None, oracle_config=None, registry=None, recognizer=None,  # type: ignore[arg-type]
                       encode=lambda t: [], piece_of=None, settings=settings,
                       echo_guard=EchoGuardConfig(enabled=enabled))


def _say(p: pl.Pipeline, text: str) -> None:
    for step, word in enumerate(text.split()):
        p.echo.assistant_step("\u2581" + word, step * 4)


def test_the_pipeline_drops_an_echo_and_a_session_may_turn_the_guard_off() -> None:
    p = _pipeline(SessionSettings())
    _say(p, "The capital is Paris.")
    p._hear(AsrEvent(EventType.SPEECH_STARTED, "", 1.0, 0.0, 0))
    p._hear(AsrEvent(EventType.FINAL, "The capital is Paris.", 2.0, 0.0, 0))
    out = p.drain_events()
    assert [type(e) for e in out] == [EchoJudged] and out[0].echo  # type: ignore[attr-defined]
    p.update(SessionSettings(echo_guard=False))
    p._hear(AsrEvent(EventType.SPEECH_STARTED, "", 2.5, 0.0, 1))
    p._hear(AsrEvent(EventType.FINAL, "The capital is Paris.", 3.0, 0.0, 1))
    assert [type(e) for e in p.drain_events()] == [SpeechStarted, UserFinal]
    q = _pipeline(SessionSettings(), enabled=False)  # the server's default off; the session's choice wins
    assert not q.echo.enabled and _pipeline(SessionSettings(echo_guard=True), enabled=False).echo.enabled
