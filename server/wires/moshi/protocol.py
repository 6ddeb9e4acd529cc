"""Moshi's websocket protocol for ``/api/chat``: message kinds, encoding, validation. No I/O.

Every message is binary; its first byte is the kind. What Kyutai's web
client and ``moshi``'s Python client exchange:

- ``0x00`` handshake, server -> client, once the session is ready (a single
  byte, exactly what moshi's Python server sends);
- ``0x01`` audio, both ways: Ogg/Opus pages, 24 kHz mono;
- ``0x02`` text, server -> client: one text piece of the model, ``▁`` shown
  as a space (the special ids 0 and 3 are never sent);
- ``0x03`` control (one action byte), ``0x04`` metadata (JSON), ``0x05``
  error (UTF-8 text), ``0x06`` ping and ``0x07`` coloured text are known
  to the web client, which throws on any other kind. Besides the three
  above this server sends ONE ``0x04`` right after the handshake, the
  server info in the exact shape Kyutai's web client validates (the Rust
  server's schema, :func:`server_info`), and ``0x05`` text messages for
  notices about the end of a session (the maximum-duration warning) and
  for the reason of every close it makes, sent before the close frame.

Client messages are checked here so that a bad one ends its session with a
clear reason instead of an exception somewhere deeper.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from starlette import status

from kame.vocab import MOSHI_VOCAB, TextVocab


class Kind(IntEnum):
    HANDSHAKE = 0x00
    AUDIO = 0x01
    TEXT = 0x02
    CONTROL = 0x03
    METADATA = 0x04
    ERROR = 0x05
    PING = 0x06
    COLORED_TEXT = 0x07


#: Control actions of Kyutai's web client (the byte after kind 0x03).
CONTROL_ACTIONS: dict[int, str] = {0x00: "start", 0x01: "endTurn", 0x02: "pause", 0x03: "restart"}

#: Kinds only a server sends; a client sending one breaks the protocol.
_SERVER_ONLY = frozenset({Kind.TEXT, Kind.ERROR, Kind.COLORED_TEXT})


class ProtocolError(ValueError):
    """A client message that breaks the protocol; ``close_code`` says how to close."""

    def __init__(self, message: str, close_code: int = status.WS_1002_PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.close_code = close_code

    @property
    def kind(self) -> str:
        """Short label for metrics."""
        return {status.WS_1003_UNSUPPORTED_DATA: "unsupported_data", status.WS_1002_PROTOCOL_ERROR: "protocol"}.get(
            self.close_code, "other"
        )


# --------------------------------------------------------------------------- client -> server


@dataclass(frozen=True)
class ClientAudio:
    """Ogg/Opus bytes (any number of pages, possibly a partial page)."""

    payload: bytes


@dataclass(frozen=True)
class ClientControl:
    action: str


@dataclass(frozen=True)
class ClientMetadata:
    data: Any


@dataclass(frozen=True)
class ClientPing:
    pass


@dataclass(frozen=True)
class ClientHandshake:
    payload: bytes


ClientMessage = ClientAudio | ClientControl | ClientMetadata | ClientPing | ClientHandshake


def kind_name(kind: int) -> str:
    try:
        return Kind(kind).name.lower()
    except ValueError:
        return "unknown"


def decode_client_message(message: bytes | str | None) -> ClientMessage:
    """Parse one websocket message from a client, or raise :class:`ProtocolError`."""
    if message is None:
        raise ProtocolError("empty websocket message")
    if isinstance(message, str):
        raise ProtocolError(
            "text websocket frames are not part of the protocol: send binary messages (first byte = kind)",
            status.WS_1003_UNSUPPORTED_DATA,
        )
    if len(message) == 0:
        raise ProtocolError("empty message: the first byte must be the message kind")
    kind, payload = message[0], bytes(message[1:])
    if kind == Kind.AUDIO:
        return ClientAudio(payload)
    if kind == Kind.PING:
        return ClientPing()
    if kind == Kind.CONTROL:
        if len(payload) != 1 or payload[0] not in CONTROL_ACTIONS:
            raise ProtocolError(
                f"control message: expected one action byte 0x00-0x03, got {len(payload)} byte(s)"
            )
        return ClientControl(CONTROL_ACTIONS[payload[0]])
    if kind == Kind.METADATA:
        try:
            return ClientMetadata(json.loads(payload.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ProtocolError("metadata message: payload is not UTF-8 JSON") from None
    if kind == Kind.HANDSHAKE:
        return ClientHandshake(payload)
    if kind in _SERVER_ONLY:
        raise ProtocolError(f"message kind 0x{kind:02x} ({kind_name(kind)}) is sent by the server only")
    raise ProtocolError(f"unknown message kind 0x{kind:02x} (known: 0x00-0x07)")


# --------------------------------------------------------------------------- server -> client


def encode_handshake() -> bytes:
    return bytes([Kind.HANDSHAKE])


def encode_audio(ogg: bytes) -> bytes:
    return bytes([Kind.AUDIO]) + ogg


def piece_text(piece: str, vocab: TextVocab = MOSHI_VOCAB) -> str:
    """A SentencePiece piece as clients show it (``▁`` -> space)."""
    return vocab.piece_text(piece)


def encode_text(text: str) -> bytes:
    return bytes([Kind.TEXT]) + text.encode("utf-8")


def text_message(text_id: int | None, piece: str, vocab: TextVocab = MOSHI_VOCAB) -> bytes | None:
    """The 0x02 message for one sampled text token, None for ids without text (pad, end of padding)."""
    if not vocab.is_text(text_id):
        return None
    text = vocab.piece_text(piece)
    return encode_text(text) if text else None


def encode_metadata(data: Any) -> bytes:
    """A 0x04 message. Strict JSON (``allow_nan=False``): browsers' ``JSON.parse`` throws on
    ``NaN``/``Infinity``, which Kyutai's web client would raise once per message listener."""
    return bytes([Kind.METADATA]) + json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8")


def encode_error(message: str) -> bytes:
    return bytes([Kind.ERROR]) + message.encode("utf-8")


def encode_notice(text: str) -> bytes:
    """A 0x05 text message: an end-of-session notice or the reason of a close."""
    return encode_error(text)


def encode_ping() -> bytes:
    return bytes([Kind.PING])


# --------------------------------------------------------------------------- server info (0x04)

#: String fields of the Rust server's ``build_info`` that Kyutai's web client requires.
BUILD_INFO_FIELDS = (
    "build_timestamp",
    "build_date",
    "git_branch",
    "git_timestamp",
    "git_date",
    "git_hash",
    "git_describe",
    "rustc_host_triple",
    "rustc_version",
    "cargo_target_triple",
)


@dataclass(frozen=True)
class ServerInfo:
    """What the one 0x04 message after the handshake tells a client.

    Kyutai's web client validates any metadata message against the Rust
    server's server-info schema and logs a schema error otherwise, so the
    field names and JSON types are exactly that schema's. Values kame does
    not apply get neutral ones: ``pad_mult`` 0, repetition penalty 1 over a
    context of 0.
    """

    text_temperature: float
    text_topk: int
    audio_temperature: float
    audio_topk: int
    lm_model_file: str  # a checkpoint id or file name, never an absolute path
    instance_name: str
    version: str  # kame's version, where the client expects build strings


def _finite(value: float) -> float:
    """A number JSON can carry; a non-finite one (an infinite temperature read from a
    checkpoint's ``lm_gen_config``) shows as 0 rather than breaking the client's parse."""
    value = float(value)
    return value if math.isfinite(value) else 0.0


def server_info(info: ServerInfo) -> dict[str, Any]:
    """The JSON object of the 0x04 server-info message."""
    build = {name: info.version for name in BUILD_INFO_FIELDS}
    return {
        "text_temperature": _finite(info.text_temperature),
        "text_topk": int(_finite(info.text_topk)),
        "audio_temperature": _finite(info.audio_temperature),
        "audio_topk": int(_finite(info.audio_topk)),
        "pad_mult": 0.0,
        "repetition_penalty_context": 0,
        "repetition_penalty": 1.0,
        "lm_model_file": info.lm_model_file,
        "instance_name": info.instance_name,
        "build_info": build,
    }


def encode_server_info(info: ServerInfo) -> bytes:
    return encode_metadata(server_info(info))


def model_file_label(configured: str, weights_name: str, *, local: bool) -> str:
    """How ``lm_model_file`` names the checkpoint: a Hub id or ``tiny:SEED`` as
    configured, a local directory as ``DIRNAME/WEIGHTS`` (never an absolute path)."""
    if configured.startswith("tiny:") or not local:
        return configured
    name = configured.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return f"{name}/{weights_name}" if name not in ("", ".", "..", "~") else weights_name


def expiring_notice(seconds_left: float, max_duration_s: float) -> str:
    """The 0x05 notice sent ``server.duration_warning_s`` before the maximum duration."""
    return (
        f"this session ends in {max(0.0, seconds_left):.0f} s: "
        f"the maximum session duration is {max_duration_s:g} s"
    )


def draining_notice(seconds_left: float) -> str:
    """The 0x05 notice sent to every live session when the server starts draining."""
    return f"the server is shutting down: this session ends in {max(0.0, seconds_left):.0f} s"


def tools_refused_notice(backend: str, reason: str) -> str:
    """The 0x05 notice sent once when the session's back-end refused function tools (``reason`` made safe)."""
    return f"back-end {backend!r} refuses function tools ({reason}): answering without them"


def close_notice(reason: str, error: str | None = None) -> str:
    """The 0x05 text sent before a close frame: the error when there is one, else the close reason."""
    return error or reason
