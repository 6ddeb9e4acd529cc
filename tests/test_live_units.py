"""Pure pieces of the Live API wire (/v1/live/sessions): audio formats, events checked against the
openai SDK's own models, client-event decoding, session config, transcripts, delegations, appends,
usage and close reasons. No torch, no server."""

from __future__ import annotations

import base64
import itertools
import json
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter

from kame.oracle.config import OracleConfig
from kame.oracle.sanitize import spoken_words
from kame.server.wires.ids import Ids
from kame.server.wires.live.audio import LiveAudioFormat, LiveAudioIn, LiveAudioOut
from kame.server.wires.live.config import LiveServerInfo, parse_start, parse_update, session_resource
from kame.server.wires.live.decode import (
    REFUSED,
    AppendAudio,
    AppendContext,
    Close,
    Mute,
    Start,
    decode_client_event,
)
from kame.server.wires.live.events import (
    Appended,
    DelegationCreated,
    ErrorEvent,
    Info,
    InputAudioMuted,
    InputAudioUnmuted,
    InputTranscriptDelta,
    KameEvent,
    LiveEncoder,
    LiveError,
    LiveEvent,
    OutputAudioDelta,
    OutputTranscriptDelta,
    SessionClosed,
    SessionStarted,
    SessionUpdated,
    UsageUpdated,
)
from kame.server.wires.live.transcript import AssistantTranscript, UserTranscript
from kame.server.wires.live.usage import UsageClock, close_reason
from kame.session.commands import CommandRefused
from kame.session.delegation_rules import DelegationBook, DelegationPolicy
from tests.support.live_session import LiveSession

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

INFO = LiveServerInfo(session_id="abcd1234", asr="whisper", max_duration_s=600.0, usage_interval_s=5.0)
ENCODER = LiveEncoder(Ids("t"))


def sdk_validate(event: LiveEvent) -> Any:
    """Validate an encoded event with the installed openai SDK's Live models (strict pydantic validation)."""
    from openai.types.live.server_event import ServerEvent

    data = json.loads(ENCODER.encode(event))
    return TypeAdapter(ServerEvent).validate_python(data)


@pytest.fixture(scope="module")
def encode(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[int]]:
    """A real SentencePiece model (the tiny checkpoints' tokenizer recipe)."""
    import sentencepiece as spm

    from kame.frontend.tiny import train_tokenizer

    path: Path = tmp_path_factory.mktemp("sp") / "tok.model"
    train_tokenizer(path, vocab_size=400)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return lambda text: list(sp.encode(text, out_type=int))


def started_wire(encode: Callable[[str], list[int]], session: dict[str, Any] | None = None,
                 info: LiveServerInfo = INFO, now: float = 1000.0) -> LiveSession:
    wire = LiveSession(info, encode)
    out = wire.message(json.dumps({"type": "session.start", "session": session or {"model": "gpt-live-1"}}), now)
    assert out.started and not out.errors, out.events
    return wire


def sine(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spec) * rate / x.size)


def to_int16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).round().astype("<i2").tobytes()


def from_int16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0


# --------------------------------------------------------------------------- audio


def test_audio_formats_are_the_contracts() -> None:
    for fmt in (("audio/pcm", 24000), ("audio/pcm", 16000), ("audio/pcmu", 8000), ("audio/pcma", 8000)):
        LiveAudioFormat(*fmt)  # type: ignore[arg-type]
    for bad in (("audio/pcm", 8000), ("audio/pcm", 44100), ("audio/pcmu", 16000), ("audio/opus", 48000)):
        with pytest.raises(ValueError):
            LiveAudioFormat(*bad)  # type: ignore[arg-type]


def test_pcm24_passes_exactly_and_joins_odd_appends() -> None:
    pcm = sine(300, 24000, 0.25)
    data = to_int16(pcm)
    a = LiveAudioIn(LiveAudioFormat("audio/pcm", 24000))
    frames = []
    for i in range(0, len(data), 333):  # odd-sized appends split samples in half
        frames += a.push(data[i : i + 333])
    got = np.concatenate(frames)
    assert len(frames) == len(pcm) // 1920 and all(f.size == 1920 for f in frames)
    np.testing.assert_allclose(got, from_int16(data)[: got.size], atol=1e-6)
    out = LiveAudioOut(LiveAudioFormat("audio/pcm", 24000)).encode(frames[0])
    assert len(out) == 3840 and np.abs(from_int16(out) - frames[0]).max() < 1e-4


@pytest.mark.parametrize("rate", [16000])
def test_pcm16k_is_resampled_both_ways(rate: int) -> None:
    tone = sine(440, rate, 1.0)
    a = LiveAudioIn(LiveAudioFormat("audio/pcm", rate))
    data = to_int16(tone)
    frames = []
    for i in range(0, len(data), 640):  # 20 ms appends
        frames += a.push(data[i : i + 640])
    got = np.concatenate(frames)
    assert abs(got.size - 24000) <= 2 * 1920  # 1 s at 24 kHz, less the resampler's delay and the partial frame
    assert abs(peak_hz(got, 24000) - 440) < 3
    out = LiveAudioOut(LiveAudioFormat("audio/pcm", rate))
    engine = sine(440, 24000, 1.0)
    chunks = [out.encode(engine[i : i + 1920]) for i in range(0, engine.size, 1920)]
    back = from_int16(b"".join(chunks))
    assert abs(back.size - rate) < 400 and abs(peak_hz(back, rate) - 440) < 3


def tone_snr_db(x: np.ndarray, freq: float, rate: int) -> float:
    """SNR of a steady tone: least-squares fit of a sinusoid at ``freq``, residual as the noise."""
    t = np.arange(x.size) / rate
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t), np.ones_like(t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, x.astype(np.float64), rcond=None)
    fit = basis @ coef
    return float(10 * np.log10(np.sum(fit**2) / max(1e-20, np.sum((x - fit) ** 2))))


def test_pcm16k_tone_quality() -> None:
    a = LiveAudioIn(LiveAudioFormat("audio/pcm", 16000))
    data = to_int16(sine(440, 16000, 1.0))
    got = np.concatenate([f for i in range(0, len(data), 640) for f in a.push(data[i : i + 640])])
    assert tone_snr_db(got[2400:], 440, 24000) > 60  # PCM16 + a band-limited resampler


@pytest.mark.parametrize("kind", ["audio/pcmu", "audio/pcma"])
def test_g711_8k_both_ways_through_audioop(kind: str) -> None:
    lin2, to_lin = (audioop.lin2ulaw, audioop.ulaw2lin) if kind == "audio/pcmu" else (audioop.lin2alaw, audioop.alaw2lin)
    tone = sine(440, 8000, 1.0, amp=0.3)
    wire_bytes = lin2(to_int16(tone), 2)  # what a telephony client sends: 1 byte a sample
    assert len(wire_bytes) == 8000
    a = LiveAudioIn(LiveAudioFormat(kind, 8000))  # type: ignore[arg-type]
    frames = []
    for i in range(0, len(wire_bytes), 160):  # 20 ms RTP-sized appends
        frames += a.push(wire_bytes[i : i + 160])
    got = np.concatenate(frames)
    assert abs(got.size - 24000) <= 1920 + 300  # the partial last frame and the resampler's 12.5 ms
    assert abs(peak_hz(got, 24000) - 440) < 3
    snr = tone_snr_db(got[2400:], 440, 24000)
    assert 25 < snr < 60, snr  # G.711 keeps ~35 dB: decoded (not passed through as bytes), and no worse
    out = LiveAudioOut(LiveAudioFormat(kind, 8000))  # type: ignore[arg-type]
    engine = sine(440, 24000, 1.0, amp=0.3)
    chunks = [out.encode(engine[i : i + 1920]) for i in range(0, engine.size, 1920)]
    payload = b"".join(chunks)
    assert abs(len(payload) - 8000) <= 200  # one byte a sample at 8 kHz, less the resampler's 12.5 ms
    decoded = from_int16(to_lin(payload, 2))
    assert abs(peak_hz(decoded, 8000) - 440) < 3
    assert 25 < tone_snr_db(decoded[800:], 440, 8000) < 60
    assert 0.25 < float(np.abs(decoded[800:]).max()) < 0.35


def test_muted_input_is_silence_of_the_same_length() -> None:
    data = to_int16(sine(300, 16000, 0.5))
    live, muted = LiveAudioIn(LiveAudioFormat("audio/pcm", 16000)), LiveAudioIn(LiveAudioFormat("audio/pcm", 16000))
    a = live.push(data)
    b = muted.push(data, muted=True)
    assert len(a) == len(b) > 0
    assert all(float(np.abs(f).max()) == 0.0 for f in b) and float(np.abs(np.concatenate(a)).max()) > 0.1


# --------------------------------------------------------------------------- server events against the SDK


def test_every_server_event_validates_against_the_sdk(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    session = wire.session()
    events: list[LiveEvent] = [
        SessionStarted(session, "c1"),
        SessionUpdated(session),
        SessionClosed("close_requested", session, 12.0, "c2"),
        OutputAudioDelta(base64.b64encode(b"\0\0").decode()),
        InputTranscriptDelta("hello", 0, 480),
        OutputTranscriptDelta(" there", 480, 560),
        DelegationCreated("dlg_1", 800),
        Appended("commentary", 800, 1600, "c3"),
        Appended("thinking", 800, 800),
        Appended("instructions", 800, 800),
        UsageUpdated(5.0),
        InputAudioMuted("c4"),
        InputAudioUnmuted(),
        Info("ignored_parameter", "store is ignored", "c5"),
        ErrorEvent("unknown_event", "nope", param="type", client_event_id="c6"),
    ]
    for event in events:
        parsed = sdk_validate(event)
        assert parsed.type == event.type
    started = sdk_validate(events[0])
    assert started.client_event_id == "c1" and started.session.status == "active"
    assert started.session.delegation.type == "client"
    error = sdk_validate(events[-1])
    assert error.error.client_event_id == "c6" and error.client_event_id == "c6"
    delegated = sdk_validate(events[6])
    assert delegated.delegation.target == "client" and delegated.offset_ms == 800
    ids = [json.loads(ENCODER.encode(e)).get("event_id") for e in events]
    stamped = [i for i in ids if i is not None]
    assert len(stamped) == len(set(stamped)) == len(events) - 1  # all but the audio delta


def test_kame_events_survive_the_sdks_parser() -> None:
    from openai._models import construct_type_unchecked
    from openai.types.live.server_event import ServerEvent

    data = json.loads(ENCODER.encode(KameEvent("kame.oracle.reset", {"text": "hi", "tokens": 3})))
    parsed = construct_type_unchecked(value=data, type_=ServerEvent)  # what client.live.connect() does
    assert parsed.type == "kame.oracle.reset"


# --------------------------------------------------------------------------- decoding


def test_decode_commands() -> None:
    assert isinstance(decode_client_event('{"type":"session.start","session":{"model":"m"}}'), Start)
    audio = decode_client_event(json.dumps({"type": "session.input_audio.append", "audio": "AAA=", "event_id": "a"}))
    assert audio == AppendAudio(b"\0\0", "a")
    assert decode_client_event('{"type":"session.input_audio.mute"}') == Mute(True)
    assert decode_client_event('{"type":"session.input_audio.unmute","event_id":"u"}') == Mute(False, "u")
    assert decode_client_event('{"type":"session.close","event_id":"z"}') == Close("z")
    c = decode_client_event(json.dumps({"type": "session.commentary.append", "content": "Paris.", "delegation_id": None}))
    assert c == AppendContext("commentary", "Paris.", None)
    t = decode_client_event(json.dumps({"type": "session.thinking.append", "content": "x", "delegation_id": "dlg_1"}))
    assert isinstance(t, AppendContext) and t.kind == "thinking" and t.delegation_id == "dlg_1"


@pytest.mark.parametrize("etype", sorted(REFUSED))
def test_refused_events_name_the_reason(etype: str) -> None:
    with pytest.raises(LiveError) as info:
        decode_client_event(json.dumps({"type": etype, "event_id": "e1"}))
    assert info.value.code == "unsupported_event" and info.value.client_event_id == "e1"
    assert etype in info.value.message


@pytest.mark.parametrize(
    "message,code,param",
    [
        (b"\x00\x01", "binary_not_supported", None),
        ("", "invalid_json", None),
        ("{not json", "invalid_json", None),
        ("[1,2]", "invalid_json", None),
        ('{"type": 3}', "invalid_event", "type"),
        ('{"type": "session.nope"}', "unknown_event", "type"),
        ('{"type": "session.input_audio.append"}', "missing_required_parameter", "audio"),
        ('{"type": "session.input_audio.append", "audio": "***"}', "invalid_base64", "audio"),
        ('{"type": "session.commentary.append"}', "missing_required_parameter", "content"),
        ('{"type": "session.thinking.append", "content": 5}', "invalid_value", "content"),
        ('{"type": "session.commentary.append", "content": "x", "delegation_id": 7}', "invalid_value", "delegation_id"),
        ('{"type": "session.start"}', "missing_required_parameter", "session"),
        ('{"type": "session.update", "session": 1}', "missing_required_parameter", "session"),
    ],
)
def test_decode_errors(message: str | bytes, code: str, param: str | None) -> None:
    with pytest.raises(LiveError) as info:
        decode_client_event(message)
    assert info.value.code == code and info.value.param == param


# --------------------------------------------------------------------------- session.start / update


def test_start_resolves_the_config() -> None:
    parsed = parse_start({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}},
                         replace(INFO, admitted_at=1_000_000.0))
    c = parsed.config
    assert c.model == "gpt-live-1" and c.audio == LiveAudioFormat("audio/pcmu", 8000)
    assert c.expires_at == 1_000_600 and not parsed.infos
    assert parse_start({"model": "m", "audio": {"format": {"type": "audio/pcm"}}}, INFO).config.audio.rate == 24000


def test_no_cap_has_no_expiry() -> None:
    """``server.max_duration_s: 0`` (no cap): ``expires_at`` is 0, still the int the SDK's model declares."""
    from openai.types.live.session_resource import SessionResource

    parsed = parse_start({"model": "m"}, replace(INFO, admitted_at=1_000_000.0, max_duration_s=0.0))
    assert parsed.config.expires_at == 0
    resource = session_resource(parsed.config, INFO)
    assert resource["expires_at"] == 0 and SessionResource.model_validate(resource).expires_at == 0


def test_ignored_fields_each_get_an_info() -> None:
    session = {
        "model": "gpt-live-1",
        "store": True,
        "safety_identifier": "user-42",
        "audio": {"output": {"voice": "marin"}},
        "delegation": {"type": "client", "acknowledgement_delay_ms": 400},
        "client": {"data_channel": {"allowed_client_events": "all"}},
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"text": "Hi"}]}],
        "triggers": [],
        "future_field": 1,
    }
    parsed = parse_start(session, INFO, event_id="s1")
    messages = {i.message.split(" ")[0]: i for i in parsed.infos}
    for param in ("session.store", "session.safety_identifier", "session.audio.output.voice",
                  "session.delegation.acknowledgement_delay_ms", "session.client", "session.future_field"):
        assert messages[param].code == "ignored_parameter" and messages[param].client_event_id == "s1"
    assert sum(i.code == "context_only" for i in parsed.infos) == 2
    assert parsed.config.instructions == "Be brief." and parsed.config.history[0].text == "Hi"
    assert parsed.config.acknowledgement_delay_ms == 400
    for info in parsed.infos:
        sdk_validate(info)


@pytest.mark.parametrize(
    "session,code,param",
    [
        ({}, "missing_required_parameter", "session.model"),
        ({"model": 5}, "missing_required_parameter", "session.model"),
        ({"model": "m", "delegation": {"type": "decisions", "decisions": {"model": "x", "questions": []}}},
         "unsupported_delegation", "session.delegation.type"),
        ({"model": "m", "delegation": {"type": "responses", "responses": {"model": "gpt-5"}}},
         "unsupported_delegation", "session.delegation.type"),
        ({"model": "m", "delegation": {"type": "robots"}}, "invalid_value", "session.delegation.type"),
        ({"model": "m", "triggers": [{"type": "decisions", "event_type": "session.input_transcript.delta",
                                      "decisions": {"questions": []}}]}, "unsupported_parameter", "session.triggers"),
        ({"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}}, "unsupported_audio_format",
         "session.audio.format.rate"),
        ({"model": "m", "audio": {"format": {"type": "audio/pcmu", "rate": 16000}}}, "unsupported_audio_format",
         "session.audio.format.rate"),
        ({"model": "m", "audio": {"format": {"type": "audio/opus", "rate": 48000}}}, "unsupported_audio_format",
         "session.audio.format.type"),
        ({"model": "m", "store": [1]}, "invalid_value", "session.store"),
        ({"model": "m", "input": [{"role": "robot", "content": []}]}, "invalid_value", None),
        ({"model": "m", "kame": {"delegaton": "turn"}}, "unknown_parameter", "session.kame.delegaton"),
        ({"model": "m", "kame": {"delegation": "always"}}, "invalid_value", "session.kame.delegation"),
        ({"model": "m", "kame": {"record": True}}, "recording_disabled", "session.kame.record"),
    ],
)
def test_refused_start_fields(session: dict[str, Any], code: str, param: str | None) -> None:
    with pytest.raises(LiveError) as info:
        parse_start(session, INFO, event_id="s9")
    assert info.value.code == code and info.value.client_event_id == "s9"
    if param is not None:
        assert info.value.param == param
    sdk_validate(info.value.event())


def test_pipecat_style_start_gets_no_error() -> None:
    # what OpenAILiveLLMService sends: model, instructions, client delegation, store, maybe history
    parsed = parse_start({"model": "gpt-live-1", "instructions": "You are helpful.", "delegation": {"type": "client"},
                          "store": False}, INFO)
    assert parsed.config.delegation_mode(INFO) == "turn"
    assert all(isinstance(i, Info) for i in parsed.infos)


def test_update_rules() -> None:
    start = parse_start({"model": "m"}, INFO).config
    new = parse_update({"kame": {"delegation": "speculative", "backchannel_words": 2}}, start, INFO).config
    assert new.delegation_mode(INFO) == "speculative" and new.backchannel_words(INFO) == 2
    same = parse_update({"delegation": {"type": "client", "acknowledgement_delay_ms": 0}, "triggers": []}, new, INFO)
    assert same.config.kame == new.kame and same.infos[0].code == "ignored_parameter"
    for session, code in (
        ({"model": "other"}, "immutable_parameter"),
        ({"audio": {"format": {"type": "audio/pcm", "rate": 16000}}}, "immutable_parameter"),
        ({"instructions": "x"}, "immutable_parameter"),
        ({"delegation": {"type": "responses"}}, "unsupported_delegation"),
        ({"triggers": [{"type": "decisions"}]}, "unsupported_parameter"),
        ({"kame": {"text_topk": 0}}, "invalid_value"),
    ):
        with pytest.raises(LiveError) as info:
            parse_update(session, new, INFO, event_id="u1")
        assert info.value.code == code and info.value.client_event_id == "u1"


# --------------------------------------------------------------------------- transcripts


def test_user_transcript_is_append_only_on_the_timeline() -> None:
    t = UserTranscript()
    t.speech_started(1, 0.4)
    deltas = [t.stable(1, "", 0.8), t.stable(1, "David has", 1.2), t.stable(1, "David has", 1.4),
              t.stable(1, "David has free", 1.8), t.final(1, "David has three sisters.", 2.4)]
    got = [d for d in deltas if d is not None]
    assert [d.delta for d in got] == ["David has", " free", " sisters."]  # no revision of "free"
    assert got[0].start_ms == 400 and got[-1].end_ms == 2400
    assert all(a.end_ms <= b.start_ms for a, b in itertools.pairwise(got))
    assert all(d.start_ms <= d.end_ms for d in got)
    t.speech_started(2, 3.0)
    nxt = t.final(2, "How many brothers?", 4.0)
    assert nxt is not None and nxt.delta == " How many brothers?" and nxt.start_ms == 3000
    assert t.text == "David has free sisters. How many brothers?"


def test_user_transcript_never_goes_back_in_time() -> None:
    t = UserTranscript()
    a = t.stable(1, "one two", 2.0)
    b = t.final(1, "one two three", 1.5)  # a recogniser whose final reports an earlier audio time
    assert a is not None and b is not None and b.start_ms >= a.end_ms and b.end_ms >= b.start_ms


def test_assistant_transcript_from_moshi_pieces() -> None:
    t = AssistantTranscript()
    got = [t.piece(p, s) for p, s in (("\u2581Hel", 10), ("lo", 11), ("\u2581there", 13), ("", 14))]
    deltas = [d for d in got if d is not None]
    assert [d.delta for d in deltas] == ["Hel", "lo", " there"]
    assert (deltas[0].start_ms, deltas[0].end_ms, deltas[2].start_ms) == (800, 880, 1040)
    assert t.text == "Hello there"


# --------------------------------------------------------------------------- delegations


def test_turn_mode_delegates_once_per_user_turn() -> None:
    p = DelegationPolicy("turn")
    assert p.stable(0.0, 1, "what is the") is None and p.stable(0.5, 1, "what is the capital of") is None
    d = p.final(1.0, 1, "what is the capital of France")
    assert d is not None and d.utterance == 1 and d.words == 6
    assert p.final(2.0, 2, "") is None  # nothing said, nothing to answer


def test_speculative_mode_follows_the_published_debounce() -> None:
    p = DelegationPolicy("speculative", min_new_words=2, max_restarts=2, window_s=2.0)
    assert p.stable(0.0, 1, "what") is None
    assert p.stable(0.1, 1, "what is") is not None
    assert p.stable(0.2, 1, "what is the") is None  # one new word only
    assert p.stable(0.3, 1, "what is the capital") is not None
    assert p.stable(0.4, 1, "what is the capital of France") is None  # rate limit: 2 in 2 s, pending
    assert p.poll(1.0) is None
    assert p.poll(2.05) is None  # the first start (t=0.1) is still inside the 2 s window
    later = p.poll(2.15)  # the window frees a slot: the pending delegation goes with the latest words
    assert later is not None and later.words == 6
    assert p.final(2.2, 1, "what is the capital of France") is None  # unchanged: no new delegation
    assert p.final(4.5, 2, "and of Spain") is not None


def test_appends_for_old_delegations(encode: Callable[[str], list[int]]) -> None:
    book = DelegationBook(backchannel_words=3)
    d1 = book.add("dlg_1", 1, 1000, 5)
    assert book.judge("dlg_1").standing == "current" and book.judge(None).standing == "general"
    book.heard(2, 1)  # "okay"
    book.add("dlg_2", 2, 2000, 1)
    assert book.judge("dlg_1").standing == "late"  # only a backchannel since: still admitted
    book.heard(3, 7)
    book.add("dlg_3", 3, 3000, 7)
    v = book.judge("dlg_1")
    assert v.standing == "superseded" and not v.speak and v.delegation == d1
    with pytest.raises(CommandRefused) as info:  # the wire sends it as a Live error with the event's id
        book.judge("dlg_nope", kind="thinking")
    assert info.value.code == "unknown_delegation" and info.value.param == "delegation_id"
    book.add("dlg_4", 3, 3500, 9)  # speculative: the same turn grew
    assert book.judge("dlg_3").standing == "superseded"


# --------------------------------------------------------------------------- the wire


def test_nothing_before_session_start(encode: Callable[[str], list[int]]) -> None:
    wire = LiveSession(INFO, encode)
    out = wire.message(json.dumps({"type": "session.input_audio.append", "audio": "AAA=", "event_id": "a1"}), 0.0)
    assert out.errors[0].code == "session_not_started" and out.events[0].client_event_id == "a1"
    bad = wire.message(json.dumps({"type": "session.start", "session": {"model": "m", "triggers": [{}]}}), 0.0)
    assert bad.errors and not wire.started  # a refused start leaves the socket waiting for a valid one
    ok = wire.message(json.dumps({"type": "session.start", "event_id": "s", "session": {"model": "m", "store": False}}), 0.0)
    assert ok.started and isinstance(ok.events[0], SessionStarted) and ok.events[0].client_event_id == "s"
    assert isinstance(ok.events[1], Info) and "store" in ok.events[1].message
    again = wire.message(json.dumps({"type": "session.start", "session": {"model": "m"}}), 1.0)
    assert again.errors[0].code == "session_already_started"


def test_wire_transcript_then_delegation_then_commentary(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    for step in range(10):
        wire.assistant_frame(np.zeros(1920, np.float32), None, step)
    assert wire.partial(1, 0.6, "what is", 1.0) == [InputTranscriptDelta("what is", 0, 600)]
    hypothesis = wire.partial(1, 0.9, "what is", 1.2, text="what is the cap", latency_s=0.41234)
    assert hypothesis == [KameEvent("kame.input_transcript.partial",
                                    {"text": "what is the cap", "stable": "what is", "latency_s": 0.412})]
    events = wire.final(1, 1.5, "what is the capital of France?", 2.0)
    assert [type(e) for e in events] == [InputTranscriptDelta, DelegationCreated]  # words first
    delegation = events[1]
    assert isinstance(delegation, DelegationCreated) and delegation.offset_ms == 1500
    content = "The capital of France is **Paris** — a city of 2 million people!"
    out = wire.message(json.dumps({"type": "session.commentary.append", "content": content,
                                   "delegation_id": delegation.delegation_id, "event_id": "c1"}), 2.5)
    assert not out.errors and len(out.answers) == 1
    answer = out.answers[0]
    expected = " ".join(spoken_words(content, OracleConfig().sanitize.options()))
    assert answer.text == expected and list(answer.ids) == encode(expected)
    ack = out.events[0]
    assert isinstance(ack, Appended) and ack.type == "session.commentary.appended" and ack.client_event_id == "c1"
    assert ack.start_ms == 1500 and ack.end_ms == 1500 + (len(answer.ids) + 1) * 80


def test_commentary_is_cut_like_an_oracle_answer(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    long = " ".join(f"word{i}" for i in range(80))
    out = wire.message(json.dumps({"type": "session.commentary.append", "content": long, "delegation_id": None}), 1.0)
    assert len(out.answers[0].text.split()) == OracleConfig().max_fed_words


def test_thinking_and_instructions_are_context_never_spoken(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    wire.final(1, 1.0, "book a table", 1.0)
    did = wire.answers.book.latest.id if wire.answers.book.latest else None
    for kind in ("thinking", "instructions"):
        out = wire.message(json.dumps({"type": f"session.{kind}.append", "content": "The user is vegetarian.",
                                       "delegation_id": did, "event_id": kind}), 2.0)
        assert not out.answers and not out.errors
        ack = out.events[0]
        assert isinstance(ack, Appended) and ack.kind == kind and ack.start_ms == ack.end_ms
    assert [c.kind for c in wire.context] == ["thinking", "instructions"]
    assert all(not c.spoken for c in wire.context)


def test_superseded_and_unknown_appends(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    wire.final(1, 1.0, "what time is it in Tokyo", 1.0)
    first = wire.answers.book.latest
    wire.final(2, 3.0, "and also tell me the weather in Paris tomorrow", 3.0)
    assert first is not None and wire.answers.book.latest is not None and wire.answers.book.latest.id != first.id
    out = wire.message(json.dumps({"type": "session.commentary.append", "content": "It is noon.",
                                   "delegation_id": first.id, "event_id": "old"}), 3.5)
    assert not out.answers and not out.errors  # not an error: Pipecat treats every error as fatal
    assert isinstance(out.events[0], Appended) and isinstance(out.events[1], Info)
    assert out.events[1].code == "delegation_superseded" and out.events[1].client_event_id == "old"
    unknown = wire.message(json.dumps({"type": "session.commentary.append", "content": "x",
                                       "delegation_id": "dlg_never", "event_id": "u"}), 4.0)
    assert unknown.errors[0].code == "unknown_delegation" and unknown.errors[0].client_event_id == "u" and not unknown.answers


def test_late_commentary_after_a_backchannel_is_spoken(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    wire.final(1, 1.0, "what is the tallest mountain", 1.0)
    first = wire.answers.book.latest
    wire.final(2, 2.0, "okay", 2.0)  # a backchannel while the application works
    assert first is not None
    out = wire.message(json.dumps({"type": "session.commentary.append", "content": "Mount Everest.",
                                   "delegation_id": first.id}), 2.5)
    assert len(out.answers) == 1 and out.answers[0].delegation_id == first.id


def test_speculative_delegations_supersede_each_other(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode, {"model": "m", "kame": {"delegation": "speculative"}})
    created = []
    for i, text in enumerate(["what is", "what is the capital", "what is the capital of France"]):
        created += [e for e in wire.partial(1, 0.5 * (i + 1), text, float(i)) if isinstance(e, DelegationCreated)]
    assert len(created) == 3
    old = wire.message(json.dumps({"type": "session.commentary.append", "content": "Well.",
                                   "delegation_id": created[0].delegation_id}), 3.0)
    assert not old.answers and old.events[1].code == "delegation_superseded"  # type: ignore[union-attr]
    new = wire.message(json.dumps({"type": "session.commentary.append", "content": "Paris.",
                                   "delegation_id": created[-1].delegation_id}), 3.0)
    assert len(new.answers) == 1


def test_append_limit_is_500_tokens(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    ok = "x" * 2000  # 500 tokens, estimated as clients estimate them (4 characters a token)
    assert not wire.message(json.dumps({"type": "session.thinking.append", "content": ok, "delegation_id": None}),
                            0.5).errors
    text = " ".join(["zebra"] * 350)  # 2099 characters: 525 tokens
    out = wire.message(json.dumps({"type": "session.thinking.append", "content": text, "delegation_id": None,
                                   "event_id": "big"}), 1.0)
    assert out.errors[0].code == "content_too_long" and out.events[0].client_event_id == "big"
    assert [c.text for c in wire.context] == [ok]  # the refused one was not kept


def test_mute_feeds_silence_and_is_acknowledged(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    audio = base64.b64encode(to_int16(sine(300, 24000, 0.16))).decode()
    loud = wire.message(json.dumps({"type": "session.input_audio.append", "audio": audio}), 1.0).frames
    mute = wire.message(json.dumps({"type": "session.input_audio.mute", "event_id": "m"}), 1.1)
    assert mute.events == [InputAudioMuted("m")] and wire.muted
    quiet = wire.message(json.dumps({"type": "session.input_audio.append", "audio": audio}), 1.2).frames
    assert len(quiet) == len(loud) == 2 and all(float(np.abs(f).max()) == 0 for f in quiet)
    assert float(np.abs(loud[0]).max()) > 0.1
    unmute = wire.message(json.dumps({"type": "session.input_audio.unmute"}), 1.3)
    assert unmute.events == [InputAudioUnmuted()] and not wire.muted


def test_assistant_frames_in_the_session_format(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode, {"model": "m", "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}})
    total = 0
    texts = []
    for step in range(25):
        events = wire.assistant_frame(sine(440, 24000, 0.08, 0.3), "\u2581hi" if step == 3 else None, step)
        audio = [e for e in events if isinstance(e, OutputAudioDelta)]
        assert len(audio) == 1
        total += len(base64.b64decode(audio[0].delta))
        texts += [e for e in events if isinstance(e, OutputTranscriptDelta)]
    assert abs(total - 25 * 640) < 200  # 8 kHz, one byte a sample
    assert texts == [OutputTranscriptDelta("hi", 240, 320)]
    dropped = wire.assistant_frame(np.zeros(1920, np.float32), None, 25, send_audio=False)
    assert dropped == [] and wire.timeline_ms == 26 * 80


def test_update_changes_delegation_mode(encode: Callable[[str], list[int]]) -> None:
    wire = started_wire(encode)
    out = wire.message(json.dumps({"type": "session.update", "event_id": "u",
                                   "session": {"kame": {"delegation": "speculative"}}}), 1.0)
    assert isinstance(out.events[0], SessionUpdated) and out.settings is not None
    assert out.events[0].session["kame"]["delegation"] == "speculative" and wire.answers.policy.mode == "speculative"
    refused = wire.message(json.dumps({"type": "session.update", "session": {"delegation": {"type": "decisions"}}}), 1.0)
    assert refused.errors and wire.answers.policy.mode == "speculative"


def test_usage_every_interval_and_close_reasons(encode: Callable[[str], list[int]]) -> None:
    clock = UsageClock(started=100.0, interval_s=5.0)
    got = [clock.due(100.0 + t) for t in (1.0, 4.9, 5.0, 6.0, 10.4, 31.0)]
    assert [u.usage_seconds if u else None for u in got] == [None, None, 5.0, None, 10.0, 31.0]
    assert close_reason("close_requested") == "close_requested" and close_reason("max_duration") == "expired"
    for label in ("idle", "draining", "engine_error", "protocol", "audio_flood", "internal"):
        assert close_reason(label) == "connection_lost"
    wire = started_wire(encode, now=50.0)
    assert wire.tick(54.0) == [] and wire.tick(55.5) == [UsageUpdated(5.0)]
    closed = wire.ending("close_requested", "", 62.7, client_event_id="bye")
    assert len(closed) == 1 and isinstance(closed[0], SessionClosed)
    assert closed[0].reason == "close_requested" and closed[0].usage_seconds == 12.0
    assert sdk_validate(closed[0]).client_event_id == "bye"
    idle = wire.ending("idle", "idle timeout: no audio for 30 s", 80.0)
    assert isinstance(idle[0], Info) and idle[0].code == "kame.idle" and "idle" in idle[0].message
    assert isinstance(idle[1], SessionClosed) and idle[1].reason == "connection_lost"
    assert wire.ending("max_duration", "", 650.0)[0].reason == "expired"  # type: ignore[union-attr]
    assert wire.ending("client_closed", "", 70.0) == []


def test_a_long_calls_delegations_stay_bounded() -> None:
    """An hour of turns (issue 59): the book keeps the last MAX_REMEMBERED delegations, answers the next
    MAX_FORGOTTEN older ones "superseded", and forgets the rest (an append for one is then unknown)."""
    from kame.session.delegation_rules import MAX_FORGOTTEN, MAX_REMEMBERED

    book = DelegationBook(backchannel_words=3)
    n = MAX_REMEMBERED + MAX_FORGOTTEN + 50
    for i in range(n):
        book.add(f"dlg_{i}", utterance=i, offset_ms=0, words=3)
    assert len(book._by_id) == MAX_REMEMBERED and len(book._forgotten) == MAX_FORGOTTEN
    assert book.judge(f"dlg_{n - 1}").standing == "current"
    assert book.judge(f"dlg_{n - MAX_REMEMBERED - 1}").standing == "superseded"
    with pytest.raises(CommandRefused):
        book.judge("dlg_0")
