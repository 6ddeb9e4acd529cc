"""Pure pieces of the server: protocol codec, query parameters, auth helpers, re-chunking, metrics."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from pydantic import SecretStr
from starlette import status

from kame.server.access.auth import origin_ok, redact, token_ok, websocket_credentials
from kame.server.access.params import ParamError, parse_session_params
from kame.server.runtime.end import close_reason
from kame.server.telemetry.logs import KeyValueFormatter, RedactFilter
from kame.server.telemetry.metrics import ServerMetrics
from kame.server.wires.codec import AudioDecodeError, FrameChunker, OpusIn, OpusOut
from kame.server.wires.moshi import protocol
from kame.session.settings import SessionSettings
from tests.support.kyutai_protocol import assert_kyutai_server_info

# --------------------------------------------------------------------------- protocol


def test_server_messages_are_byte_compatible() -> None:
    assert protocol.encode_handshake() == b"\x00"
    assert protocol.encode_audio(b"OggS...") == b"\x01OggS..."
    assert protocol.encode_text(" hello") == b"\x02 hello"
    assert protocol.encode_error("bad") == b"\x05bad"
    assert protocol.encode_ping() == b"\x06"
    meta = protocol.encode_metadata({"a": 1})
    assert meta[0] == 0x04 and json.loads(meta[1:]) == {"a": 1}


def test_text_message_maps_word_start_and_skips_special_ids() -> None:
    assert protocol.text_message(57, "\u2581Hello") == b"\x02 Hello"
    assert protocol.text_message(58, "lo") == b"\x02lo"
    assert protocol.text_message(0, "<unk>") is None
    assert protocol.text_message(3, "<pad>") is None
    assert protocol.text_message(None, "x") is None
    assert protocol.text_message(-2, "x") is None
    assert protocol.text_message(12, "\u2581caf\u00e9").decode("utf-8") == "\x02 caf\u00e9"


def test_client_audio_control_ping_metadata_accepted() -> None:
    assert protocol.decode_client_message(b"\x01OggS") == protocol.ClientAudio(b"OggS")
    assert protocol.decode_client_message(b"\x01") == protocol.ClientAudio(b"")
    assert protocol.decode_client_message(b"\x06") == protocol.ClientPing()
    assert protocol.decode_client_message(b"\x03\x01") == protocol.ClientControl("endTurn")
    assert protocol.decode_client_message(b'\x04{"x": 2}') == protocol.ClientMetadata({"x": 2})
    assert isinstance(protocol.decode_client_message(b"\x00\x00\x00"), protocol.ClientHandshake)


@pytest.mark.parametrize(
    ("message", "code", "fragment"),
    [
        ("hello", status.WS_1003_UNSUPPORTED_DATA, "text websocket frames"),
        (b"", status.WS_1002_PROTOCOL_ERROR, "empty message"),
        (None, status.WS_1002_PROTOCOL_ERROR, "empty websocket message"),
        (b"\x42abc", status.WS_1002_PROTOCOL_ERROR, "unknown message kind 0x42"),
        (b"\x08", status.WS_1002_PROTOCOL_ERROR, "unknown message kind 0x08"),
        (b"\x02hi", status.WS_1002_PROTOCOL_ERROR, "sent by the server only"),
        (b"\x05oops", status.WS_1002_PROTOCOL_ERROR, "sent by the server only"),
        (b"\x03", status.WS_1002_PROTOCOL_ERROR, "control message"),
        (b"\x03\x09", status.WS_1002_PROTOCOL_ERROR, "control message"),
        (b"\x04{not json", status.WS_1002_PROTOCOL_ERROR, "not UTF-8 JSON"),
    ],
)
def test_bad_client_messages_raise_clear_errors(message: bytes | str | None, code: int, fragment: str) -> None:
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.decode_client_message(message)
    assert info.value.close_code == code
    assert fragment in str(info.value)


def test_close_reason_fits_a_close_frame() -> None:
    long = "\u00e9" * 200
    out = close_reason(long)
    assert len(out.encode("utf-8")) <= 123
    assert close_reason("short") == "short"


# --------------------------------------------------------------------------- query parameters


def test_session_params_parse_and_validate() -> None:
    p = parse_session_params(
        {"text_temperature": "0.6", "text_topk": "25.0", "audio_topk": "250", "backend": "a", "oracle_policy": "reset"},
        backends=["a", "b"],
        oracle_policies=["reset", "freeze_when_speaking"],
    )
    s = p.settings
    assert (s.text_temperature, s.text_topk, s.backend, s.oracle_policy) == (0.6, 25, "a", "reset")
    assert p.ignored == ("audio_topk",)
    assert parse_session_params({}).settings == SessionSettings()


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ({"text_temperature": "hot"}, "text_temperature: not a number"),
        ({"text_temperature": "-1"}, "text_temperature: must be between"),
        ({"text_temperature": "nan"}, "text_temperature"),
        ({"text_topk": "2.5"}, "text_topk: must be an integer"),
        ({"text_topk": "0"}, "text_topk"),
        ({"backend": "nope"}, "unknown back-end 'nope' (available: a)"),
        ({"oracle_policy": "sometimes"}, "oracle_policy"),
    ],
)
def test_session_params_errors(query: dict[str, str], fragment: str) -> None:
    with pytest.raises(ParamError, match=None) as info:
        parse_session_params(query, backends=["a"], oracle_policies=["reset"])
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- auth


def test_websocket_credentials_from_header_query_and_subprotocol() -> None:
    assert websocket_credentials({"authorization": "Bearer abc"}, {}, []).token == "abc"
    assert websocket_credentials({}, {"token": "q"}, []).token == "q"
    c = websocket_credentials({}, {}, ["openai-insecure-api-key.sub", "realtime"])
    assert (c.token, c.subprotocol) == ("sub", "realtime")
    c = websocket_credentials({}, {}, ["openai-insecure-api-key.sub"])
    assert (c.token, c.subprotocol) == ("sub", None)  # the key protocol itself is never echoed
    assert websocket_credentials({"authorization": "Basic abc"}, {}, []).token is None


def test_token_check_and_origin_allow_list() -> None:
    secret = SecretStr("s3cret")
    assert token_ok(None, None)
    assert token_ok(secret, "s3cret")
    assert not token_ok(secret, "s3cre")
    assert not token_ok(secret, None)
    assert origin_ok("https://evil.example", [])
    assert origin_ok("https://App.example/", ["https://app.example"])
    assert not origin_ok("https://evil.example", ["https://app.example"])
    assert origin_ok(None, ["https://app.example"])  # non-browser clients send no Origin
    assert origin_ok("https://any.example", ["*"])


def test_redaction_of_tokens_in_log_lines() -> None:
    line = '127.0.0.1 - "WebSocket /api/chat?text_topk=5&token=abc123&x=1" openai-insecure-api-key.abc123 Bearer abc123'
    out = redact(line)
    assert "abc123" not in out and "text_topk=5" in out and "x=1" in out
    assert redact("key is zzz", ["zzz"]) == "key is ***"
    record = logging.LogRecord("uvicorn.error", logging.INFO, "f", 1, '%s - "WebSocket %s"', ("peer", "/api/chat?token=abc"), None)
    RedactFilter(["abc"]).filter(record)
    assert "abc" not in KeyValueFormatter().format(record)


# --------------------------------------------------------------------------- audio coding


def test_frame_chunker_rechunks_20ms_pieces() -> None:
    ch = FrameChunker(1920)
    pcm = np.arange(480 * 9, dtype=np.float32)
    frames = [f for i in range(0, pcm.size, 480) for f in ch.push(pcm[i : i + 480])]
    assert len(frames) == 2 and ch.pending == 480 * 9 - 3840
    np.testing.assert_array_equal(np.concatenate(frames), pcm[:3840])


def test_opus_round_trip_in_20ms_pages_and_corrupt_stream() -> None:
    import sphn

    writer = sphn.OpusStreamWriter(24000)
    t = np.arange(24000) / 24000
    pcm = (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    dec = OpusIn()
    frames = []
    for i in range(0, pcm.size, 480):
        frames += dec.decode(bytes(writer.append_pcm(pcm[i : i + 480])))
    assert frames and all(f.shape == (1920,) for f in frames)
    assert len(frames) >= 10
    with pytest.raises(AudioDecodeError, match="corrupt Ogg/Opus"):
        OpusIn().decode(b"definitely not an ogg page" * 4)
    assert len(OpusOut().encode(pcm[:1920])) > 0


# --------------------------------------------------------------------------- metrics


def test_metrics_are_fed_from_pipeline_events_and_ticks() -> None:
    from kame.frontend.engine_thread import TickStats
    from kame.session import events as pe

    m = ServerMetrics()
    m.on_event(pe.LlmFirstToken(request_id=1, backend="scripted", ttft_s=0.3))
    m.on_event(pe.LlmError(request_id=1, backend="scripted", error="http_status", message="boom"))
    m.on_event(pe.OracleReset(request_id=1, tokens=3, text="Paris"))
    m.on_event(pe.OracleText(request_id=1, tokens=7, text="Paris is"))
    m.on_event(pe.UserPartial(utterance=0, audio_s=1.0, text="secret words", latency_s=0.4))
    m.on_event(pe.AssistantFrame(step=0, pcm=np.zeros(1920, np.float32), text_id=5, piece="x", oracle_id=3))
    m.on_tick(TickStats(duration_s=0.02, slots=3, waited_s=0.0))
    text = m.render().decode()
    assert 'kame_llm_ttft_seconds_count{backend="scripted"} 1.0' in text
    assert 'kame_llm_errors_total{backend="scripted"} 1.0' in text
    assert "kame_oracle_resets_total 1.0" in text
    assert "kame_oracle_tokens_total 7.0" in text
    assert "kame_asr_partial_latency_seconds_count 1.0" in text
    assert "kame_step_seconds_count 1.0" in text
    assert "secret words" not in text
    # one registry per instance: a second app starts from zero
    assert "kame_oracle_tokens_total 0.0" in ServerMetrics().render().decode()


# --------------------------------------------------------------------------- server info (0x04) and notices (0x05)

def browser_json(payload: bytes) -> object:
    """``JSON.parse`` as browsers do it: ``NaN``/``Infinity``/``-Infinity`` are syntax errors."""

    def refuse(token: str) -> object:
        raise ValueError(f"{token} is not JSON: a browser's JSON.parse throws on it")

    return json.loads(payload.decode("utf-8"), parse_constant=refuse)


def test_server_info_has_the_shape_kyutais_client_validates() -> None:
    info = protocol.ServerInfo(
        text_temperature=0.6, text_topk=20, audio_temperature=0.8, audio_topk=250,
        lm_model_file="SakanaAI/kame", instance_name="kame", version="kame 0.1.0",
    )
    message = protocol.encode_server_info(info)
    assert message[0] == 0x04
    data = browser_json(message[1:])
    assert_kyutai_server_info(data)
    assert (data["text_temperature"], data["text_topk"], data["audio_temperature"], data["audio_topk"]) == (0.6, 20, 0.8, 250)
    assert (data["pad_mult"], data["repetition_penalty_context"], data["repetition_penalty"]) == (0, 0, 1)
    assert data["build_info"]["git_describe"] == "kame 0.1.0"


def test_server_info_is_json_a_browser_parses_even_for_infinite_sampling() -> None:
    # Found by running Kyutai's web client against kame: with an infinite audio temperature
    # the 0x04 carried `Infinity`, and the client's JSON.parse threw in each of its message
    # listeners (its server-info panel never showed).
    info = protocol.ServerInfo(
        text_temperature=float("inf"), text_topk=25, audio_temperature=float("nan"), audio_topk=250,
        lm_model_file="tiny:0", instance_name="kame", version="kame 0.1.0",
    )
    data = browser_json(protocol.encode_server_info(info)[1:])
    assert_kyutai_server_info(data)
    assert isinstance(data, dict) and (data["text_temperature"], data["audio_temperature"]) == (0.0, 0.0)
    with pytest.raises(ValueError):  # no other 0x04 can carry a non-JSON number either
        protocol.encode_metadata({"x": float("inf")})


def test_sampling_temperatures_must_be_finite() -> None:
    from pydantic import ValidationError

    from kame.frontend.config import SamplingConfig

    for field_name in ("temp", "temp_text"):
        for bad in (float("inf"), float("nan")):
            with pytest.raises(ValidationError, match="finite"):
                SamplingConfig(**{field_name: bad})
    assert SamplingConfig(temp=0.8, temp_text=0.0).temp == 0.8


def test_model_file_label_never_gives_an_absolute_path() -> None:
    label = protocol.model_file_label
    assert label("SakanaAI/kame", "model.safetensors", local=False) == "SakanaAI/kame"
    assert label("tiny:3", "model.safetensors", local=True) == "tiny:3"
    assert label("/srv/models/kame-7b/", "model.safetensors", local=True) == "kame-7b/model.safetensors"
    assert label("models/kame", "model.safetensors", local=True) == "kame/model.safetensors"
    assert label(".", "w.safetensors", local=True) == "w.safetensors"


def test_end_notices_are_text() -> None:
    notice = protocol.expiring_notice(29.96, 300.0)
    assert notice == "this session ends in 30 s: the maximum session duration is 300 s"
    assert protocol.encode_notice(notice) == b"\x05" + notice.encode()
    assert protocol.close_notice("idle timeout: no audio for 30 s") == "idle timeout: no audio for 30 s"
    assert protocol.close_notice("corrupt audio", "Opus stream: bad page") == "Opus stream: bad page"
    assert protocol.draining_notice(119.6) == "the server is shutting down: this session ends in 120 s"
