"""/v1/realtime's wire with client turns (docs/protocol.md 3.5a): ``turn_detection: null`` is echoed, a commit
is answered at once and its transcript lands on its item, a clear is answered, the ASR's VAD events are not
sent in this mode; back to server VAD mid-session; with server VAD a commit needs speech in progress."""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from kame.server.runtime.wire import Fault, Reply, SettingsIn
from kame.server.wires.realtime.settings import ServerInfo
from kame.server.wires.realtime.wire import RealtimeWire
from kame.session import commands as sc
from kame.session import events as pe
from kame.session.settings import SessionSettings

INFO = ServerInfo(session_id="abcdef012345", backends=("llm",), default_backend="llm", asr_kind="whisper")


def _adapter() -> TypeAdapter[Any]:
    from openai.types.realtime.realtime_server_event import RealtimeServerEvent

    return TypeAdapter(RealtimeServerEvent)


ADAPTER = _adapter()


def _send(wire: RealtimeWire, event: dict[str, Any], commands: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for c in wire.decode({"type": "websocket.receive", "text": json.dumps(event)}, 0.0):
        if isinstance(c, SettingsIn):
            out += [json.loads(o.data) for o in wire.settings_applied(c.settings, c)]
        elif isinstance(c, (Reply, Fault)):
            out += [json.loads(o.data) for o in (c.messages if isinstance(c, Reply) else c.reply)]
        elif isinstance(c, sc.ConversationCommand):  # the session's own command, not wrapped
            commands.append(c)
    for e in out:
        ADAPTER.validate_python(e)
    return out


def _event(wire: RealtimeWire, event: pe.PipelineEvent) -> list[dict[str, Any]]:
    out = [json.loads(o.data) for o in wire.event(event)]
    for e in out:
        ADAPTER.validate_python(e)
    return out


def test_commit_and_clear_with_client_turns_then_back_to_server_vad() -> None:
    wire = RealtimeWire(INFO, SessionSettings())
    commands: list[Any] = []
    updated = _send(wire, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}, commands)
    assert updated[0]["session"]["audio"]["input"]["turn_detection"] is None and wire.settings.client_turns
    # the ASR's own turn events are not sent in this mode
    assert _event(wire, pe.SpeechStarted(utterance=0, audio_s=1.0)) == []
    assert _event(wire, pe.UserFinal(utterance=0, audio_s=2.0, text="what is the weather")) == []
    got = _send(wire, {"type": "input_audio_buffer.commit"}, commands)
    assert [e["type"] for e in got] == ["input_audio_buffer.committed", "conversation.item.added"]
    assert commands[-1] == sc.CommitTurn()
    item_id = got[0]["item_id"]
    done = _event(wire, pe.UserTurnCommitted(turn=1, text="what is the weather"))
    assert [e["type"] for e in done] == ["conversation.item.input_audio_transcription.completed", "conversation.item.done"]
    assert done[0]["item_id"] == item_id and done[0]["transcript"] == "what is the weather"
    assert [e["type"] for e in _send(wire, {"type": "input_audio_buffer.clear"}, commands)] == ["input_audio_buffer.cleared"]
    assert commands[-1] == sc.ClearTurn()
    # deleting the committed item forgets it in the back-end's history
    _send(wire, {"type": "conversation.item.delete", "item_id": item_id}, commands)
    assert commands[-1] == sc.ForgetContext(sc.commit_key(1))
    # back to server VAD, with create_response false: echoed
    back = _send(wire, {"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "create_response": False}}}}}, commands)
    td = back[0]["session"]["audio"]["input"]["turn_detection"]
    assert td["type"] == "server_vad" and td["create_response"] is False and not wire.settings.client_turns
    assert not wire.settings.backend_on_transcripts
    # with server VAD: a commit needs speech in progress (OpenAI's error otherwise), then ends it early
    err = _send(wire, {"type": "input_audio_buffer.commit"}, commands)
    assert [e["error"]["code"] for e in err] == ["input_audio_buffer_commit_empty"]
    assert [e["type"] for e in _event(wire, pe.SpeechStarted(utterance=1, audio_s=3.0))][0] == "input_audio_buffer.speech_started"
    assert _send(wire, {"type": "input_audio_buffer.commit"}, commands) == [] and commands[-1] == sc.CommitTurn()
