"""Typed server events of the Live API and their JSON encoding. No I/O.

One frozen dataclass per server event kame sends (the shapes of
``openai/types/live/*_event.py``); :class:`LiveEncoder` turns one into its
compact JSON text and stamps a session-unique ``event_id`` (the order of ids
is the order on the wire). ``session.output_audio.delta`` carries no
``event_id``: its model has none, and it is the one event sent 12.5 times a
second. ``client_event_id`` echoes the ``event_id`` of the client command an
event answers, when the client gave one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from kame.server.wires.ids import Ids

Json = dict[str, Any]
AppendKind = Literal["instructions", "thinking", "commentary"]
CloseReason = Literal["close_requested", "expired", "content", "remote_hangup", "connection_lost"]


class LiveError(ValueError):
    """A client command that cannot be honoured: one ``error`` event; the session goes on."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        client_event_id: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.client_event_id = client_event_id
        self.error_type = error_type

    def event(self) -> ErrorEvent:
        return ErrorEvent(self.code, self.message, param=self.param, error_type=self.error_type,
                          client_event_id=self.client_event_id)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class SessionStarted:
    session: Json
    client_event_id: str | None = None
    type: str = field(default="session.started", init=False)

    def body(self) -> Json:
        return {"session": self.session}


@dataclass(frozen=True)
class SessionUpdated:
    session: Json
    client_event_id: str | None = None
    type: str = field(default="session.updated", init=False)

    def body(self) -> Json:
        return {"session": self.session}


@dataclass(frozen=True)
class SessionClosed:
    reason: CloseReason
    session: Json
    usage_seconds: float
    client_event_id: str | None = None
    type: str = field(default="session.closed", init=False)

    def body(self) -> Json:
        return {"reason": self.reason, "session": self.session, "usage": {"seconds": self.usage_seconds}}


@dataclass(frozen=True)
class OutputAudioDelta:
    """One engine frame of assistant audio, base64 in the session's format."""

    delta: str
    type: str = field(default="session.output_audio.delta", init=False)
    client_event_id: None = field(default=None, init=False)

    def body(self) -> Json:
        return {"delta": self.delta}


@dataclass(frozen=True)
class _TranscriptDelta:
    """Words of one side's transcript with their span in the session's audio (ms)."""

    delta: str
    start_ms: int
    end_ms: int
    client_event_id: str | None = None

    def body(self) -> Json:
        return {"delta": self.delta, "start_ms": self.start_ms, "end_ms": self.end_ms}


@dataclass(frozen=True)
class InputTranscriptDelta(_TranscriptDelta):
    type: str = field(default="session.input_transcript.delta", init=False)


@dataclass(frozen=True)
class OutputTranscriptDelta(_TranscriptDelta):
    type: str = field(default="session.output_transcript.delta", init=False)


@dataclass(frozen=True)
class DelegationCreated:
    """Work delegated: metadata only, never the task text.

    ``target`` is ``client`` (the application answers with appends) or
    ``responses`` (kame's back-end answers; ``response_id`` names the first
    response of its nested ``response.event`` stream).
    """

    delegation_id: str
    offset_ms: int
    client_event_id: str | None = None
    target: Literal["client", "responses"] = "client"
    response_id: str | None = None
    type: str = field(default="session.delegation.created", init=False)

    def body(self) -> Json:
        delegation: Json = {"id": self.delegation_id, "target": self.target, "type": "delegation"}
        if self.response_id is not None:
            delegation["response_id"] = self.response_id
        return {"delegation": delegation, "offset_ms": self.offset_ms}


@dataclass(frozen=True)
class ResponseEventOut:
    """``response.event``: one nested Responses streaming event of a Responses delegation."""

    event: Json
    delegation_id: str | None
    client_event_id: str | None = None
    type: str = field(default="response.event", init=False)

    def body(self) -> Json:
        return {"delegation_id": self.delegation_id, "event": self.event}


@dataclass(frozen=True)
class Appended:
    """``session.{instructions,thinking,commentary}.appended``: accepted onto the timeline."""

    kind: AppendKind
    start_ms: int
    end_ms: int
    client_event_id: str | None = None

    @property
    def type(self) -> str:
        return f"session.{self.kind}.appended"

    def body(self) -> Json:
        return {"start_ms": self.start_ms, "end_ms": self.end_ms}


@dataclass(frozen=True)
class UsageUpdated:
    usage_seconds: float
    client_event_id: str | None = None
    type: str = field(default="session.usage.updated", init=False)

    def body(self) -> Json:
        return {"usage": {"seconds": self.usage_seconds}}


@dataclass(frozen=True)
class InputAudioMuted:
    client_event_id: str | None = None
    type: str = field(default="session.input_audio.muted", init=False)

    def body(self) -> Json:
        return {}


@dataclass(frozen=True)
class InputAudioUnmuted:
    client_event_id: str | None = None
    type: str = field(default="session.input_audio.unmuted", init=False)

    def body(self) -> Json:
        return {}


@dataclass(frozen=True)
class Info:
    """A notice: a field kame accepted but does not apply, why a session is ending, ..."""

    code: str
    message: str
    client_event_id: str | None = None
    type: str = field(default="info", init=False)

    def body(self) -> Json:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class ErrorEvent:
    code: str
    message: str
    param: str | None = None
    error_type: str = "invalid_request_error"
    client_event_id: str | None = None
    type: str = field(default="error", init=False)

    def body(self) -> Json:
        error: Json = {"type": self.error_type, "code": self.code, "message": self.message, "param": self.param}
        if self.client_event_id is not None:
            error["client_event_id"] = self.client_event_id
        return {"error": error}


@dataclass(frozen=True)
class KameEvent:
    """A ``kame.*`` extension event (what reached Moshi's oracle, back-end state, ...)."""

    name: str
    fields: Json
    client_event_id: str | None = None

    @property
    def type(self) -> str:
        return self.name

    def body(self) -> Json:
        return dict(self.fields)


LiveEvent = (
    SessionStarted
    | SessionUpdated
    | SessionClosed
    | OutputAudioDelta
    | InputTranscriptDelta
    | OutputTranscriptDelta
    | DelegationCreated
    | ResponseEventOut
    | Appended
    | UsageUpdated
    | InputAudioMuted
    | InputAudioUnmuted
    | Info
    | ErrorEvent
    | KameEvent
)


class LiveEncoder:
    """Serialises events (compact JSON) and stamps ``event_id``."""

    def __init__(self, ids: Ids) -> None:
        self.ids = ids

    def to_json(self, event: LiveEvent) -> Json:
        out: Json = {"type": event.type}
        if not isinstance(event, OutputAudioDelta):
            out["event_id"] = self.ids.event()
        out.update(event.body())
        if event.client_event_id is not None:
            out["client_event_id"] = event.client_event_id
        return out

    def encode(self, event: LiveEvent) -> str:
        return json.dumps(self.to_json(event), separators=(",", ":"), ensure_ascii=False)
