"""Server events of ``/v1/realtime`` (OpenAI Realtime GA shapes) as plain dicts. No I/O.

Builders return dicts without ``event_id``; :class:`EventEncoder` stamps
each with a session-unique id when it is serialised, so the order of ids is
the order on the wire. Ids look like OpenAI's (``event_``, ``resp_``,
``item_``, ``sess_`` + hex) so that clients that parse them by prefix work.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.audio.pcm import float_to_pcm16_bytes
from kame.redaction import client_safe as client_safe
from kame.server.wires.ids import Ids
from kame.session import events as pe
from kame.session.events import PipelineEvent

Event = dict[str, Any]

AUDIO_FORMAT: dict[str, Any] = {"type": "audio/pcm", "rate": SAMPLE_RATE}
VOICE = "moshi"


class EventEncoder:
    """Serialises events (compact JSON) and stamps ``event_id``."""

    def __init__(self, ids: Ids) -> None:
        self.ids = ids

    def encode(self, event: Event) -> str:
        stamped = {"type": event["type"], "event_id": self.ids.event()}
        stamped.update((k, v) for k, v in event.items() if k != "type")
        return json.dumps(stamped, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------- audio


def pcm16_base64(pcm: np.ndarray) -> str:
    """float32 [-1, 1] -> base64 of 16-bit little-endian PCM (clipped)."""
    return base64.b64encode(float_to_pcm16_bytes(np.asarray(pcm, np.float32).reshape(-1))).decode("ascii")


# --------------------------------------------------------------------------- errors


def error_event(
    code: str,
    message: str,
    *,
    param: str | None = None,
    client_event_id: str | None = None,
    error_type: str = "invalid_request_error",
) -> Event:
    return {
        "type": "error",
        "error": {"type": error_type, "code": code, "message": message, "param": param, "event_id": client_event_id},
    }


# --------------------------------------------------------------------------- assistant responses


def assistant_item(item_id: str, status: str, transcript: str | None) -> dict[str, Any]:
    content = [] if transcript is None else [{"type": "output_audio", "transcript": transcript}]
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def response_object(
    response_id: str,
    status: str,
    output: list[dict[str, Any]],
    metadata: dict[str, str] | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": None if status in ("in_progress", "completed") else {"type": status, "reason": reason},
        "output": output,
        "output_modalities": ["audio"],
        "audio": {"output": {"format": dict(AUDIO_FORMAT), "voice": VOICE}},
        "conversation_id": None,
        "max_output_tokens": "inf",
        "metadata": metadata,
        "usage": None,
    }


def response_created(response_id: str, metadata: dict[str, str] | None = None) -> Event:
    return {"type": "response.created", "response": response_object(response_id, "in_progress", [], metadata)}


def response_done(
    response_id: str, status: str, output: list[dict[str, Any]], metadata: dict[str, str] | None = None,
    reason: str | None = None,
) -> Event:
    return {"type": "response.done", "response": response_object(response_id, status, output, metadata, reason)}


def audio_item_start(response_id: str, item_id: str, previous_item_id: str | None, output_index: int = 0) -> list[Event]:
    """The three events that add the assistant's audio message to a response."""
    item = assistant_item(item_id, "in_progress", None)
    where = {"response_id": response_id, "item_id": item_id, "output_index": output_index, "content_index": 0}
    return [
        {"type": "response.output_item.added", "response_id": response_id, "output_index": output_index, "item": item},
        {"type": "conversation.item.added", "previous_item_id": previous_item_id, "item": dict(item)},
        {"type": "response.content_part.added", **where, "part": {"type": "audio", "transcript": ""}},
    ]


def audio_item_end(
    response_id: str, item_id: str, previous_item_id: str | None, transcript: str, status: str, output_index: int = 0
) -> tuple[list[Event], dict[str, Any]]:
    """The five events that close the audio message, and the item as ``response.done`` shows it."""
    where = {"response_id": response_id, "item_id": item_id, "output_index": output_index, "content_index": 0}
    item = assistant_item(item_id, "completed" if status == "completed" else "incomplete", transcript)
    return [
        {"type": "response.output_audio.done", **where},
        {"type": "response.output_audio_transcript.done", **where, "transcript": transcript},
        {"type": "response.content_part.done", **where, "part": {"type": "audio", "transcript": transcript}},
        {"type": "response.output_item.done", "response_id": response_id, "output_index": output_index, "item": item},
        {"type": "conversation.item.done", "previous_item_id": previous_item_id, "item": dict(item)},
    ], item


def _content_delta(etype: str, response_id: str, item_id: str, delta: str, output_index: int) -> Event:
    """A delta of an output item's one content part (audio and its transcript share the shape)."""
    return {
        "type": etype,
        "response_id": response_id,
        "item_id": item_id,
        "output_index": output_index,
        "content_index": 0,
        "delta": delta,
    }


def audio_delta(response_id: str, item_id: str, delta: str, output_index: int = 0) -> Event:
    return _content_delta("response.output_audio.delta", response_id, item_id, delta, output_index)


def transcript_delta(response_id: str, item_id: str, delta: str, output_index: int = 0) -> Event:
    return _content_delta("response.output_audio_transcript.delta", response_id, item_id, delta, output_index)


def silence_delta(delta: str) -> Event:
    """An output frame outside any response (``kame.output_audio.delta``)."""
    return {"type": "kame.output_audio.delta", "delta": delta}


# --------------------------------------------------------------------------- user turns


def user_item(item_id: str, status: str, transcript: str | None) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": status,
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def speech_started(item_id: str, audio_ms: int, previous_item_id: str | None) -> list[Event]:
    return [
        {"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_ms, "item_id": item_id},
        {"type": "conversation.item.added", "previous_item_id": previous_item_id, "item": user_item(item_id, "in_progress", None)},
    ]


def speech_stopped(item_id: str, audio_ms: int, previous_item_id: str | None) -> list[Event]:
    return [
        {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_ms, "item_id": item_id},
        {"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": previous_item_id},
    ]


def transcription_delta(item_id: str, delta: str) -> Event:
    return {"type": "conversation.item.input_audio_transcription.delta", "item_id": item_id, "content_index": 0, "delta": delta}


def transcription_partial(item_id: str, text: str, stable: str, latency_s: float | None) -> Event:
    return {
        "type": "kame.input_audio_transcription.partial",
        "item_id": item_id,
        "text": text,
        "stable": stable,
        "latency_s": None if latency_s is None else round(float(latency_s), 3),
    }


def transcription_completed(item_id: str, transcript: str, seconds: float, previous_item_id: str | None) -> list[Event]:
    return [
        {
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": item_id,
            "content_index": 0,
            "transcript": transcript,
            "usage": {"type": "duration", "seconds": round(max(0.0, seconds), 3)},
        },
        {"type": "conversation.item.done", "previous_item_id": previous_item_id, "item": user_item(item_id, "completed", transcript)},
    ]


def transcription_failed(item_id: str, message: str) -> Event:
    return {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": item_id,
        "content_index": 0,
        "error": {"type": "server_error", "code": "asr_error", "message": message, "param": None},
    }


class ClientError(ValueError):
    """A client event that cannot be honoured: becomes one ``error`` event; the session goes on."""

    def __init__(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id

    def to_event(self) -> Event:
        return error_event(self.code, self.message, param=self.param, client_event_id=self.event_id)


# --------------------------------------------------------------------------- kame.* events

#: Pipeline event -> kame.* event type, and the payload fields passed on.
KAME_EVENTS: dict[type[PipelineEvent], tuple[str, tuple[str, ...]]] = {
    pe.LlmRequestStarted: ("kame.backend.request_started", ("request_id", "backend", "turn_id", "reason", "tools")),
    pe.LlmFirstToken: ("kame.backend.first_token", ("request_id", "backend", "ttft_s")),
    pe.LlmDone: ("kame.backend.done", ("request_id", "backend", "text", "duration_s")),
    pe.LlmCancelled: ("kame.backend.cancelled", ("request_id", "reason")),
    pe.LlmDropped: ("kame.backend.dropped", ("request_id", "reason")),
    pe.LlmError: ("kame.backend.error", ("request_id", "backend", "error", "message")),
    pe.BackendDown: ("kame.backend.down", ("backend", "error", "retry_in_s")),
    pe.BackendUp: ("kame.backend.up", ("backend",)),
    pe.ToolsRefused: ("kame.backend.tools_refused", ("backend", "reason")),
    pe.OracleReset: ("kame.oracle.reset", ("request_id", "text", "tokens")),
    pe.OracleText: ("kame.oracle.text", ("request_id", "text", "tokens")),
    pe.OracleCleared: ("kame.oracle.cleared", ("reason",)),
    pe.EchoJudged: ("kame.echo_guard.verdict", ("echo", "text", "words", "matched", "extra", "delay_s", "audio_s")),
}



def kame_event(event: PipelineEvent) -> Event | None:
    """The ``kame.*`` event for a pipeline event (None for the ones mapped elsewhere or not sent)."""
    if isinstance(event, (pe.ToolCallStarted, pe.ToolCallFinished)):
        # fields(): the tool's name as "name", arguments only where the session shows them
        payload = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in event.fields().items()}
        return {"type": "kame." + event.name, **payload}
    spec = KAME_EVENTS.get(type(event))
    if spec is None:
        return None
    name, fields = spec
    out: Event = {"type": name}
    for key in fields:
        value = getattr(event, key)
        if key in ("message", "reason") and value is not None:
            value = client_safe(value)
        elif isinstance(value, float):
            value = round(value, 4)
        out[key] = value
    return out
