"""The ``/v1/live/sessions`` wire over the session runtime. No I/O.

:class:`LiveWire` is the Live API's :class:`~kame.server.runtime.wire.Wire`: it hands client messages
and pipeline events to :class:`~kame.server.wires.live.protocol.LiveProtocol` and turns what that
returns into the runtime's commands (``AudioIn``, ``SettingsIn``, the session's ``AppendAnswer``,
``DeliverItem``, ``Delegate``, ``EndIn``) and messages; refused commands become a ``Fault`` with an
``error`` (persistent offenders and floods are closed as on ``/v1/realtime``). The event mapping:
docs/protocol.md.

The pipeline here asks no LLM (``SessionSettings.llm`` is False): its settings' ``delegation`` makes the
session's answer source client or Responses delegation (:mod:`kame.session.answer_source`), and the
wire encodes the events that source reports. The wire builds no answer source and starts nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette import status

from kame.audio.media import FRAME_SIZE
from kame.redaction import client_safe
from kame.server.runtime.client_limits import MAX_CLIENT_ERRORS, MAX_MESSAGES_PER_S
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.wire import (
    AudioIn,
    Command,
    EndIn,
    Fault,
    Outgoing,
    Reply,
    SettingsIn,
    Wire,
)
from kame.server.wires.ids import Ids
from kame.server.wires.live import decode
from kame.server.wires.live.config import KameLiveSettings, LiveServerInfo
from kame.server.wires.live.decode import AppendContext, ItemCreate, ResponseCreate
from kame.server.wires.live.events import (
    Appended,
    ErrorEvent,
    Info,
    KameEvent,
    LiveEncoder,
    LiveError,
    LiveEvent,
    OutputAudioDelta,
    ResponseEventOut,
    SessionStarted,
    SessionUpdated,
)
from kame.server.wires.live.protocol import LiveProtocol
from kame.session import events as pe
from kame.session.commands import AppendAnswer, CommandRefused, ConversationCommand, Delegate, DeliverItem
from kame.session.responses.backend import BackendCatalog
from kame.session.settings import SessionSettings

if TYPE_CHECKING:
    from starlette.types import Message

decode.warm_up()  # the SDK validators are built when the server starts, not during a session

PROTOCOL = "live"
PATH = "/v1/live/sessions"
#: The accepted ``session.start``/``session.update`` messages kept to rebuild a session on another replica
#: (beyond these, or this many characters, the session resumes on its own replica only).
MAX_CONFIG_MESSAGES = 32
MAX_CONFIG_CHARS = 256_000


def live_settings(base: SessionSettings, kame: KameLiveSettings) -> SessionSettings:
    """The session settings a Live session runs with: no LLM, the extension's sampling and recording."""
    return replace(base, llm=False, text_temperature=kame.text_temperature, text_topk=kame.text_topk,
                   record=kame.record, echo_guard=base.echo_guard if kame.echo_guard is None else kame.echo_guard)


class LiveWire(Wire):
    """One ``/v1/live/sessions`` session's protocol state, as the runtime sees it."""

    protocol = PROTOCOL
    max_messages_per_s = MAX_MESSAGES_PER_S
    max_client_errors = MAX_CLIENT_ERRORS

    def __init__(self, info: LiveServerInfo, settings: SessionSettings, *, frame_size: int = FRAME_SIZE,
                 responses: BackendCatalog | None = None, kame_events: bool = False) -> None:
        """``responses``: offer Responses delegation on these back-ends (the session's pipeline runs it);
        ``kame_events``: the client opted into kame's resume messages (``?kame_events=1``)."""
        self.settings = settings
        self.kame_events = kame_events
        #: The accepted config messages, in order (what :meth:`restore` replays on another replica).
        self.config_messages: list[str] = []
        if responses is not None:
            info = replace(info, responses=responses)
        self.live = LiveProtocol(info, ids=Ids(info.session_id[:8]), frame_size=frame_size)
        self.encoder = LiveEncoder(self.live.ids)
        self._now = 0.0
        self._held: list[LiveEvent] = []  # session.started/updated (+ infos) until the pipeline took the settings
        self._close_event_id: str | None = None

    def _out(self, events: Sequence[LiveEvent], index: int | None = None) -> list[Outgoing]:
        return [Outgoing(self.encoder.encode(e), audio_index=index if isinstance(e, OutputAudioDelta) else None)
                for e in events]

    # ------------------------------------------------------------------ client -> server
    def opening(self, settings: SessionSettings) -> list[Outgoing]:
        if self.live.started:  # a resumed connection: the session as it stands (no second session.start)
            return self._out([SessionStarted(self.live.session())])
        return []  # the client speaks first: session.start

    def decode(self, message: Message, now: float) -> list[Command]:
        self._now = max(self._now, now)
        text = message.get("text")
        payload: str | bytes | None = text if text is not None else message.get("bytes")
        out = self.live.message(payload, now)
        commands: list[Command] = []
        events = [e for e in out.events if not isinstance(e, ErrorEvent)]
        if not out.errors and any(isinstance(e, (SessionStarted, SessionUpdated)) for e in events):
            raw = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
            self.config_messages.append(raw or "")
        if out.settings is not None:  # started or updated: answered once the pipeline took the settings
            self._held += events
            events = []
            settings = replace(live_settings(self.settings, out.settings), delegation=self.live.delegation())
            config = self.live.config
            if out.started and config is not None:  # voice and persona: chosen at session.start only
                persona = config.instructions if self.live.info.personas else settings.instructions
                settings = replace(settings, voice=config.voice, instructions=persona)
            commands.append(SettingsIn(settings))
        if events:
            commands.append(Reply(self._out(events)))
        for refused in out.errors:
            commands.append(self._client_error(refused))
        if out.audio:
            commands.append(AudioIn(out.frames))
        for ask in out.asks:
            commands.append(session_command(self.live, ask, now))
        if out.close is not None:
            self._close_event_id = out.close.event_id
            commands.append(EndIn(SessionEnd("close_requested", status.WS_1000_NORMAL_CLOSURE, "session closed by the client")))
        return commands

    def command_refused(self, refused: CommandRefused, command: ConversationCommand) -> Fault:
        event_id = getattr(command, "event_id", None)
        return self._client_error(LiveError(refused.code, refused.message, param=refused.param,
                                            client_event_id=event_id))

    def _client_error(self, exc: LiveError) -> Fault:
        return Fault(kind="live", message=exc.message, code=exc.code, reply=self._out([exc.event()]))

    def settings_applied(self, settings: SessionSettings, command: SettingsIn) -> list[Outgoing]:
        self.settings = settings
        held, self._held = self._held, []
        return self._out(held)

    def settings_rejected(self, message: str, command: SettingsIn) -> list[Command]:
        held, self._held = self._held, []
        commands: list[Command] = []
        started = [e for e in held if isinstance(e, SessionStarted)]
        if started:  # the session is started all the same (with the server's sampling)
            commands.append(Reply(self._out(started)))
        ids = [e.client_event_id for e in held if isinstance(e, (SessionStarted, SessionUpdated))]
        error = LiveError("invalid_value", f"session.kame: {message[:200]}", param="session.kame",
                          client_event_id=ids[0] if ids else None)
        commands.append(self._client_error(error))
        return commands

    def client_error(self, code: str, message: str, event_id: str | None) -> Fault:
        return self._client_error(LiveError(code, message, client_event_id=event_id))

    # ------------------------------------------------------------------ server -> client
    def frame(self, frame: pe.AssistantFrame, index: int, send_audio: bool) -> list[Outgoing]:
        self._now = max(self._now, frame.t)
        if not self.live.started:
            return []  # before session.start the format is unknown: nothing to send yet
        events = self.live.assistant_frame(frame.pcm, frame.piece, index, send_audio=send_audio)
        events += self.live.tick(self._now)
        return self._out(events, index)

    def event(self, event: pe.PipelineEvent) -> list[Outgoing]:
        self._now = max(self._now, event.t)
        if not self.live.started:
            return []
        return self._out(self._map(event))

    def _map(self, event: pe.PipelineEvent) -> list[LiveEvent]:
        return live_events(self.live, event)

    def expiring(self, seconds_left: float) -> list[Outgoing]:
        if not self.live.started:
            return []
        return self._out([KameEvent("kame.session.ending", {"reason": "max_duration",
                                                            "seconds_left": round(seconds_left, 1)})])

    def draining(self, seconds_left: float) -> list[Outgoing]:
        if not self.live.started:
            return []
        return self._out([KameEvent("kame.session.ending", {"reason": "draining",
                                                            "seconds_left": round(seconds_left, 1)})])

    # -- resume (server/runtime/resume.py): only to a client that opted in, once its session started
    @property
    def movable(self) -> bool:
        """Whether another replica can rebuild this session from :meth:`resume_state` (its config history fits)."""
        return (len(self.config_messages) <= MAX_CONFIG_MESSAGES
                and sum(map(len, self.config_messages)) <= MAX_CONFIG_CHARS)

    def resume_state(self) -> dict[str, object]:
        return {"config_messages": list(self.config_messages)}

    def restore(self, state: dict[str, object], settings: SessionSettings, now: float) -> SessionSettings:
        """Rebuild a session handed over by another replica: its config messages replayed (their answers are
        not sent: the resumed connection gets ``session.started`` as it stands); its settings, with the
        delegation the replayed config gives."""
        messages = state.get("config_messages")
        for raw in messages if isinstance(messages, list) else []:
            self.live.message(str(raw), now)
            self.config_messages.append(str(raw))
        self.settings = replace(settings, delegation=self.live.delegation())
        return self.settings

    @property
    def resume_offered(self) -> bool:
        return self.kame_events and self.live.started

    def resumable(self, handle: str, expires_in_s: float) -> list[Outgoing]:
        return self._out([KameEvent("kame.session.resumable", {"handle": handle,
                                                               "expires_in_s": round(expires_in_s, 1)})])

    def resumed(self, info: dict[str, object]) -> list[Outgoing]:
        return self._out([KameEvent("kame.session.resumed", {**info, "session_id": f"live_{self.live.info.session_id}"})])

    def ending_with_handle(self, reason: str, seconds_left: float, handle: str) -> list[Outgoing]:
        return self._out([KameEvent("kame.session.ending", {"reason": reason, "seconds_left": round(seconds_left, 1),
                                                            "handle": handle})])

    def closing(self, end: SessionEnd) -> list[Outgoing]:
        if not self.live.started:  # never started: only an error, if there is one
            if end.error:
                return self._out([ErrorEvent(end.error_code, end.error, error_type=end.error_type)])
            return []
        message = end.error or end.reason or end.label
        return self._out(self.live.ending(end.label, message, self._now, self._close_event_id))


def live_events(live: LiveProtocol, event: pe.PipelineEvent) -> list[LiveEvent]:
    """The Live events of a pipeline event (the user's transcript, the answer source's delegations, kame's extras)."""
    if isinstance(event, pe.SpeechStarted):
        return live.speech_started(event.utterance, event.audio_s)
    if isinstance(event, pe.UserPartial):
        return live.partial(event.utterance, event.audio_s, event.stable, event.t, text=event.text,
                            latency_s=event.latency_s)
    if isinstance(event, pe.UserFinal):
        return live.final(event.utterance, event.audio_s, event.text, event.t)
    if isinstance(event, pe.DelegationOpened):
        return [live.delegation_created(event.delegation_id, event.response_id, event.client_event_id)]
    if isinstance(event, pe.ContextAppended):
        return appended(event)
    if isinstance(event, pe.AnswerSpoken):
        return [KameEvent("kame.oracle.reset", {"delegation_id": event.delegation_id, "text": event.text,
                                                "tokens": event.tokens})]
    if isinstance(event, pe.ResponsesStreamed):
        return [ResponseEventOut(event.event, event.delegation_id)]
    if isinstance(event, pe.SourceNotice):
        return [Info(event.code, event.message)]
    if isinstance(event, pe.SourceProgress):
        return [KameEvent(event.event, event.data)]
    if isinstance(event, pe.AsrFailed):
        return [KameEvent("kame.asr.error", {"message": client_safe(event.message or "speech recognition failed")})]
    if isinstance(event, pe.OracleCleared):
        return [KameEvent("kame.oracle.cleared", {"reason": event.reason})]
    if isinstance(event, pe.EchoJudged):
        return [KameEvent("kame.echo_guard.verdict", {
            "echo": event.echo, "text": event.text, "words": event.words, "matched": event.matched,
            "extra": event.extra, "delay_s": event.delay_s, "audio_s": round(event.audio_s, 3)})]
    return []


def session_command(live: LiveProtocol, ask: AppendContext | ItemCreate | ResponseCreate,
                    now: float) -> ConversationCommand:
    """What the client asked of the session's answer source, as the session's command (an append is placed now on
    the session timeline)."""
    if isinstance(ask, AppendContext):
        return AppendAnswer(ask.kind, ask.content, ask.delegation_id, live.timeline_ms, now, ask.event_id)
    if isinstance(ask, ItemCreate):
        return DeliverItem(ask.item, ask.event_id)
    return Delegate(ask.event_id)


def appended(event: pe.ContextAppended) -> list[LiveEvent]:
    """``session.*.appended`` of a client's append, and why a commentary was not spoken."""
    out: list[LiveEvent] = [Appended(event.kind, event.at_ms, event.end_ms, event.client_event_id)]  # type: ignore[arg-type]
    if event.unspoken == "superseded":
        out.append(Info(
            "delegation_superseded",
            f"commentary for delegation {str(event.delegation_id)[:48]} is kept as context but not spoken: "
            "the user has spoken since (more than a backchannel) and a newer delegation is open",
            client_event_id=event.client_event_id))
    elif event.unspoken == "nothing_to_speak":
        out.append(Info("nothing_to_speak", "the commentary has no speakable words; kept as context",
                        client_event_id=event.client_event_id))
    return out


def refusal(error: str) -> Outgoing:
    """An admission refusal's message on this wire: an ``error`` event before the close."""
    return Outgoing(LiveEncoder(Ids()).encode(ErrorEvent("invalid_value", error)))


def server_info(session_id: str, model: str, cfg: Any, admitted_at: float) -> LiveServerInfo:
    """What ``session.kame.server`` shows (``cfg``: the KameConfig)."""
    return LiveServerInfo(
        session_id=session_id,
        model=model,
        asr=cfg.asr.kind,
        max_duration_s=cfg.server.max_duration_s,
        idle_timeout_s=cfg.server.idle_timeout_s,
        record_available=cfg.server.record_dir is not None,
        default_backchannel_words=getattr(cfg.oracle, "tool_backchannel_words", 3),
        usage_interval_s=cfg.server.live_usage_interval_s,
        admitted_at=admitted_at,
        default_echo_guard=cfg.asr.echo_guard.enabled,
    )
