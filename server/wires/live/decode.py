"""Client events of the Live API -> typed commands, or :class:`~.events.LiveError`. No I/O.

Every message either becomes one command or raises a :class:`LiveError`
carrying the client's ``event_id`` (as ``client_event_id``), the offending
``param`` and a code (docs/protocol.md, section 4). Shapes are checked with
the SDK's own models (``openai.types.live``), so what kame accepts is what
the contract describes; nothing is trusted before its size and type are
checked, and messages quote at most a few dozen characters of the input.

Events of the protocol that kame does not implement are refused by name,
with the reason: the Decisions API (``decision.*``), audio fixtures and
the SIP sideband's DTMF. ``response.*`` commands decode here and are
refused by the wire unless the session uses Responses delegation.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from openai.types.live import (
    CommentaryAppendEvent,
    InstructionsAppendEvent,
    ResponseCreateEvent,
    ResponseItemCreateEvent,
    ThinkingAppendEvent,
)
from openai.types.live.session_config import SessionConfig
from pydantic import BaseModel, ValidationError

from kame.server.wires.live.events import AppendKind, LiveError

# The SDK's models are imported here, when the server starts, not at a session's first message: importing
# them takes a second or more, and the event loop that runs every session's audio would wait for it.

#: Client events of the protocol kame refuses, and why.
REFUSED: dict[str, str] = {
    "decision.create": "the Decisions API is not available: kame delegates to your application (client delegation)",
    "decision.item.create": "the Decisions API is not available: kame delegates to your application (client delegation)",
    "decision.item.delete": "the Decisions API is not available: kame delegates to your application (client delegation)",
    "session.output_audio.fixture.play": "audio fixtures are not supported: Moshi's output is one continuous stream",
    "transport.dtmf.send": "DTMF needs a SIP call; this is a websocket session",
}

#: The three context appends and the SDK model of each.
APPEND_TYPES: dict[str, AppendKind] = {
    "session.instructions.append": "instructions",
    "session.thinking.append": "thinking",
    "session.commentary.append": "commentary",
}

MAX_EVENT_ID_CHARS = 128
#: Characters of an append's content checked before counting its tokens (500 tokens fit well within).
MAX_APPEND_CHARS = 8000


@dataclass(frozen=True)
class Start:
    """``session.start``: the raw ``session`` object (validated further by :mod:`.config`)."""

    session: dict[str, Any]
    event_id: str | None = None


@dataclass(frozen=True)
class Update:
    session: dict[str, Any]
    event_id: str | None = None


@dataclass(frozen=True)
class AppendAudio:
    """Raw audio bytes in the session's format (any length)."""

    audio: bytes
    event_id: str | None = None


@dataclass(frozen=True)
class Mute:
    muted: bool
    event_id: str | None = None


@dataclass(frozen=True)
class AppendContext:
    """``session.{instructions,thinking,commentary}.append``."""

    kind: AppendKind
    content: str
    delegation_id: str | None
    event_id: str | None = None


@dataclass(frozen=True)
class Close:
    event_id: str | None = None


@dataclass(frozen=True)
class ItemCreate:
    """``response.item.create``: an item for the Responses back-end (shape checked with the SDK's model)."""

    item: dict[str, Any]
    event_id: str | None = None


@dataclass(frozen=True)
class ResponseCreate:
    """``response.create``: continue the delegated response waiting for tool results, or ask for one."""

    event_id: str | None = None


#: Why the ``response.*`` commands are refused in client delegation.
NEEDS_RESPONSES = "requires Responses delegation; this session uses client delegation"

LiveCommand = Start | Update | AppendAudio | Mute | AppendContext | Close | ItemCreate | ResponseCreate


def _event_id(obj: dict[str, Any]) -> str | None:
    value = obj.get("event_id")
    return value[:MAX_EVENT_ID_CHARS] if isinstance(value, str) else None


def validation_error(exc: ValidationError, event_id: str | None, prefix: str = "") -> LiveError:
    """The first problem pydantic found, as a LiveError with a dotted ``param`` (union branch names dropped)."""
    errors = exc.errors()
    # In a union, pydantic reports every branch; the missing/type errors of a branch whose tag matched
    # come first in practice, but prefer an error that is not a tag mismatch.
    chosen = next((e for e in errors if str(e.get("loc", ("",))[-1]) != "type"), errors[0])
    parts = [str(p) for p in chosen.get("loc", ()) if not (isinstance(p, str) and p[:1].isupper())]
    param = ".".join(([prefix] if prefix else []) + parts) or None
    code = "missing_required_parameter" if chosen.get("type") == "missing" else "invalid_value"
    message = f"{param or 'event'}: {chosen.get('msg', 'invalid value')}"
    return LiveError(code, message[:300], param=param, client_event_id=event_id)


def sdk_validate(model: type[BaseModel], obj: Any, event_id: str | None, prefix: str = "") -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise validation_error(exc, event_id, prefix) from None


def decode_audio(value: Any, event_id: str | None) -> bytes:
    if value is None:
        raise LiveError("missing_required_parameter", "session.input_audio.append needs \"audio\" (base64)",
                        param="audio", client_event_id=event_id)
    if not isinstance(value, str):
        raise LiveError("invalid_base64", "session.input_audio.append: audio must be a base64 string",
                        param="audio", client_event_id=event_id)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise LiveError("invalid_base64", "session.input_audio.append: audio is not valid base64",
                        param="audio", client_event_id=event_id) from None


def decode_client_event(message: str | bytes | None) -> LiveCommand:
    """One websocket message -> a command, or :class:`LiveError`."""
    if isinstance(message, (bytes, bytearray)):
        raise LiveError("binary_not_supported",
                        "binary websocket frames are not part of the Live protocol: send JSON text events")
    if not message:
        raise LiveError("invalid_json", "empty message: expected a JSON object with a \"type\"")
    try:
        obj = json.loads(message)
    except (json.JSONDecodeError, RecursionError):
        raise LiveError("invalid_json", "the message is not valid JSON") from None
    if not isinstance(obj, dict):
        raise LiveError("invalid_json", "the message must be a JSON object with a \"type\"")
    event_id = _event_id(obj)
    etype = obj.get("type")
    if not isinstance(etype, str) or not etype:
        raise LiveError("invalid_event", "the event has no \"type\" string", param="type", client_event_id=event_id)
    if etype == "session.input_audio.append":  # the hot path: checked by hand
        return AppendAudio(decode_audio(obj.get("audio"), event_id), event_id)
    if etype in APPEND_TYPES:
        return _append(obj, APPEND_TYPES[etype], event_id)
    if etype == "session.start":
        session = obj.get("session")
        if not isinstance(session, dict):
            raise LiveError("missing_required_parameter", "session.start needs a session object (with \"model\")",
                            param="session", client_event_id=event_id)
        return Start(session, event_id)
    if etype == "session.update":
        session = obj.get("session")
        if not isinstance(session, dict):
            raise LiveError("missing_required_parameter", "session.update needs a session object",
                            param="session", client_event_id=event_id)
        return Update(session, event_id)
    if etype == "session.input_audio.mute":
        return Mute(True, event_id)
    if etype == "session.input_audio.unmute":
        return Mute(False, event_id)
    if etype == "session.close":
        return Close(event_id)
    if etype == "response.item.create":
        sdk_validate(ResponseItemCreateEvent, obj, event_id)
        return ItemCreate(dict(obj["item"]), event_id)
    if etype == "response.create":
        sdk_validate(ResponseCreateEvent, obj, event_id)
        return ResponseCreate(event_id)
    if etype in REFUSED:
        raise LiveError("unsupported_event", f"{etype} is not supported: {REFUSED[etype]}", param="type",
                        client_event_id=event_id)
    raise LiveError("unknown_event", f"unknown event type {etype[:64]!r}", param="type", client_event_id=event_id)


def _append(obj: dict[str, Any], kind: AppendKind, event_id: str | None) -> AppendContext:
    models: dict[str, type[BaseModel]] = {
        "instructions": InstructionsAppendEvent,
        "thinking": ThinkingAppendEvent,
        "commentary": CommentaryAppendEvent,
    }
    model = models[kind]
    content = obj.get("content")
    if isinstance(content, str) and len(content) > MAX_APPEND_CHARS:
        raise LiveError("content_too_long", f"session.{kind}.append: content is limited to 500 tokens",
                        param="content", client_event_id=event_id)
    event = sdk_validate(model, obj, event_id)
    delegation_id = event.delegation_id
    if delegation_id is not None and (not delegation_id or len(delegation_id) > MAX_EVENT_ID_CHARS):
        raise LiveError("invalid_value", f"session.{kind}.append: delegation_id is not an id kame issued",
                        param="delegation_id", client_event_id=event_id)
    return AppendContext(kind, event.content, delegation_id, event_id)


def warm_up() -> None:
    """Build the validators of the SDK models used per message (pydantic builds them at first use, some
    tens of milliseconds each): called when the server starts, so no session's first message pays."""
    SessionConfig.model_validate({"model": "warm-up", "input": [{"role": "user", "content": [{"text": "x"}]}]})
    for model, kind in ((CommentaryAppendEvent, "commentary"), (ThinkingAppendEvent, "thinking"),
                        (InstructionsAppendEvent, "instructions")):
        model.model_validate({"type": f"session.{kind}.append", "content": "x", "delegation_id": None})
    ResponseCreateEvent.model_validate({"type": "response.create"})
