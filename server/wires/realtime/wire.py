"""The ``/v1/realtime`` wire: OpenAI Realtime (GA) JSON events over the session runtime. No I/O.

Client events are decoded by :mod:`.decode` into commands; a bad event gets
an ``error`` event and the session goes on (until :data:`MAX_CLIENT_ERRORS`,
or a flood of messages, closes it with 1008). Output frames become responses
(:class:`~.turns.AssistantTurns`), ASR turns user items
(:class:`~.turns.UserTurns`), LLM and oracle events ``kame.*`` events
(:func:`~.events.kame_event`); docs/protocol.md section 3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette import status

from kame.media import FRAME_SIZE
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.wire import AudioIn, Command, Fault, FunctionOutputIn, Ignored, Outgoing, ResetIn, SettingsIn
from kame.server.wires.realtime import events as ev
from kame.server.wires.realtime.audio import Pcm16In
from kame.server.wires.realtime.decode import AppendAudio, SessionReset, SessionUpdate, decode_client_event
from kame.server.wires.realtime.events import ClientError, Event, EventEncoder, Ids
from kame.server.wires.realtime.functions import FunctionOutput, ResponseCreate, function_call_response, output_accepted
from kame.server.wires.realtime.settings import ServerInfo, parse_session_update, session_object
from kame.server.wires.realtime.turns import AssistantTurns, Conversation, UserTurns
from kame.session import events as pe
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from starlette.types import Message

PROTOCOL = "realtime"
PATH = "/v1/realtime"
#: Errors caused by a client's events before it is closed (1008).
MAX_CLIENT_ERRORS = 50
#: Messages per second (any kind) beyond which a client is closed (1008).
MAX_MESSAGES_PER_S = 1000
_AUDIO_EVENTS = frozenset({"response.output_audio.delta", "kame.output_audio.delta"})


class RealtimeWire:
    """One ``/v1/realtime`` session's protocol state: ids, the conversation, open turns, settings."""

    protocol = PROTOCOL

    def __init__(self, info: ServerInfo, settings: SessionSettings, frame_size: int = FRAME_SIZE,
                 vocab: TextVocab = MOSHI_VOCAB) -> None:
        self.info = info
        self.vocab = vocab
        self.settings = settings
        self.ids = Ids(info.session_id[:8])
        self.encoder = EventEncoder(self.ids)
        self._pcm_in = Pcm16In(frame_size)
        self._rate_window = -1e9
        self._rate_count = 0
        self.client_errors = 0
        #: function outputs accepted since the last response.create (which then has something to continue)
        self._outputs_pending_create = 0
        self._new_conversation()

    def _new_conversation(self) -> None:
        self.conversation = Conversation()
        self.assistant = AssistantTurns(self.ids, self.conversation, vocab=self.vocab)
        self.assistant.silence_audio = self.settings.silence_audio
        self.users = UserTurns(self.ids, self.conversation)

    def _out(self, events: list[Event], index: int | None = None) -> list[Outgoing]:
        return [
            Outgoing(self.encoder.encode(e), audio_index=index if index is not None and e["type"] in _AUDIO_EVENTS else None)
            for e in events
        ]

    # ------------------------------------------------------------------ client -> server
    def opening(self, settings: SessionSettings) -> list[Outgoing]:
        return self._out([{"type": "session.created", "session": session_object(settings, self.info)}])

    def decode(self, message: Message, now: float) -> list[Command]:
        if now - self._rate_window >= 1.0:
            self._rate_window = now
            self._rate_count = 0
        self._rate_count += 1
        if self._rate_count > MAX_MESSAGES_PER_S:
            error = f"more than {MAX_MESSAGES_PER_S} messages in one second"
            end = SessionEnd("protocol", status.WS_1008_POLICY_VIOLATION, "too many messages", error, "rate_limited",
                             "invalid_request_error")
            return [Fault(kind="realtime_rate", message=error, end=end)]
        text = message.get("text")
        payload: str | bytes | None = text if text is not None else message.get("bytes")
        try:
            command = decode_client_event(payload, self.info.max_function_output_chars)
            if isinstance(command, AppendAudio):
                return [AudioIn(self._pcm_in.push(command.pcm16), command.event_id)] if command.pcm16 else []
            if isinstance(command, SessionUpdate):
                try:
                    new, ignored = parse_session_update(command.session, self.settings, self.info)
                except ClientError as exc:
                    exc.event_id = command.event_id
                    raise
                return [SettingsIn(new, command.event_id, ignored)]
            if isinstance(command, SessionReset):
                return [ResetIn(command.event_id)]
            if isinstance(command, FunctionOutput):
                return [FunctionOutputIn(command.call_id, command.output, command.event_id, command.item_id,
                                         command.previous_item_id)]
            if isinstance(command, ResponseCreate):
                if self._outputs_pending_create > 0:
                    self._outputs_pending_create = 0
                    return [Ignored("response.create after function outputs (the tool round goes on by itself)")]
                raise ClientError(
                    "unsupported_event",
                    "response.create is not supported: responses are not requested, Moshi speaks full duplex "
                    "whenever it decides to (it is accepted after a function_call_output)",
                    param="type", event_id=command.event_id,
                )
        except ClientError as exc:
            return [self._client_error(exc)]
        return []

    def _client_error(self, exc: ClientError) -> Fault:
        self.client_errors += 1
        if self.client_errors >= MAX_CLIENT_ERRORS:
            error = f"{self.client_errors} invalid client events; last: {exc.message}"
            end = SessionEnd("protocol", status.WS_1008_POLICY_VIOLATION, "too many invalid events", error, "too_many_errors",
                             "invalid_request_error")
            return Fault(kind="realtime", message=error, code=exc.code, end=end)
        return Fault(kind="realtime", message=exc.message, code=exc.code, reply=self._out([exc.to_event()]))

    def settings_applied(self, settings: SessionSettings, command: SettingsIn) -> list[Outgoing]:
        self.settings = settings
        self.assistant.silence_audio = settings.silence_audio
        return self._out([{"type": "session.updated", "session": session_object(settings, self.info)}])

    def settings_rejected(self, message: str, command: SettingsIn) -> list[Command]:
        error = ClientError("invalid_value", ev.client_safe(message), param="session.kame", event_id=command.event_id)
        return [self._client_error(error)]

    def function_output_accepted(self, command: FunctionOutputIn) -> list[Outgoing]:
        self._outputs_pending_create += 1
        item_id = command.item_id or self.ids.item()
        previous = self.conversation.add(item_id)
        return self._out(output_accepted(item_id, command.previous_item_id or previous, command.call_id, command.output))

    def function_output_rejected(self, message: str, command: FunctionOutputIn) -> list[Command]:
        error = ClientError("unknown_call_id", ev.client_safe(message), param="item.call_id", event_id=command.event_id)
        return [self._client_error(error)]

    def audio_overflow(self, buffer_s: float, event_id: str | None) -> list[Command]:
        error = ClientError(
            "input_audio_buffer_overflow",
            f"audio arrived more than {buffer_s:g} s ahead of real time; the excess was dropped (send audio at real time)",
            event_id=event_id,
        )
        return [self._client_error(error)]

    def reset_starting(self) -> list[Outgoing]:
        return self._out(self.assistant.close("incomplete"))

    def reset_done(self) -> list[Outgoing]:
        self._new_conversation()
        return self._out([{"type": "kame.session.reset", "reason": "client"}])

    # ------------------------------------------------------------------ server -> client
    def frame(self, frame: pe.AssistantFrame, index: int, send_audio: bool) -> list[Outgoing]:
        text = frame.piece
        speaking = self.assistant.speaking(frame.pcm, text)
        delta = ev.pcm16_base64(frame.pcm) if send_audio else None
        return self._out(self.assistant.frame(delta, speaking=speaking, text=text), index)

    def event(self, event: pe.PipelineEvent) -> list[Outgoing]:
        return self._out(self._map(event))

    def _map(self, event: pe.PipelineEvent) -> list[Event]:
        if isinstance(event, pe.SpeechStarted):
            return self.users.speech_started(event.utterance, event.audio_s)
        if isinstance(event, pe.UserPartial):
            return self.users.partial(event.utterance, event.audio_s, event.text, event.stable, event.latency_s)
        if isinstance(event, pe.SpeechStopped):
            return self.users.speech_stopped(event.utterance, event.audio_s) + self.assistant.close("completed")
        if isinstance(event, pe.UserFinal):
            return self.users.final(event.utterance, event.audio_s, event.text)
        if isinstance(event, pe.AsrFailed):
            message = ev.client_safe(event.message or "speech recognition failed")
            return self.users.failed(message) + [{"type": "kame.asr.error", "message": message}]
        if isinstance(event, pe.FunctionCallRequested):
            # A call is its own response (never part of a speech response): all its events at once.
            response_id, item_id = self.ids.response(), self.ids.item()
            previous = self.conversation.add(item_id)
            return function_call_response(response_id, item_id, event.call_id, event.tool, event.arguments, previous)
        mapped = ev.kame_event(event)
        return [mapped] if mapped is not None else []

    def expiring(self, seconds_left: float) -> list[Outgoing]:
        return self._out([{"type": "kame.session.ending", "reason": "max_duration", "seconds_left": round(seconds_left, 1)}])

    def draining(self, seconds_left: float) -> list[Outgoing]:
        return self._out([{"type": "kame.session.ending", "reason": "draining", "seconds_left": round(seconds_left, 1)}])

    def closing(self, end: SessionEnd) -> list[Outgoing]:
        events: list[Event] = []
        if end.label != "slow_client":
            events += self.assistant.close("incomplete")
        if end.error:
            events.append(ev.error_event(end.error_code, end.error, error_type=end.error_type))
        return self._out(events)


def refusal(error: str) -> Outgoing:
    """How an admission refusal's message goes on this wire (an ``error`` event before the close)."""
    return Outgoing(EventEncoder(Ids()).encode(ev.error_event("invalid_value", error)))


def server_info(
    session_id: str,
    model: str,
    *,
    backends: list[str],
    default_backend: str | None,
    cfg: Any,
    tools_backends: list[str] | None = None,
    mcp_servers: list[str] | None = None,
) -> ServerInfo:
    """What ``session.kame.server`` shows and ``session.update`` is checked against (``cfg``: the KameConfig)."""
    return ServerInfo(
        session_id=session_id,
        model=model,
        backends=tuple(backends),
        default_backend=default_backend,
        default_oracle_policy=cfg.oracle.policy,
        default_barge_in=cfg.oracle.barge_in,
        default_oracle_delay_s=cfg.oracle.oracle_delay_s,
        default_instructions=cfg.oracle.instructions,
        asr_kind=cfg.asr.kind,
        record_available=cfg.server.record_dir is not None,
        idle_timeout_s=cfg.server.idle_timeout_s,
        max_duration_s=cfg.server.max_duration_s,
        input_buffer_s=cfg.server.input_buffer_s,
        tools_backends=tuple(tools_backends or ()),
        mcp_servers=tuple(mcp_servers or ()),
        max_function_output_chars=cfg.tools.max_client_output_chars,
    )
