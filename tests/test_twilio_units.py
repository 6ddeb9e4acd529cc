"""Twilio Media Streams without a server: messages, signatures, TwiML, a call's parameters, and the wire.

Signatures are checked against Twilio's documented example (auth token ``12345``) and against the
``twilio`` package's own ``RequestValidator``; the wire is fed messages as Twilio writes them and
pipeline events as the session hands them.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():  # stdlib audioop is deprecated on 3.11/3.12 (audioop-lts from 3.13)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop
import base64
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator

from kame.server.access.params import ParamError
from kame.server.config import load_app_config
from kame.server.runtime.wire import AudioIn, EndIn, Fault, Ignored, Outgoing
from kame.server.wires.twilio import protocol, signature, twiml
from kame.server.wires.twilio.params import call_settings
from kame.server.wires.twilio.wire import TwilioWire
from kame.session import commands as sc
from kame.session import events as pe
from kame.session.settings import SessionSettings

DOC_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
DOC_PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+14158675309", "Digits": "1234", "From": "+14158675309",
              "To": "+18005551212"}
SID = "MZ18ad3ab5a668481ce02b83e7395059f0"


def start_message(custom: dict[str, str] | None = None, encoding: str = "audio/x-mulaw") -> str:
    return json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": SID, "start": {
        "accountSid": "AC1", "streamSid": SID, "callSid": "CA1", "tracks": ["inbound"],
        "customParameters": custom or {}, "mediaFormat": {"encoding": encoding, "sampleRate": 8000, "channels": 1}}})


def media_message(payload: bytes) -> dict[str, str]:
    return {"type": "websocket.receive", "text": json.dumps(
        {"event": "media", "streamSid": SID, "media": {"track": "inbound", "chunk": "1", "timestamp": "0",
                                                       "payload": base64.b64encode(payload).decode()}})}


# ---------------------------------------------------------------------------------------------- signatures
def test_the_documented_example_signature() -> None:
    assert signature.compute("12345", DOC_URL, DOC_PARAMS.items()) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert signature.valid("12345", "RSOYDt4T1cUTdK1PDd93/VVr8B8=", DOC_URL, DOC_PARAMS.items())
    assert not signature.valid("12345", "RSOYDt4T1cUTdK1PDd93/VVr8B8=", DOC_URL, {**DOC_PARAMS, "Digits": "9"}.items())
    assert not signature.valid("54321", "RSOYDt4T1cUTdK1PDd93/VVr8B8=", DOC_URL, DOC_PARAMS.items())
    assert not signature.valid("12345", None, DOC_URL, DOC_PARAMS.items())
    assert not signature.valid("12345", "", DOC_URL, DOC_PARAMS.items())


def test_repeated_parameters_and_default_ports_as_twilio_libraries_take_them() -> None:
    repeated = [("Sid", "CA123"), ("SidAccount", "AC123"), ("Digits", "5678"), ("Digits", "1234"), ("Digits", "1234")]
    assert signature.compute("12345", DOC_URL, repeated) == "IK+Dwps556ElfBT0I3Rgjkr1wJU="
    with_port = "https://mycompany.com:443/myapp.php?foo=1&bar=2"
    sig = signature.compute("12345", DOC_URL, DOC_PARAMS.items())
    assert signature.valid("12345", sig, with_port, DOC_PARAMS.items())
    assert signature.valid("12345", signature.compute("12345", with_port, DOC_PARAMS.items()), DOC_URL, DOC_PARAMS.items())
    assert not signature.valid("12345", sig, "https://mycompany.com:8443/myapp.php?foo=1&bar=2", DOC_PARAMS.items())


@settings(max_examples=60, deadline=None)
@given(token=st.text(min_size=1, max_size=40).filter(lambda t: "\x00" not in t),
       params=st.dictionaries(st.text("abcXYZ_", min_size=1, max_size=8), st.text(max_size=20), max_size=6),
       path=st.text("abcdef/-_", max_size=20))
def test_signatures_agree_with_twilios_request_validator(token: str, params: dict[str, str], path: str) -> None:
    url = f"wss://voice.example.com/{path}"
    theirs = RequestValidator(token).compute_signature(url, params)
    assert signature.compute(token, url, params.items()) == theirs
    assert RequestValidator(token).validate(url, params, signature.compute(token, url, params.items()))


def test_public_url_from_config_or_forwarded_headers() -> None:
    assert signature.public_url("https://voice.example.com", {}, "http", "/twilio/voice", "a=1") == \
        "https://voice.example.com/twilio/voice?a=1"
    assert signature.public_url("https://voice.example.com", {}, "ws", "/twilio/media") == "wss://voice.example.com/twilio/media"
    assert signature.public_url("http://10.0.0.5:8998", {}, "ws", "/twilio/media") == "ws://10.0.0.5:8998/twilio/media"
    fwd = {"x-forwarded-proto": "https, http", "x-forwarded-host": "voice.example.com", "host": "10.0.0.5:8998"}
    assert signature.public_url(None, fwd, "ws", "/twilio/media") == "wss://voice.example.com/twilio/media"
    assert signature.public_url(None, fwd, "http", "/twilio/voice") == "https://voice.example.com/twilio/voice"
    assert signature.public_url(None, {"host": "127.0.0.1:9"}, "http", "/twilio/voice") == "http://127.0.0.1:9/twilio/voice"


def test_the_auth_token_comes_from_the_environment_and_stays_secret() -> None:
    cfg = load_app_config(environ={"KAME_TWILIO__AUTH_TOKEN": "tok-3f9a", "KAME_TWILIO__PUBLIC_URL": "https://v.example.com/"})
    assert cfg.twilio.auth_token is not None and cfg.twilio.auth_token.get_secret_value() == "tok-3f9a"
    assert cfg.twilio.public_url == "https://v.example.com"
    assert "tok-3f9a" not in repr(cfg) and "tok-3f9a" not in str(cfg.model_dump())
    assert load_app_config(environ={"KAME_TWILIO__AUTH_TOKEN": ""}).twilio.auth_token is None  # an empty Secret key: off
    with pytest.raises(ValueError, match="public_url"):
        load_app_config(environ={"KAME_TWILIO__PUBLIC_URL": "voice.example.com"})


# ---------------------------------------------------------------------------------------------- TwiML
def test_twiml_connects_the_stream_with_escaped_parameters() -> None:
    doc = ET.fromstring(twiml.connect_stream("wss://h.example/twilio/media", {"instructions": 'Say "hi" & <bye>', "From": "+1"}))
    stream = doc.find("./Connect/Stream")
    assert stream is not None and stream.attrib["url"] == "wss://h.example/twilio/media"
    assert {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")} == \
        {"instructions": 'Say "hi" & <bye>', "From": "+1"}
    long = ET.fromstring(twiml.connect_stream("wss://h/x", {"instructions": "x" * 900})).find("./Connect/Stream/Parameter")
    assert long is not None and len("instructions") + len(long.attrib["value"]) == twiml.MAX_PARAMETER_CHARS
    busy = ET.fromstring(twiml.reject_busy())
    assert [(e.tag, e.attrib) for e in busy] == [("Reject", {"reason": "busy"})]


# ---------------------------------------------------------------------------------------------- messages
def test_inbound_messages_as_twilio_writes_them() -> None:
    assert protocol.decode('{"event": "connected", "protocol": "Call", "version": "1.0.0"}') == protocol.Connected("Call")
    start = protocol.decode(start_message({"voice": "NATF2"}))
    assert isinstance(start, protocol.Start)
    assert (start.stream_sid, start.call_sid, start.custom_parameters, start.encoding) == (SID, "CA1", {"voice": "NATF2"}, "audio/pcmu")
    m = protocol.decode(media_message(b"\xff" * 160)["text"])
    assert m == protocol.Media(b"\xff" * 160, "inbound")
    assert protocol.decode('{"event": "dtmf", "streamSid": "MZ", "dtmf": {"track": "inbound_track", "digit": "#"}}') == protocol.Dtmf("#")
    assert protocol.decode('{"event": "mark", "streamSid": "MZ", "mark": {"name": "resp_1"}}') == protocol.Mark("resp_1")
    assert protocol.decode('{"event": "stop", "streamSid": "MZ", "stop": {"callSid": "CA1"}}') == protocol.Stop()
    telnyx = protocol.decode(json.dumps({"event": "start", "stream_id": "s1", "start": {
        "call_control_id": "v3:x", "media_format": {"encoding": "PCMA", "sample_rate": 8000, "channels": 1},
        "custom_parameters": {"backend": "a"}}}))
    assert isinstance(telnyx, protocol.Start) and (telnyx.stream_sid, telnyx.encoding) == ("s1", "audio/pcma")


@pytest.mark.parametrize("text,why", [
    ("{nope", "not JSON"), ("[1]", "must be an object"), ('{"event": "hello"}', "unknown event"),
    ('{"event": "media", "media": {"payload": "***"}}', "not base64"), ('{"event": "media", "media": {}}', "without a payload"),
    ('{"event": "dtmf", "dtmf": {"digit": "55"}}', "dtmf.digit"), ('{"event": "start", "start": {}}', "streamSid"),
    (start_message(encoding="audio/l16"), "encoding"), ('{"event": "mark", "mark": {}}', "without a name"),
])
def test_what_is_not_twilios_is_refused(text: str, why: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=why):
        protocol.decode(text)
    with pytest.raises(protocol.ProtocolError, match="binary"):
        protocol.decode(b"\x00")


def test_outbound_messages() -> None:
    assert json.loads(protocol.media(SID, b"\x01\x02")) == {"event": "media", "streamSid": SID, "media": {"payload": "AQI="}}
    assert json.loads(protocol.mark(SID, "r1")) == {"event": "mark", "streamSid": SID, "mark": {"name": "r1"}}
    assert json.loads(protocol.clear(SID)) == {"event": "clear", "streamSid": SID}


# ---------------------------------------------------------------------------------------------- parameters
class Voices:
    names = ("NATF2", "NATM1")

    def choose(self, requested: str | None) -> tuple[str | None, str | None]:
        return (requested, None) if requested in self.names else ("NATF2", f"unknown voice {requested!r}")


def test_custom_parameters_choose_like_query_parameters() -> None:
    got = call_settings({"instructions": "Be brief.", "backend": "alpha", "voice": "NATM1", "caller": "+1"},
                        SessionSettings(record=True), backends=["alpha", "beta"], voices=Voices())
    s = got.settings
    assert (s.instructions, s.backend, s.voice, s.record, s.interrupt_response) == ("Be brief.", "alpha", "NATM1", True, True)
    assert got.ignored == ("caller",) and got.notices == ()
    fallback = call_settings({"voice": "nobody"}, SessionSettings(), backends=None, voices=Voices())
    assert fallback.settings.voice == "NATF2" and "unknown voice" in fallback.notices[0]
    assert call_settings({"interrupt_response": "false"}, SessionSettings(), backends=None).settings.interrupt_response is False
    with pytest.raises(ParamError, match="backend"):
        call_settings({"backend": "gamma"}, SessionSettings(), backends=["alpha"])
    with pytest.raises(ParamError, match="interrupt_response"):
        call_settings({"interrupt_response": "maybe"}, SessionSettings(), backends=None)
    with pytest.raises(ParamError, match="instructions"):
        call_settings({"instructions": "x" * 20_001}, SessionSettings(), backends=None)


# ---------------------------------------------------------------------------------------------- the wire
def new_wire(**kw: object) -> tuple[TwilioWire, list[str]]:
    digits: list[str] = []
    start = protocol.decode(start_message())
    assert isinstance(start, protocol.Start)
    settings = kw.pop("settings", SessionSettings(interrupt_response=True))
    return TwilioWire(start, settings, on_dtmf=digits.append), digits  # type: ignore[arg-type]


def loud(seconds: float = 0.08) -> np.ndarray:
    t = np.arange(int(24000 * seconds)) / 24000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def frame(step: int, pcm: np.ndarray) -> pe.AssistantFrame:
    return pe.AssistantFrame(step=step, pcm=pcm, text_id=None, piece=None, oracle_id=-1)


def sent(out: object) -> list[dict[str, object]]:
    return [json.loads(o.data) for o in out if isinstance(o, Outgoing)]  # type: ignore[attr-defined]


def test_mu_law_in_becomes_80_ms_engine_frames() -> None:
    wire, _ = new_wire()
    tone = loud(0.2)[::3]  # 8 kHz
    ulaw = audioop.lin2ulaw((tone * 32767).astype("<i2").tobytes(), 2)
    frames: list[np.ndarray] = []
    for i in range(0, len(ulaw), 160):  # 20 ms messages
        (cmd,) = wire.decode(media_message(ulaw[i:i + 160]), 0.0)
        assert isinstance(cmd, AudioIn)
        frames += cmd.frames
    assert [f.shape for f in frames] == [(1920,), (1920,)]  # 160 ms of the 200 ms (the rest waits)
    assert 0.1 < float(np.sqrt(np.mean(frames[1] ** 2))) < 0.3


def test_output_frames_go_out_as_mu_law_media_and_a_mark_ends_each_response() -> None:
    wire, _ = new_wire()
    out = [m for i in range(5) for m in sent(wire.frame(frame(i, loud()), i, True))]
    assert [m["event"] for m in out] == ["media"] * 5
    audio = base64.b64decode(out[-1]["media"]["payload"])  # type: ignore[index]
    total = sum(len(base64.b64decode(m["media"]["payload"])) for m in out)  # type: ignore[index]
    assert 5 * 640 - 240 <= total <= 5 * 640  # 80 ms at 8 kHz a frame, one byte a sample, less the resampler's delay
    pcm = np.frombuffer(audioop.ulaw2lin(audio, 2), "<i2") / 32768
    assert 0.15 < float(np.sqrt(np.mean(pcm ** 2))) < 0.3
    ended = sent(wire.event(pe.SpeechStopped(utterance=0, audio_s=1.0)))
    wire.frame(frame(5, loud()), 5, True)  # Moshi goes on: a new response
    assert wire.event(pe.UserFinal(utterance=0, audio_s=1.2, text="hi")) == []  # the same turn's final ends nothing
    assert [m["event"] for m in ended] == ["mark"] and wire.marks_pending == [ended[0]["mark"]["name"]]  # type: ignore[index]
    assert wire.decode({"type": "websocket.receive", "text": protocol.mark(SID, wire.marks_pending[0])}, 0.0)[0] == \
        Ignored(f"mark {ended[0]['mark']['name']} played")  # type: ignore[index]
    assert wire.marks_pending == [] and wire.marks_played == 1


def test_barge_in_clears_and_withholds_until_the_callers_turn_ends() -> None:
    wire, _ = new_wire()
    for i in range(3):
        wire.frame(frame(i, loud()), i, True)
    cleared = sent(wire.event(pe.AnswerCancelled(reason="turn_detected")))
    assert [m["event"] for m in cleared] == ["clear", "mark"] and wire.clears == 1
    assert cleared[0] == {"event": "clear", "streamSid": SID} and wire.marks_pending == [cleared[1]["mark"]["name"]]  # type: ignore[index]
    assert sent(wire.frame(frame(3, loud()), 3, True)) == []  # withheld: never played
    wire.event(pe.SpeechStopped(utterance=0, audio_s=2.0))
    after = wire.frame(frame(4, loud()), 4, True)
    assert [m["event"] for m in sent(after)] == ["media"]
    assert any(isinstance(c, sc.ForgetSpeech) for c in after)  # what was withheld leaves the back-end's history
    assert wire.event(pe.AnswerCancelled(reason="client_cancelled")) == []


def test_no_clear_when_nothing_plays() -> None:
    wire, _ = new_wire()
    wire.frame(frame(0, np.zeros(1920, np.float32)), 0, True)  # silence: no response open
    assert wire.event(pe.AnswerCancelled(reason="turn_detected")) == []


def test_dtmf_stop_and_bad_messages() -> None:
    wire, digits = new_wire()
    (cmd,) = wire.decode({"type": "websocket.receive", "text": '{"event": "dtmf", "dtmf": {"digit": "7"}}'}, 0.0)
    assert isinstance(cmd, sc.AddContext) and cmd.item.role == "user" and "pressed 7" in cmd.item.text
    assert digits == ["7"]
    (bad,) = wire.decode({"type": "websocket.receive", "text": "{oops"}, 0.0)
    assert isinstance(bad, Fault) and bad.code == "invalid_message" and bad.end is None
    (again,) = wire.decode({"type": "websocket.receive", "text": start_message()}, 0.0)
    assert isinstance(again, Ignored)
    (stop,) = wire.decode({"type": "websocket.receive", "text": '{"event": "stop"}'}, 0.0)
    assert isinstance(stop, EndIn) and stop.end.code == 1000
