"""The /v1/live/sessions wire as the session runtime sees it (LiveWire): client messages -> the
runtime's commands, pipeline events -> messages, and the last words of every kind of end. Pure: no
socket, no engine, no torch."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette import status

from kame.oracle.config import OracleConfig
from kame.server.runtime.client_limits import ClientLimits
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.wire import AudioIn, EndIn, Fault, Outgoing, Reply, SettingsIn
from kame.server.wires.live.config import LiveServerInfo
from kame.server.wires.live.wire import MAX_CLIENT_ERRORS, LiveWire
from kame.session import events as pe
from kame.session.answer_source import OracleWriter, SourceIO
from kame.session.commands import AppendAnswer
from kame.session.delegated_answers import delegation_source
from kame.session.settings import SessionSettings

INFO = LiveServerInfo(session_id="feedbeef0001", asr="whisper", admitted_at=1_800_000_000.0, usage_interval_s=1.0)


@pytest.fixture(scope="module")
def encode(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[int]]:
    import sentencepiece as spm

    from kame.frontend.tiny import train_tokenizer

    path: Path = tmp_path_factory.mktemp("sp") / "tok.model"
    train_tokenizer(path, vocab_size=400)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return lambda text: list(sp.encode(text, out_type=int))


def msg(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": json.dumps(event)}


def sent(outs: list[Outgoing]) -> list[dict[str, Any]]:
    return [json.loads(o.data) for o in outs]


def replies(commands: list[Any]) -> list[dict[str, Any]]:
    return [e for c in commands if isinstance(c, Reply) for e in sent(list(c.messages))]


def bound(encode: Callable[[str], list[int]], settings: SessionSettings | None = None) -> LiveWire:
    """A Live wire as the runtime holds it: it knows nothing of the session's answers."""
    return LiveWire(INFO, settings or SessionSettings())


def started(encode: Callable[[str], list[int]], session: dict[str, Any] | None = None) -> LiveWire:
    wire = bound(encode)
    commands = wire.decode(msg({"type": "session.start", "event_id": "s", "session": session or {"model": "gpt-live-1"}}), 10.0)
    settings = [c for c in commands if isinstance(c, SettingsIn)]
    assert settings and settings[0].settings.delegation is not None  # the session's answer source: client delegation
    assert len(settings) == 1 and not replies(commands)  # session.started waits for the pipeline
    out = sent(wire.settings_applied(settings[0].settings, settings[0]))
    assert out[0]["type"] == "session.started" and out[0]["client_event_id"] == "s"
    return wire


def frame(index: int, piece: str | None = None, t: float = 10.0) -> pe.AssistantFrame:
    return pe.AssistantFrame(step=index, pcm=np.zeros(1920, np.float32), text_id=None, piece=piece, oracle_id=-1, t=t)


def test_start_runs_without_llm_with_the_extensions_sampling(encode: Callable[[str], list[int]]) -> None:
    wire = bound(encode, SessionSettings(backend="x"))
    assert wire.opening(SessionSettings()) == []  # the client speaks first
    commands = wire.decode(msg({"type": "session.start", "session": {"model": "m", "kame": {"text_topk": 7}}}), 1.0)
    (settings,) = [c for c in commands if isinstance(c, SettingsIn)]
    assert settings.settings.llm is False and settings.settings.text_topk == 7 and settings.settings.backend == "x"
    out = sent(wire.settings_applied(settings.settings, settings))
    assert out[0]["session"]["expires_at"] == 1_800_000_600 and out[0]["session"]["kame"]["text_topk"] == 7


def test_audio_commentary_and_close_become_commands(encode: Callable[[str], list[int]]) -> None:
    wire = started(encode)
    audio = base64.b64encode(np.zeros(2400, "<i2").tobytes()).decode()
    (a,) = wire.decode(msg({"type": "session.input_audio.append", "audio": audio}), 11.0)
    assert isinstance(a, AudioIn) and len(a.frames) == 1
    (tiny,) = wire.decode(msg({"type": "session.input_audio.append", "audio": "AAAA"}), 11.1)
    assert isinstance(tiny, AudioIn) and tiny.frames == []  # still audio activity for the idle timer
    commands = wire.decode(msg({"type": "session.commentary.append", "content": "Paris, of course.",
                                "delegation_id": None, "event_id": "c"}), 12.5)
    (append,) = commands  # the session's command, applied by its answer source
    assert isinstance(append, AppendAnswer) and append.received_t == 12.5 and append.event_id == "c"
    resets: list[tuple[list[int], Any]] = []
    writer = OracleWriter(lambda: type("Slot", (), {"oracle_reset": lambda self, ids, done=None: resets.append((ids, done))})())
    delegation = wire.live.delegation()
    assert delegation is not None
    source = delegation_source(delegation, SourceIO(writer, lambda e: None, lambda w: None),  # type: ignore[arg-type,return-value]
                               encode=encode, oracle_config=OracleConfig(), offer=None)
    ids = encode("Paris, of course.")
    ack, fed = [e for ev in source.apply(append) for e in sent(wire.event(ev))]
    assert [r[0] for r in resets] == [ids]
    assert ack["type"] == "session.commentary.appended" and ack["client_event_id"] == "c"
    assert fed == {**fed, "type": "kame.oracle.reset", "text": "Paris, of course.", "tokens": len(ids) + 1}
    (end,) = wire.decode(msg({"type": "session.close", "event_id": "bye"}), 13.0)
    assert isinstance(end, EndIn) and end.end.label == "close_requested" and end.end.code == status.WS_1000_NORMAL_CLOSURE
    last = sent(wire.closing(end.end))
    assert [e["type"] for e in last] == ["session.closed"]
    assert last[0]["reason"] == "close_requested" and last[0]["client_event_id"] == "bye"


def test_errors_are_faults_and_too_many_end_the_session(encode: Callable[[str], list[int]]) -> None:
    wire = started(encode)
    (fault,) = wire.decode(msg({"type": "decision.create", "event_id": "d"}), 11.0)
    assert isinstance(fault, Fault) and fault.code == "unsupported_event" and fault.end is None
    assert sent(list(fault.reply))[0]["error"]["client_event_id"] == "d"
    # the budget and the rate are the runtime's (ClientLimits, with the numbers the wire declares)
    limits = ClientLimits(wire.protocol, wire.max_messages_per_s, wire.max_client_errors)
    assert limits.refused(fault) is fault
    last = None
    for i in range(MAX_CLIENT_ERRORS - 1):
        (refused,) = wire.decode(msg({"type": "nope"}), 12.0 + i * 0.01)
        assert isinstance(refused, Fault)
        last = limits.refused(refused)
    assert isinstance(last, Fault) and last.end is not None and last.end.error_code == "too_many_errors"
    assert last.kind == "live" and not last.reply
    storm = ClientLimits(wire.protocol, wire.max_messages_per_s, wire.max_client_errors)
    results = [storm.message(5.0) for _ in range(1001)]
    assert results[:1000] == [None] * 1000 and storm.message(6.0) is None  # a new window
    over = results[-1]
    assert isinstance(over, Fault) and over.end is not None and over.kind == "live_rate"
    assert over.end.error_code == "rate_limited"


def test_frames_and_transcripts(encode: Callable[[str], list[int]]) -> None:
    fresh = bound(encode)
    assert fresh.frame(frame(0), 0, True) == []  # nothing before session.start
    wire = started(encode)
    outs = wire.frame(frame(0, "\u2581Hi"), 0, True)
    assert outs[0].audio_index == 0 and json.loads(outs[0].data)["type"] == "session.output_audio.delta"
    assert json.loads(outs[1].data)["delta"] == "Hi" and outs[1].audio_index is None
    assert [json.loads(o.data)["type"] for o in wire.frame(frame(1), 1, False)] == []  # audio dropped: nothing
    partial = sent(wire.event(pe.UserPartial(utterance=1, audio_s=0.9, text="what is the cap", stable="what is",
                                             latency_s=0.3, t=11.0)))
    assert [e["type"] for e in partial] == ["kame.input_transcript.partial", "session.input_transcript.delta"]
    final = sent(wire.event(pe.UserFinal(utterance=1, audio_s=1.6, text="what is the capital", t=12.0)))
    assert [e["type"] for e in final] == ["session.input_transcript.delta"]
    # the session's answer source opened a delegation on that final: placed where the words it heard end
    (opened,) = sent(wire.event(pe.DelegationOpened(delegation_id="dlg_feedbeef000001", t=12.0)))
    assert opened["type"] == "session.delegation.created" and opened["offset_ms"] == 1600
    usage = [e for e in sent(wire.frame(frame(2, t=12.4), 2, True)) if e["type"] == "session.usage.updated"]
    assert usage and usage[0]["usage"]["seconds"] == 2.0  # whole seconds since session.start (t=10)


@pytest.mark.parametrize("label,reason,info_code", [
    ("idle", "connection_lost", "kame.idle"),
    ("draining", "connection_lost", "kame.draining"),
    ("engine_error", "connection_lost", "kame.engine_error"),
    ("max_duration", "expired", None),
])
def test_every_end_has_its_last_words(encode: Callable[[str], list[int]], label: str, reason: str,
                                      info_code: str | None) -> None:
    wire = started(encode)
    error = "engine error, please reconnect" if label == "engine_error" else None
    end = SessionEnd(label, status.WS_1000_NORMAL_CLOSURE, f"why: {label}", error)
    last = sent(wire.closing(end))
    assert last[-1]["type"] == "session.closed" and last[-1]["reason"] == reason
    if info_code is None:
        assert len(last) == 1
    else:
        assert last[0]["type"] == "info" and last[0]["code"] == info_code and last[0]["message"]
    warning = sent(wire.expiring(12.0))[0]
    assert (warning["type"], warning["reason"], warning["seconds_left"]) == ("kame.session.ending", "max_duration", 12.0)
    drain = sent(wire.draining(2.0))[0]
    assert (drain["type"], drain["reason"], drain["seconds_left"]) == ("kame.session.ending", "draining", 2.0)
    gone = wire.closing(SessionEnd("client_closed", None))
    assert gone == []


def test_a_session_that_never_started_gets_only_its_error(encode: Callable[[str], list[int]]) -> None:
    wire = bound(encode)
    assert wire.closing(SessionEnd("idle", status.WS_1000_NORMAL_CLOSURE, "idle timeout")) == []
    out = sent(wire.closing(SessionEnd("engine_error", 1011, "engine error", "engine error, please reconnect", "engine_error")))
    assert out[0]["type"] == "error" and out[0]["error"]["code"] == "engine_error"
