"""Twilio Media Streams messages (bidirectional ``<Connect><Stream>``): JSON text frames <-> dataclasses. No I/O.

Twilio sends ``connected``, ``start`` (``streamSid``, ``callSid``, ``tracks``,
``customParameters``, ``mediaFormat`` audio/x-mulaw 8000 Hz mono), ``media``
(base64 G.711, 20 ms each), ``dtmf`` (``digit``), ``mark`` (one of ours, played
or cleared) and ``stop``; the server sends ``media``, ``mark`` and ``clear``.
Telnyx's media streaming has the same shape with snake_case names
(``stream_id``, ``media_format`` ``PCMU``/``PCMA``, ``custom_parameters``): both
spellings are read. Anything else is a :class:`ProtocolError`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

#: What one inbound text frame may weigh (a 20 ms media message is ~300 bytes; ``start`` carries parameters).
MAX_MESSAGE_CHARS = 64 * 1024
#: Custom parameters kept from ``start`` (names and values are cut to these lengths).
MAX_PARAMETERS = 32
MAX_PARAMETER_CHARS = 4096
#: The keypad's digits, as Twilio names them.
DTMF_DIGITS = frozenset("0123456789*#ABCD")
#: Media encodings -> kame's name of the G.711 law.
ENCODINGS = {"audio/x-mulaw": "audio/pcmu", "pcmu": "audio/pcmu", "audio/x-alaw": "audio/pcma", "pcma": "audio/pcma"}


class ProtocolError(ValueError):
    """A message that is not Twilio's (the message says what, never echoes the payload)."""


@dataclass(frozen=True)
class Connected:
    protocol: str = ""


@dataclass(frozen=True)
class Start:
    """The call's stream: its ids, its custom parameters and its audio format (kame's encoding name)."""

    stream_sid: str
    call_sid: str = ""
    account_sid: str = ""
    tracks: tuple[str, ...] = ("inbound",)
    custom_parameters: dict[str, str] = field(default_factory=dict)
    encoding: str = "audio/pcmu"
    sample_rate: int = 8000
    channels: int = 1


@dataclass(frozen=True)
class Media:
    payload: bytes
    track: str = "inbound"


@dataclass(frozen=True)
class Dtmf:
    digit: str


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class Stop:
    pass


Inbound = Connected | Start | Media | Dtmf | Mark | Stop


def _get(obj: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in obj:
            return obj[name]
    return None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be an object")
    return value


def _start(msg: dict[str, Any]) -> Start:
    body = _object(msg.get("start"), "start")
    sid = _get(body, "streamSid", "stream_id") or _get(msg, "streamSid", "stream_id")
    if not isinstance(sid, str) or not sid:
        raise ProtocolError("start without a streamSid")
    fmt = _get(body, "mediaFormat", "media_format") or {}
    fmt = _object(fmt, "start.mediaFormat")
    raw_encoding = str(fmt.get("encoding", "audio/x-mulaw")).lower()
    encoding = ENCODINGS.get(raw_encoding)
    rate = _get(fmt, "sampleRate", "sample_rate") or 8000
    channels = fmt.get("channels", 1) or 1
    if encoding is None:
        raise ProtocolError(f"start.mediaFormat.encoding {raw_encoding[:32]!r}: audio/x-mulaw (or audio/x-alaw) only")
    if rate != 8000 or channels != 1:
        raise ProtocolError("start.mediaFormat: 8000 Hz mono only")
    params = _get(body, "customParameters", "custom_parameters") or {}
    params = _object(params, "start.customParameters")
    custom = {str(k)[:MAX_PARAMETER_CHARS]: str(v)[:MAX_PARAMETER_CHARS] for k, v in list(params.items())[:MAX_PARAMETERS]}
    tracks = body.get("tracks") or ["inbound"]
    return Start(
        stream_sid=sid[:64],
        call_sid=str(_get(body, "callSid", "call_control_id", "call_sid") or "")[:128],
        account_sid=str(_get(body, "accountSid", "account_sid") or "")[:64],
        tracks=tuple(str(t)[:32] for t in tracks) if isinstance(tracks, list) else ("inbound",),
        custom_parameters=custom,
        encoding=encoding,
    )


def decode(text: str | bytes | None) -> Inbound:
    """One inbound frame -> its message; :class:`ProtocolError` for anything that is not Twilio's."""
    if text is None:
        raise ProtocolError("an empty frame")
    if isinstance(text, bytes):
        raise ProtocolError("binary frames are not part of the protocol (JSON text only)")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ProtocolError(f"a message of {len(text)} characters (at most {MAX_MESSAGE_CHARS})")
    try:
        msg = json.loads(text)
    except ValueError:
        raise ProtocolError("not JSON") from None
    msg = _object(msg, "a message")
    event = msg.get("event")
    if event == "media":
        media = _object(msg.get("media"), "media")
        payload = media.get("payload")
        if not isinstance(payload, str):
            raise ProtocolError("media without a payload")
        try:
            audio = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("media.payload is not base64") from None
        return Media(audio, str(media.get("track", "inbound"))[:32])
    if event == "start":
        return _start(msg)
    if event == "connected":
        return Connected(str(msg.get("protocol", ""))[:32])
    if event == "dtmf":
        digit = _object(msg.get("dtmf"), "dtmf").get("digit")
        if not isinstance(digit, str) or digit not in DTMF_DIGITS:
            raise ProtocolError("dtmf.digit must be one of 0-9, *, #, A-D")
        return Dtmf(digit)
    if event == "mark":
        name = _object(msg.get("mark"), "mark").get("name")
        if not isinstance(name, str):
            raise ProtocolError("mark without a name")
        return Mark(name[:256])
    if event == "stop":
        return Stop()
    raise ProtocolError(f"unknown event {str(event)[:32]!r}")


def media(stream_sid: str, audio: bytes) -> str:
    """Audio to play to the caller (G.711 in the stream's encoding)."""
    return json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": base64.b64encode(audio).decode()}})


def mark(stream_sid: str, name: str) -> str:
    """Twilio sends ``name`` back once the audio sent before it has been played (or cleared)."""
    return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear(stream_sid: str) -> str:
    """Drop the audio Twilio still holds for the caller (barge-in)."""
    return json.dumps({"event": "clear", "streamSid": stream_sid})
