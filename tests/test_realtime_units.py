"""Pure pieces of /v1/realtime: event shapes (checked against the OpenAI SDK's own models), response
segmentation, user turns, client-event decoding, session.update validation, input pacing."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter

from kame.server.runtime.pacing import InputPacer
from kame.server.wires.realtime import events as ev
from kame.server.wires.realtime.audio import Pcm16In
from kame.server.wires.realtime.decode import (
    UNSUPPORTED,
    AppendAudio,
    SessionReset,
    SessionUpdate,
    decode_client_event,
)
from kame.server.wires.realtime.events import ClientError, EventEncoder, Ids
from kame.server.wires.realtime.settings import (
    ServerInfo,
    parse_session_update,
    session_object,
)
from kame.server.wires.realtime.turns import AssistantTurns, Conversation, UserTurns
from kame.session import events as pe
from kame.session.settings import SessionSettings

INFO = ServerInfo(session_id="abc", backends=("fast", "slow"), default_backend="fast", asr_kind="whisper")


def sdk_parse(event: dict[str, Any]) -> Any:
    """Validate an event with the installed openai SDK's GA models (strict pydantic validation)."""
    from openai.types.realtime.realtime_server_event import RealtimeServerEvent

    return TypeAdapter(RealtimeServerEvent).validate_python(dict(event, event_id="event_x"))


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


LOUD = np.full(1920, 0.2, np.float32)
QUIET = np.zeros(1920, np.float32)

# --------------------------------------------------------------------------- encoding


def test_encoder_stamps_unique_ordered_event_ids() -> None:
    enc = EventEncoder(Ids("s1"))
    a = json.loads(enc.encode({"type": "x", "v": 1}))
    b = json.loads(enc.encode({"type": "x"}))
    assert list(a)[:2] == ["type", "event_id"] and a["v"] == 1
    assert a["event_id"] != b["event_id"] and a["event_id"].startswith("event_s1")


def test_pcm16_round_trip_and_clipping() -> None:
    from kame.client.realtime_client import b64_pcm, pcm16_b64

    pcm = np.array([0.0, 0.5, -0.5, 2.0, -2.0], np.float32)
    assert ev.pcm16_base64(pcm) == pcm16_b64(pcm)
    back = b64_pcm(ev.pcm16_base64(pcm))
    np.testing.assert_allclose(back, [0.0, 0.5, -0.5, 1.0, -1.0], atol=1e-4)
    assert len(base64.b64decode(ev.pcm16_base64(np.zeros(1920, np.float32)))) == 3840


def test_session_object_is_a_valid_ga_session() -> None:
    from openai.types.realtime.session_created_event import SessionCreatedEvent

    obj = session_object(SessionSettings(text_topk=5), INFO)
    parsed = SessionCreatedEvent.model_validate({"type": "session.created", "event_id": "e", "session": obj})
    assert parsed.session.type == "realtime"
    assert obj["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert obj["kame"]["backend"] == "fast" and obj["kame"]["text_topk"] == 5
    assert obj["kame"]["server"]["backends"] == ["fast", "slow"]
    none = session_object(SessionSettings(), ServerInfo(session_id="x"))
    assert none["audio"]["input"]["turn_detection"] is None and none["kame"]["backend"] is None


# --------------------------------------------------------------------------- assistant responses


def test_response_lifecycle_from_continuous_frames() -> None:
    conv = Conversation()
    turns = AssistantTurns(Ids("t"), conv, end_silence_frames=3)
    out = turns.frame("QUFB", speaking=False)
    assert types(out) == ["kame.output_audio.delta"]
    out = turns.frame("QUFB", speaking=True, text="\u2581Hello")
    assert types(out) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
    ]
    rid, iid = out[0]["response"]["id"], out[1]["item"]["id"]
    assert out[5]["delta"] == "Hello"  # the leading space of a response is dropped
    out = turns.frame("QUFB", speaking=True, text="\u2581world")
    assert out[1]["delta"] == " world"
    for _ in range(2):
        assert types(turns.frame("QUFB", speaking=False)) == ["response.output_audio.delta"]
    out = turns.frame("QUFB", speaking=False)
    assert types(out) == [
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert out[2]["transcript"] == "Hello world" and out[-1]["response"]["status"] == "completed"
    assert out[-1]["response"]["output"][0]["content"][0]["transcript"] == "Hello world"
    for e in out:
        if "response_id" in e:
            assert (e["response_id"], e.get("item_id", iid)) == (rid, iid)
    # everything validates against the SDK's models; the next speech is a new response
    for e in out:
        sdk_parse(e)
    again = turns.frame("QUFB", speaking=True)
    assert again[0]["response"]["id"] != rid
    assert again[2]["previous_item_id"] == iid
    assert turns.responses == 2


def test_response_cut_by_user_turn_max_length_and_close() -> None:
    turns = AssistantTurns(Ids("t"), Conversation(), max_frames=4)
    assert turns.close() == []
    turns.frame("QQ==", speaking=True)
    closed = turns.close("incomplete")
    assert closed[-1]["response"]["status"] == "incomplete"
    assert closed[-1]["response"]["status_details"] == {"type": "incomplete", "reason": None}
    sdk_parse(closed[-1])
    out: list[dict[str, Any]] = []
    for _ in range(9):
        out += turns.frame("QQ==", speaking=True)
    assert types(out).count("response.created") == 3 and types(out).count("response.done") == 2


def test_dropped_frames_keep_the_lifecycle_and_silence_can_be_muted() -> None:
    turns = AssistantTurns(Ids("t"), Conversation(), end_silence_frames=1)
    out = turns.frame(None, speaking=True, text="hi")
    assert "response.output_audio.delta" not in types(out) and "response.output_audio_transcript.delta" in types(out)
    assert turns.frame(None, speaking=False)[-1]["type"] == "response.done"
    assert turns.frame(None, speaking=False) == []
    turns.silence_audio = False
    assert turns.frame("QQ==", speaking=False) == []
    assert turns.speaking(LOUD, None) and not turns.speaking(QUIET, None) and turns.speaking(QUIET, "x")


# --------------------------------------------------------------------------- user turns


def test_user_turns_map_asr_events_to_items() -> None:
    conv = Conversation()
    users = UserTurns(Ids("u"), conv)
    out = users.speech_started(0, 1.25)
    assert types(out) == ["input_audio_buffer.speech_started", "conversation.item.added"]
    item = out[0]["item_id"]
    assert out[0]["audio_start_ms"] == 1250 and out[1]["item"]["role"] == "user"
    out = users.partial(0, 1.5, "what is", "what", 0.3)
    assert types(out) == ["conversation.item.input_audio_transcription.delta", "kame.input_audio_transcription.partial"]
    assert out[0]["delta"] == "what" and out[1]["text"] == "what is"
    out = users.partial(0, 1.7, "what's the", "what", 0.3)  # stable did not grow: no delta
    assert types(out) == ["kame.input_audio_transcription.partial"]
    out = users.partial(0, 1.9, "what is the capital", "what is the", None)
    assert out[0]["delta"] == " is the"
    out = users.speech_stopped(0, 2.5)
    assert types(out) == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert out[0]["audio_end_ms"] == 2500
    out = users.final(0, 2.9, "What is the capital of France?")
    assert types(out) == ["conversation.item.input_audio_transcription.completed", "conversation.item.done"]
    assert out[0]["item_id"] == item and out[0]["usage"] == {"type": "duration", "seconds": 1.65}
    for e in out:
        sdk_parse(e)
    # a final for a turn never announced opens it, stops it and completes it
    out = users.final(1, 4.0, "")
    assert types(out)[:2] == ["input_audio_buffer.speech_started", "conversation.item.added"]
    assert types(out)[-2:] == ["conversation.item.input_audio_transcription.completed", "conversation.item.done"]
    assert out[1]["previous_item_id"] == item
    users.speech_started(2, 5.0)
    failed = users.failed("boom")
    assert types(failed) == ["conversation.item.input_audio_transcription.failed"] and users.turns == {}


def test_user_turns_stay_bounded_without_finals() -> None:
    users = UserTurns(Ids("u"), Conversation(), max_open=3)
    for u in range(10):
        users.speech_started(u, float(u))
    assert sorted(users.turns) == [7, 8, 9]


# --------------------------------------------------------------------------- client events


def test_decode_supported_client_events() -> None:
    pcm = np.arange(10, dtype="<i2").tobytes()
    cmd = decode_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode(), "event_id": "c1"}))
    assert cmd == AppendAudio(pcm, "c1")
    assert decode_client_event('{"type":"session.update","session":{"type":"realtime"}}') == SessionUpdate({"type": "realtime"})
    assert decode_client_event('{"type":"kame.session.reset"}') == SessionReset()


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (b"\x01\x02", "binary_not_supported"),
        ("", "invalid_json"),
        (None, "invalid_json"),
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ('"text"', "invalid_json"),
        ("{}", "invalid_event"),
        ('{"type": 5}', "invalid_event"),
        ('{"type": "nope.nope"}', "unknown_event"),
        ('{"type": "input_audio_buffer.append"}', "missing_required_parameter"),
        ('{"type": "input_audio_buffer.append", "audio": "@@@"}', "invalid_base64"),
        ('{"type": "input_audio_buffer.append", "audio": 12}', "invalid_base64"),
        ('{"type": "input_audio_buffer.append", "audio": "QUJ"}', "invalid_base64"),
        ("[" * 100000 + "]" * 100000, "invalid_json"),
    ],
)
def test_decode_errors(message: Any, code: str) -> None:
    with pytest.raises(ClientError) as info:
        decode_client_event(message)
    assert info.value.code == code
    event = info.value.to_event()
    sdk_parse(event)
    assert len(event["error"]["message"]) < 200


@pytest.mark.parametrize("etype", sorted(UNSUPPORTED))
def test_unsupported_events_say_why_and_quote_the_event_id(etype: str) -> None:
    with pytest.raises(ClientError) as info:
        decode_client_event(json.dumps({"type": etype, "event_id": "evt_7"}))
    assert info.value.code == "unsupported_event" and info.value.event_id == "evt_7"
    assert etype in info.value.message


def test_pcm16_input_rechunks_any_size_including_odd_bytes() -> None:
    samples = (np.arange(1920 * 3) % 2000 - 1000).astype("<i2")
    data = samples.tobytes()
    pin = Pcm16In(1920)
    frames: list[np.ndarray] = []
    for size in (1, 3, 7, 128, 3839, 1, 1000):
        while data:
            frames += pin.push(data[:size])
            data = data[size:]
            break
    frames += pin.push(data)
    assert len(frames) == 3 and all(f.shape == (1920,) for f in frames)
    np.testing.assert_allclose(np.concatenate(frames), samples.astype(np.float32) / 32768.0)
    assert pin.pending_samples == 0 and pin.push(b"") == []


# --------------------------------------------------------------------------- session.update


def test_session_update_applies_kame_settings_and_instructions() -> None:
    s, ignored = parse_session_update(
        {
            "type": "realtime",
            "instructions": "Be brief.",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}, "output": {"format": {"type": "audio/pcm"}}},
            "output_modalities": ["audio"],
            "voice": "alloy",
            "tools": [],
            "kame": {"backend": "slow", "oracle_policy": "freeze_when_speaking", "text_topk": 20.0, "oracle_delay_s": 1},
        },
        SessionSettings(),
        INFO,
    )
    assert (s.backend, s.oracle_policy, s.text_topk, s.oracle_delay_s, s.instructions) == (
        "slow", "freeze_when_speaking", 20, 1.0, "Be brief.")
    assert ignored == ("voice",)
    assert s.oracle_part() != SessionSettings().oracle_part()
    # an update keeps what it does not name; sampling is always read as a pair
    t, _ = parse_session_update({"kame": {"text_temperature": 0.5}}, s, INFO)
    assert t.sampling() == (0.5, 20) and t.oracle_part() == s.oracle_part()
    # beta shapes
    b, _ = parse_session_update({"input_audio_format": "pcm16", "output_audio_format": "pcm16", "modalities": ["audio", "text"]},
                                SessionSettings(), INFO)
    assert b == SessionSettings()


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        (None, "missing_required_parameter", "session"),
        ("x", "invalid_value", "session"),
        ({"type": "transcription"}, "invalid_value", "session.type"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "unsupported_audio_format", "session.audio.input.format"),
        ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "unsupported_audio_format",
         "session.audio.output.format"),
        ({"input_audio_format": "g711_ulaw"}, "unsupported_audio_format", "session.input_audio_format"),
        ({"output_modalities": ["text"]}, "invalid_value", "session.output_modalities"),
        ({"tools": [{"type": "function", "name": "f"}]}, "tools_not_allowed", "session.tools"),  # a back-end that may not
        ({"tools": [{"type": "mcp", "server_url": "http://x"}]}, "unsupported_tool_type", "session.tools[0].type"),
        ({"instructions": 5}, "invalid_value", "session.instructions"),
        ({"instructions": "x" * 20001}, "invalid_value", "session.instructions"),
        ({"kame": []}, "invalid_value", "session.kame"),
        ({"kame": {"bakend": "fast"}}, "unknown_parameter", "session.kame.bakend"),
        ({"kame": {"backend": "nope"}}, "unknown_backend", "session.kame.backend"),
        ({"kame": {"oracle_policy": "sometimes"}}, "invalid_value", "session.kame.oracle_policy"),
        ({"kame": {"barge_in": "shout"}}, "invalid_value", "session.kame.barge_in"),
        ({"kame": {"text_temperature": -1}}, "invalid_value", "session.kame.text_temperature"),
        ({"kame": {"text_temperature": True}}, "invalid_value", "session.kame.text_temperature"),
        ({"kame": {"text_topk": 2.5}}, "invalid_value", "session.kame.text_topk"),
        ({"kame": {"text_topk": 0}}, "invalid_value", "session.kame.text_topk"),
        ({"kame": {"oracle_delay_s": float("nan")}}, "invalid_value", "session.kame.oracle_delay_s"),
        ({"kame": {"record": "yes"}}, "invalid_value", "session.kame.record"),
        ({"kame": {"record": True}}, "recording_disabled", "session.kame.record"),
        ({"truncation": "sometimes"}, "invalid_value", "session.truncation"),
        ({"truncation": {"type": "retention_ratio", "retention_ratio": 1.5}}, "invalid_value",
         "session.truncation.retention_ratio"),
        ({"truncation": {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}}},
         "invalid_value", "session.truncation.token_limits.post_instructions"),
    ],
)
def test_session_update_errors_change_nothing(session: Any, code: str, param: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_session_update(session, SessionSettings(), INFO)
    assert (info.value.code, info.value.param) == (code, param)


def test_truncation_as_openai_defines_it() -> None:
    """``truncation`` is applied (not ignored) and reported in the GA shape the SDK's type accepts."""
    from openai.types.realtime.realtime_session_create_request import RealtimeSessionCreateRequest

    from kame.oracle.window import Truncation

    assert session_object(SessionSettings(), INFO)["truncation"] == "auto"
    wanted = {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 8000}}
    s, ignored = parse_session_update({"truncation": wanted}, SessionSettings(), INFO)
    assert s.truncation == Truncation("retention_ratio", 0.8, 8000) and not ignored
    assert s.oracle_part() != SessionSettings().oracle_part()  # reaches the oracle loop
    shown = session_object(s, INFO)
    assert shown["truncation"] == wanted
    RealtimeSessionCreateRequest.model_validate({"type": "realtime", "truncation": shown["truncation"]})
    d, _ = parse_session_update({"truncation": "disabled"}, s, INFO)
    assert d.truncation == Truncation("disabled") and session_object(d, INFO)["truncation"] == "disabled"


# --------------------------------------------------------------------------- pacing


def test_pacer_passes_real_time_audio_at_once() -> None:
    p: InputPacer[int] = InputPacer(frame_s=0.08, burst_s=0.5, buffer_s=2.0, now=0.0)
    released = []
    for k in range(100):  # 8 s at real time with +-30 ms jitter
        t = k * 0.08 + (0.03 if k % 2 else -0.03)
        released += p.push([k], max(0.0, t)).released
    assert released == list(range(100)) and p.queued == 0 and p.dropped_frames == 0


def test_pacer_queues_then_drops_a_flood_and_releases_at_real_time() -> None:
    p: InputPacer[int] = InputPacer(frame_s=0.08, burst_s=0.16, buffer_s=0.8, now=0.0)
    pushed = p.push(list(range(20)), 0.0)
    assert pushed.released == [0, 1] and p.queued == 10 and pushed.dropped == 8 and pushed.overflow_started
    again = p.push([99], 0.0)
    assert again.dropped == 1 and not again.overflow_started  # one report per episode
    assert p.next_release_in(0.0) == pytest.approx(0.08)
    assert p.release(0.05) == []
    assert p.release(0.081) == [2]
    assert p.release(0.081 + 0.8) == [3, 4]  # never more than the burst at once after a stall
    out = []
    for k in range(1, 8):
        out += p.release(0.881 + k * 0.08 + 1e-6)
    assert out == [5, 6, 7, 8, 9, 10, 11]
    assert p.next_release_in(2.0) is None and p.dropped_s == pytest.approx(0.72)
    later = p.push(list(range(30)), 10.0)
    assert later.overflow_started  # a new episode after the queue drained


# --------------------------------------------------------------------------- kame.* events


def test_kame_events_from_pipeline_events_without_secrets() -> None:
    e = ev.kame_event(pe.LlmFirstToken(request_id=3, backend="fast", ttft_s=0.123456789))
    assert e == {"type": "kame.backend.first_token", "request_id": 3, "backend": "fast", "ttft_s": 0.1235}
    err = ev.kame_event(pe.LlmError(
        request_id=1, backend="b", error="http_status", message="401 from https://llm.internal/v1?key=sk-123 Bearer sk-abc",
    ))
    assert err is not None and "llm.internal" not in err["message"] and "sk-abc" not in err["message"]
    frame = pe.AssistantFrame(step=0, pcm=np.zeros(1920, np.float32), text_id=5, piece="x", oracle_id=3)
    assert ev.kame_event(frame) is None
    reset = ev.kame_event(pe.OracleReset(request_id=1, text="Paris", tokens=3))
    assert reset is not None and reset["type"] == "kame.oracle.reset"
