"""Client events of ``/v1/realtime``: parsing and validation. No I/O.

Every message either becomes one of the few commands the session acts on,
or raises :class:`~kame.server.wires.realtime.events.ClientError` with the code
the client gets back (docs/protocol.md 3.7, 3.8). Nothing here trusts the
message: sizes, types and base64 are checked before anything is decoded
further, and error messages quote at most a few dozen characters of it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kame.server.wires.realtime.events import ClientError
from kame.server.wires.realtime.functions import (
    MAX_OUTPUT_CHARS,
    FunctionOutput,
    FunctionProtocolError,
    decode_function_output,
)
from kame.server.wires.realtime.items import (
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    MessageCreate,
    ResponseCancel,
    ResponseRequest,
    item_event,
    message_create,
    response_request,
)

#: OpenAI client events this server knows but does not implement, and why.
UNSUPPORTED: dict[str, str] = {
    "output_audio_buffer.clear": "OpenAI defines it for WebRTC and SIP only; on a websocket the client holds the "
                                 "audio it has not played (stop playing it, and send response.cancel)",
    "transcription_session.update": "transcription-only sessions are not supported: Moshi always listens and speaks",
}


@dataclass(frozen=True)
class AppendAudio:
    """PCM16 little-endian bytes (any length, possibly odd)."""

    pcm16: bytes
    event_id: str | None = None


@dataclass(frozen=True)
class SessionUpdate:
    session: Any
    event_id: str | None = None


@dataclass(frozen=True)
class BufferCommit:
    """``input_audio_buffer.commit``: the user's turn ends now."""

    event_id: str | None = None


@dataclass(frozen=True)
class BufferClear:
    """``input_audio_buffer.clear``: the user's turn in progress is dropped."""

    event_id: str | None = None


@dataclass(frozen=True)
class SessionReset:
    event_id: str | None = None


ClientCommand = (
    AppendAudio | SessionUpdate | SessionReset | FunctionOutput | ResponseRequest | ResponseCancel
    | MessageCreate | ItemRetrieve | ItemDelete | ItemTruncate | BufferCommit | BufferClear
)


def _event_id(obj: dict[str, Any]) -> str | None:
    value = obj.get("event_id")
    return value[:128] if isinstance(value, str) else None


def decode_client_event(
    message: str | bytes | None, max_output_chars: int = MAX_OUTPUT_CHARS, new_item_id: Callable[[], str] | None = None
) -> ClientCommand:
    """One websocket message -> a command, or :class:`ClientError` (``new_item_id``: for an item the client
    gave no id)."""
    if isinstance(message, (bytes, bytearray)):
        raise ClientError(
            "binary_not_supported", "binary websocket frames are not part of this protocol: send JSON text events"
        )
    if not message:
        raise ClientError("invalid_json", "empty message: expected a JSON object with a \"type\"")
    try:
        obj = json.loads(message)
    except (json.JSONDecodeError, RecursionError):
        raise ClientError("invalid_json", "the message is not valid JSON") from None
    if not isinstance(obj, dict):
        raise ClientError("invalid_json", "the message must be a JSON object with a \"type\"")
    event_id = _event_id(obj)
    etype = obj.get("type")
    if not isinstance(etype, str) or not etype:
        raise ClientError("invalid_event", "the event has no \"type\" string", param="type", event_id=event_id)
    if etype == "input_audio_buffer.append":
        return AppendAudio(decode_audio(obj.get("audio"), event_id), event_id)
    if etype == "session.update":
        return SessionUpdate(obj.get("session"), event_id)
    if etype == "kame.session.reset":
        return SessionReset(event_id)
    if etype == "input_audio_buffer.commit":
        return BufferCommit(event_id)
    if etype == "input_audio_buffer.clear":
        return BufferClear(event_id)
    if etype == "conversation.item.create":
        item = obj.get("item")
        if isinstance(item, dict) and item.get("type", "message") == "message" and "role" in item:
            return message_create(obj, new_item_id() if new_item_id is not None else "item_client", event_id)
        try:
            return decode_function_output(obj, max_output_chars)
        except FunctionProtocolError as exc:
            raise ClientError(exc.code, exc.message, param=exc.param, event_id=event_id) from None
    if etype == "response.create":
        return response_request(obj, event_id)
    if etype == "response.cancel":
        rid = obj.get("response_id")
        return ResponseCancel(event_id, rid if isinstance(rid, str) else None)
    if etype == "conversation.item.retrieve":
        return item_event(obj, "retrieve", event_id)
    if etype == "conversation.item.delete":
        return item_event(obj, "delete", event_id)
    if etype == "conversation.item.truncate":
        return item_event(obj, "truncate", event_id)
    if etype in UNSUPPORTED:
        raise ClientError("unsupported_event", f"{etype} is not supported: {UNSUPPORTED[etype]}", param="type", event_id=event_id)
    raise ClientError("unknown_event", f"unknown event type {etype[:64]!r}", param="type", event_id=event_id)


def decode_audio(value: Any, event_id: str | None = None) -> bytes:
    """``audio`` of an append: base64 -> bytes (strict alphabet, padding checked)."""
    if value is None:
        raise ClientError(
            "missing_required_parameter", "input_audio_buffer.append needs \"audio\" (base64 PCM16)", param="audio", event_id=event_id
        )
    if not isinstance(value, str):
        raise ClientError("invalid_base64", "input_audio_buffer.append: audio must be a base64 string", param="audio", event_id=event_id)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ClientError(
            "invalid_base64", "input_audio_buffer.append: audio is not valid base64", param="audio", event_id=event_id
        ) from None
