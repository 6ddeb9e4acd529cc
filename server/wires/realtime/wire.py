"""The ``/v1/realtime`` wire: OpenAI Realtime (GA) JSON events over the session runtime. No I/O.

Client events are decoded by :mod:`.decode` into commands (what changes the
conversation or who answers goes to the pipeline as
:mod:`kame.session.commands`); a bad event gets an ``error`` event and the
session goes on (until :data:`MAX_CLIENT_ERRORS`, or a flood of messages,
closes it with 1008). Output frames become responses, one at a time
(:class:`~.turns.AssistantTurns`), ASR turns user items
(:class:`~.turns.UserTurns`), LLM and oracle events ``kame.*`` events
(:func:`~.events.kame_event`), sent only to a session that asked for them;
docs/protocol.md section 3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kame.audio.media import FRAME_SIZE
from kame.server.runtime.client_limits import MAX_CLIENT_ERRORS, MAX_MESSAGES_PER_S
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.wire import (
    AudioIn,
    Command,
    Fault,
    FunctionOutputIn,
    Outgoing,
    Reply,
    ResetIn,
    SettingsIn,
    Wire,
)
from kame.server.wires.realtime import events as ev
from kame.server.wires.realtime.audio import Pcm16In
from kame.server.wires.realtime.decode import (
    AppendAudio,
    BufferClear,
    BufferCommit,
    SessionReset,
    SessionUpdate,
    decode_client_event,
)
from kame.server.wires.realtime.events import ClientError, Event, EventEncoder, Ids
from kame.server.wires.realtime.functions import FunctionOutput, output_accepted
from kame.server.wires.realtime.items import (
    ItemDelete,
    ItemRetrieve,
    ItemStore,
    ItemTruncate,
    MessageCreate,
    ResponseCancel,
    ResponseRequest,
)
from kame.server.wires.realtime.settings import ServerInfo, kame_events_in, parse_session_update, session_object
from kame.server.wires.realtime.turns import AssistantTurns, Conversation, UserTurns
from kame.session import commands as sc
from kame.session import events as pe
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from starlette.types import Message

PROTOCOL = "realtime"
PATH = "/v1/realtime"
#: One output frame (what ``audio_end_ms`` of a truncate counts in).
FRAME_MS = 80
_AUDIO_EVENTS = frozenset({"response.output_audio.delta", "kame.output_audio.delta"})


class RealtimeWire(Wire):
    """One ``/v1/realtime`` session's protocol state: ids, the conversation, open turns, settings."""

    protocol = PROTOCOL
    max_messages_per_s = MAX_MESSAGES_PER_S
    max_client_errors = MAX_CLIENT_ERRORS

    def __init__(self, info: ServerInfo, settings: SessionSettings, frame_size: int = FRAME_SIZE,
                 vocab: TextVocab = MOSHI_VOCAB, kame_events: bool = False) -> None:
        self.info = info
        #: Send ``kame.*`` events (off unless the client asks: a standard client must see only standard events).
        self.kame_events = kame_events
        self._kame_events_next: bool | None = None
        self.vocab = vocab
        self.settings = settings
        self.ids = Ids(info.session_id[:8])
        self.encoder = EventEncoder(self.ids)
        self._pcm_in = Pcm16In(frame_size)
        #: function outputs accepted since the last response.create (which then has something to continue)
        self._outputs_pending_create = 0
        self._new_conversation()

    def _new_conversation(self) -> None:
        self.conversation = Conversation()
        self.assistant = AssistantTurns(self.ids, self.conversation, vocab=self.vocab)
        self.assistant.silence_audio = self.settings.silence_audio
        self.users = UserTurns(self.ids, self.conversation)
        self.items = ItemStore()
        #: item id -> the ASR utterance of a user item (its key in the back-end's history)
        self._utterances: dict[str, int] = {}
        #: client turns: committed items waiting for their transcript, in commit order; item id -> commit
        self._commits: list[str] = []
        self._client_items: dict[str, int] = {}

    def _out(self, events: list[Event], index: int | None = None, *, kame: bool = False) -> list[Outgoing]:
        """Encode events; ``kame.*`` ones only where the session asked for them (or ``kame``: the answer to a
        ``kame.*`` client event, which only a client that knows them sends)."""
        out: list[Outgoing] = []
        for e in events:
            if not (self.kame_events or kame) and e["type"].startswith("kame."):
                continue
            self.items.saw(e)
            audio = index if index is not None and e["type"] in _AUDIO_EVENTS else None
            out.append(Outgoing(self.encoder.encode(e), audio_index=audio))
        return out

    # ------------------------------------------------------------------ client -> server
    def opening(self, settings: SessionSettings) -> list[Outgoing]:
        session = session_object(settings, self.info, kame_events=self.kame_events)
        return self._out([{"type": "session.created", "session": session}])

    def decode(self, message: Message, now: float) -> list[Command]:
        text = message.get("text")
        payload: str | bytes | None = text if text is not None else message.get("bytes")
        try:
            command = decode_client_event(payload, self.info.max_function_output_chars, self.ids.item)
            if isinstance(command, AppendAudio):
                return [AudioIn(self._pcm_in.push(command.pcm16), command.event_id)] if command.pcm16 else []
            if isinstance(command, SessionUpdate):
                try:
                    new, ignored = parse_session_update(command.session, self.settings, self.info)
                    self._kame_events_next = kame_events_in(command.session)
                except ClientError as exc:
                    exc.event_id = command.event_id
                    raise
                return [SettingsIn(new, command.event_id, ignored)]
            if isinstance(command, SessionReset):
                return [ResetIn(command.event_id)]
            if isinstance(command, FunctionOutput):
                return [FunctionOutputIn(command.call_id, command.output, command.event_id, command.item_id,
                                         command.previous_item_id)]
            if isinstance(command, ResponseRequest):
                return self._response_create(command)
            if isinstance(command, ResponseCancel):
                return self._response_cancel(command)
            if isinstance(command, MessageCreate):
                return self._message_create(command)
            if isinstance(command, ItemRetrieve):
                item = self._known_item(command.item_id, command.event_id)
                return [Reply(self._out([{"type": "conversation.item.retrieved", "item": item}]))]
            if isinstance(command, ItemDelete):
                return self._item_delete(command)
            if isinstance(command, ItemTruncate):
                return self._item_truncate(command)
            if isinstance(command, BufferCommit):
                return self._buffer_commit(command)
            if isinstance(command, BufferClear):
                return self._buffer_clear(command)
        except ClientError as exc:
            return [self._client_error(exc)]
        return []

    # ------------------------------------------------------------------ responses and items (docs/protocol.md 3.7)
    def _response_create(self, command: ResponseRequest) -> list[Command]:
        if self.assistant.requested_open:
            raise ClientError(
                "conversation_already_has_active_response",
                "a requested response is in progress: wait for its response.done, or send response.cancel",
                event_id=command.event_id,
            )
        continue_tools = self._outputs_pending_create > 0
        self._outputs_pending_create = 0
        request = sc.RequestAnswer(command.instructions, command.context, continue_tools=continue_tools)
        reply = Reply(self._out(self.assistant.request(command.metadata)))
        return [reply, *self._forget_unheard(), request]

    def _response_cancel(self, command: ResponseCancel) -> list[Command]:
        current = self.assistant.current
        if current is None or (command.response_id is not None and command.response_id != current.id):
            raise ClientError("response_cancel_not_active", "there is no response in progress to cancel",
                              event_id=command.event_id)
        return [Reply(self._out(self.assistant.cancel("client_cancelled"))),
                sc.CancelAnswer("client_cancelled")]

    def _message_create(self, command: MessageCreate) -> list[Command]:
        item_id = command.item["id"]
        previous = self.conversation.add(item_id)
        self.conversation.forget(item_id)
        events: list[Event] = [
            {"type": "conversation.item.added", "previous_item_id": previous, "item": command.item},
            {"type": "conversation.item.done", "previous_item_id": previous, "item": dict(command.item)},
        ]
        if command.item.get("role") == "user":  # a typed turn: Moshi's next words are a new response
            events += self.assistant.typed_turn()
        return [Reply(self._out(events)), sc.AddContext(command.context)]

    # ------------------------------------------------------------------ the client's turns (docs/protocol.md 3.5)
    def _buffer_commit(self, command: BufferCommit) -> list[Command]:
        if not self.settings.client_turns:
            # the ASR's turn in progress ends now; its speech_stopped / committed / transcription follow
            if not any(not t.stopped for t in self.users.turns.values()):
                raise ClientError("input_audio_buffer_commit_empty",
                                  "no user speech since the last turn ended: nothing to commit", event_id=command.event_id)
            return [sc.CommitTurn()]
        item_id = self.ids.item()
        previous = self.conversation.add(item_id)
        self._commits.append(item_id)
        events: list[Event] = [
            {"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": previous},
            {"type": "conversation.item.added", "previous_item_id": previous, "item": ev.user_item(item_id, "in_progress", None)},
        ]
        return [Reply(self._out(events)), sc.CommitTurn()]

    def _buffer_clear(self, command: BufferClear) -> list[Command]:
        return [Reply(self._out([{"type": "input_audio_buffer.cleared"}])), sc.ClearTurn()]

    def _turn_committed(self, event: pe.UserTurnCommitted) -> list[Event]:
        if not self._commits:
            return []
        item_id = self._commits.pop(0)
        previous = self.conversation.previous_of(item_id)
        self.conversation.forget(item_id)
        self._client_items[item_id] = event.turn
        while len(self._client_items) > 256:  # an hour-long call commits thousands: remember the latest only
            self._client_items.pop(next(iter(self._client_items)))
        return ev.transcription_completed(item_id, event.text, 0.0, previous)

    def _known_item(self, item_id: str, event_id: str | None) -> dict[str, object]:
        item = self.items.get(item_id)
        if item is None:
            raise ClientError("item_not_found", f"no item {item_id[:64]!r} in this conversation (or it was forgotten)",
                              param="item_id", event_id=event_id)
        return item

    def _item_delete(self, command: ItemDelete) -> list[Command]:
        self._known_item(command.item_id, command.event_id)
        self.items.pop(command.item_id)
        reply = Reply(self._out([{"type": "conversation.item.deleted", "item_id": command.item_id}]))
        utterance = self._utterances.pop(command.item_id, None)
        if utterance is not None:
            return [reply, sc.ForgetContext(sc.utterance_key(utterance))]
        commit = self._client_items.pop(command.item_id, None)
        if commit is not None:
            return [reply, sc.ForgetContext(sc.commit_key(commit))]
        spoken = self.assistant.steps_of(command.item_id)
        if spoken is not None:
            return [reply, sc.ForgetSpeech(spoken.first_step, spoken.end_step)]
        return [reply, sc.ForgetContext(command.item_id)]

    def _item_truncate(self, command: ItemTruncate) -> list[Command]:
        item = self._known_item(command.item_id, command.event_id)
        spoken = self.assistant.steps_of(command.item_id)
        if spoken is None or item.get("role") != "assistant":
            raise ClientError("invalid_value", "only an assistant message's audio can be truncated", param="item_id",
                              event_id=command.event_id)
        heard = spoken.first_step + -(-command.audio_end_ms // FRAME_MS)
        reply = Reply(self._out([{"type": "conversation.item.truncated", "item_id": command.item_id,
                                  "content_index": command.content_index, "audio_end_ms": command.audio_end_ms}]))
        if heard >= spoken.end_step:
            return [reply]
        return [reply, sc.ForgetSpeech(heard, spoken.end_step)]

    def _client_error(self, exc: ClientError) -> Fault:
        return Fault(kind="realtime", message=exc.message, code=exc.code, reply=self._out([exc.to_event()]))

    def settings_applied(self, settings: SessionSettings, command: SettingsIn) -> list[Outgoing]:
        self.settings = settings
        self.assistant.silence_audio = settings.silence_audio
        if self._kame_events_next is not None:
            self.kame_events = self._kame_events_next
        self._kame_events_next = None
        session = session_object(settings, self.info, kame_events=self.kame_events)
        return self._out([{"type": "session.updated", "session": session}])

    def settings_rejected(self, message: str, command: SettingsIn) -> list[Command]:
        self._kame_events_next = None
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

    def client_error(self, code: str, message: str, event_id: str | None) -> Fault:
        return self._client_error(ClientError(code, message, event_id=event_id))

    def reset_starting(self) -> list[Outgoing]:
        return self._out(self.assistant.close("incomplete"))

    def reset_done(self) -> list[Outgoing]:
        self._new_conversation()
        self._outputs_pending_create = 0
        return self._out([{"type": "kame.session.reset", "reason": "client"}], kame=True)

    # ------------------------------------------------------------------ server -> client
    def frame(self, frame: pe.AssistantFrame, index: int, send_audio: bool) -> list[Outgoing | sc.ConversationCommand]:
        text = frame.piece
        speaking = self.assistant.speaking(frame.pcm, text)
        delta = ev.pcm16_base64(frame.pcm) if send_audio else None
        fed = frame.oracle_id >= 0 and frame.oracle_id != self.vocab.pad_id
        events = self._out(self.assistant.frame(delta, speaking=speaking, text=text, step=frame.step, fed=fed), index)
        return [*events, *self._forget_unheard()]

    def _forget_unheard(self) -> list[sc.ForgetSpeech]:
        """Moshi's words withheld after a cancel were never heard: they leave the back-end's history."""
        return [sc.ForgetSpeech(start, end) for start, end in self.assistant.take_unheard()]

    def event(self, event: pe.PipelineEvent) -> list[Outgoing]:
        return self._out(self._map(event))

    def _user_item(self, utterance: int) -> None:
        turn = self.users.turns.get(utterance)
        if turn is not None and turn.item_id not in self._utterances:
            self._utterances[turn.item_id] = utterance
            while len(self._utterances) > 256:
                self._utterances.pop(next(iter(self._utterances)))

    def _map(self, event: pe.PipelineEvent) -> list[Event]:
        if isinstance(event, pe.UserTurnCommitted):
            return self._turn_committed(event)
        if isinstance(event, (pe.SpeechStarted, pe.UserPartial, pe.SpeechStopped, pe.UserFinal)):
            if self.settings.client_turns:  # only a commit ends a turn: no VAD events, no user items of the ASR's
                if isinstance(event, pe.UserPartial):
                    return [ev.transcription_partial("", event.text, event.stable, event.latency_s)]
                return []
            return self._map_user(event)
        if isinstance(event, pe.AnswerCancelled):
            # a client's response.cancel was answered when it came; the user's speech cancels here
            return self.assistant.cancel(event.reason) if event.reason == "turn_detected" else []
        if isinstance(event, pe.AsrFailed):
            message = ev.client_safe(event.message or "speech recognition failed")
            return self.users.failed(message) + [{"type": "kame.asr.error", "message": message}]
        if isinstance(event, pe.FunctionCallRequested):
            # an output item of the response in progress (a response of its own if none), which then ends
            return self.assistant.function_call(event.call_id, event.tool, event.arguments)
        mapped = ev.kame_event(event)
        return [mapped] if mapped is not None else []

    def _map_user(self, event: pe.SpeechStarted | pe.UserPartial | pe.SpeechStopped | pe.UserFinal) -> list[Event]:
        if isinstance(event, pe.UserFinal):
            out = self.users.speech_started(event.utterance, event.audio_s)  # opens the turn if never announced
            self._user_item(event.utterance)
            return self._released_on_commit(out + self.users.final(event.utterance, event.audio_s, event.text))
        if isinstance(event, pe.SpeechStarted):
            out = self.users.speech_started(event.utterance, event.audio_s)
        elif isinstance(event, pe.UserPartial):
            out = self.users.partial(event.utterance, event.audio_s, event.text, event.stable, event.latency_s)
        else:
            out = self.users.speech_stopped(event.utterance, event.audio_s)
            if not self.assistant.requested_open:  # Moshi's next words are a new response
                out += self.assistant.close("completed")
        self._user_item(event.utterance)
        return self._released_on_commit(out)

    def _released_on_commit(self, out: list[Event]) -> list[Event]:
        """A user turn committed by the server's turn detection ends what a cancel withheld when the server
        answers it (``create_response``): the committed turn gets its response (docs/protocol.md 3.7)."""
        if self.settings.create_response and any(e["type"] == "input_audio_buffer.committed" for e in out):
            self.assistant.release()
        return out

    def expiring(self, seconds_left: float) -> list[Outgoing]:
        return self._out([{"type": "kame.session.ending", "reason": "max_duration", "seconds_left": round(seconds_left, 1)}])

    def draining(self, seconds_left: float) -> list[Outgoing]:
        return self._out([{"type": "kame.session.ending", "reason": "draining", "seconds_left": round(seconds_left, 1)}])

    # -- resume (server/runtime/resume.py): only to a client that asked for kame's events
    @property
    def resume_offered(self) -> bool:
        return self.kame_events

    def resumable(self, handle: str, expires_in_s: float) -> list[Outgoing]:
        return self._out([{"type": "kame.session.resumable", "handle": handle, "expires_in_s": round(expires_in_s, 1)}])

    def resumed(self, info: dict[str, object]) -> list[Outgoing]:
        return self._out([{"type": "kame.session.resumed", **info, "session_id": f"sess_{self.info.session_id}"}])

    def ending_with_handle(self, reason: str, seconds_left: float, handle: str) -> list[Outgoing]:
        return self._out([{"type": "kame.session.ending", "reason": reason, "seconds_left": round(seconds_left, 1),
                           "handle": handle}])

    def closing(self, end: SessionEnd) -> list[Outgoing]:
        events: list[Event] = []
        if end.label != "slow_client":
            events += self.assistant.close("incomplete")
        if end.error:
            events.append(ev.error_event(end.error_code, end.error, error_type=end.error_type))
        return self._out(events)


def kame_events_query(value: str | None) -> bool:
    """``?kame_events=1`` (``true``, ``yes``, ``on``): the session sends ``kame.*`` events from the start."""
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


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
    voices: list[str] | None = None,
    default_voice: str | None = None,
    personas: bool = False,
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
        default_echo_guard=cfg.asr.echo_guard.enabled,
        voices=tuple(voices or ()),
        default_voice=default_voice,
        personas=personas,
    )
