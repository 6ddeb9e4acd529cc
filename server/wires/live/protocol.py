"""One Live session's protocol state: client messages and pipeline events in, typed outputs out. No I/O.

:class:`LiveProtocol` is everything ``/v1/live/sessions`` adds on top of the
session runtime. The runtime owns the socket, the pipeline, the clock and
the tasks; it calls

- :meth:`LiveProtocol.message` for each client message: the result says which
  events to send, which 24 kHz frames to feed, which oracle answers to
  reset the oracle with, which settings changed, and whether the client
  asked to close;
- :meth:`speech_started`, :meth:`partial`, :meth:`final` for the
  recogniser's progress: user transcript fragments;
- :meth:`delegation_created` for a delegation the session's answer source
  opened: its place on the session timeline is this protocol's;
- :meth:`assistant_frame` for each engine output frame: its audio in the
  session's format and Moshi's text piece as an assistant fragment;
- :meth:`tick` now and then: usage reports;
- :meth:`ending` once: the last events (an ``info`` with kame's reason, then
  ``session.closed`` with usage).

Who answers is the session's (:mod:`kame.session.answer_source`): this
protocol only hands on what the client asked of it. Nothing here waits,
reads a clock or touches the network: ``now`` is passed in.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.audio.media import FRAME_SIZE
from kame.server.wires.ids import Ids
from kame.server.wires.live.audio import LiveAudioIn, LiveAudioOut
from kame.server.wires.live.commentary import check_length
from kame.server.wires.live.config import (
    KameLiveSettings,
    LiveConfig,
    LiveServerInfo,
    parse_start,
    parse_update,
    session_resource,
)
from kame.server.wires.live.decode import (
    NEEDS_RESPONSES,
    AppendAudio,
    AppendContext,
    Close,
    ItemCreate,
    Mute,
    ResponseCreate,
    Start,
    Update,
    decode_client_event,
)
from kame.server.wires.live.events import (
    DelegationCreated,
    InputAudioMuted,
    InputAudioUnmuted,
    KameEvent,
    LiveError,
    LiveEvent,
    OutputAudioDelta,
    SessionStarted,
    SessionUpdated,
)
from kame.server.wires.live.transcript import (
    FRAME_MS,
    AssistantTranscript,
    UserTranscript,
)
from kame.server.wires.live.usage import UsageClock, closing_events
from kame.session.settings import Delegation


@dataclass
class WireOut:
    """What one client message asks of the runtime."""

    events: list[LiveEvent] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    #: What the client asked of the session's answer source (appends; Responses items and requests), in order.
    asks: list[AppendContext | ItemCreate | ResponseCreate] = field(default_factory=list)
    settings: KameLiveSettings | None = None  #: the kame settings after a change (or the delegation's)
    errors: list[LiveError] = field(default_factory=list)
    audio: bool = False  #: the message was audio (activity, even when it completed no frame)
    started: bool = False  #: this message started the session
    close: Close | None = None  #: the client asked to close


class LiveProtocol:
    """The Live protocol of one session (see the module docstring)."""

    def __init__(
        self,
        info: LiveServerInfo,
        *,
        ids: Ids | None = None,
        frame_size: int = FRAME_SIZE,
    ) -> None:
        self.info = info
        self.ids = ids or Ids(info.session_id[:8])
        self.frame_size = frame_size
        self.config: LiveConfig | None = None
        self.muted = False
        self.audio_in: LiveAudioIn | None = None
        self.audio_out: LiveAudioOut | None = None
        self.user = UserTranscript()
        self.assistant = AssistantTranscript()
        self.usage: UsageClock | None = None
        #: What the session started with, kept as its delegation's context: ``(kind, text)``.
        self._context: tuple[tuple[str, str], ...] = ()
        self.steps = 0  #: output frames seen (the session timeline, 80 ms each)
        self.started_at: float | None = None

    # ------------------------------------------------------------------ state
    @property
    def started(self) -> bool:
        return self.config is not None

    @property
    def timeline_ms(self) -> int:
        """Now on the session timeline (never before the last user fragment)."""
        return max(self.steps * FRAME_MS, self.user.last_end_ms)

    def delegation(self) -> Delegation | None:
        """Who answers this session, as its settings say (the session's answer source follows them)."""
        config = self.config
        if config is None:
            return None
        return Delegation(config.delegation_mode(self.info), config.backchannel_words(self.info), config.responses,
                          self._context, tuple((h.role, h.text) for h in config.history), self.ids.prefix)

    def session(self) -> dict[str, Any]:
        assert self.config is not None
        return session_resource(self.config, self.info)

    # ------------------------------------------------------------------ client messages
    def message(self, payload: str | bytes | None, now: float) -> WireOut:
        out = WireOut()
        command: object = None
        try:
            command = decode_client_event(payload)
            if isinstance(command, Start):
                self._start(command, now, out)
            elif not self.started:
                raise LiveError("session_not_started", "send session.start first and wait for session.started",
                                param="type", client_event_id=getattr(command, "event_id", None))
            elif isinstance(command, AppendAudio):
                assert self.audio_in is not None
                out.audio = True
                out.frames = self.audio_in.push(command.audio, muted=self.muted)
            elif isinstance(command, AppendContext):
                check_length(command.content, command.kind, command.event_id)
                out.asks.append(command)
            elif isinstance(command, Mute):
                self.muted = command.muted
                out.events.append(InputAudioMuted(command.event_id) if command.muted else InputAudioUnmuted(command.event_id))
            elif isinstance(command, Update):
                self._update(command, out)
            elif isinstance(command, Close):
                out.close = command
            elif isinstance(command, (ItemCreate, ResponseCreate)):
                self._responses_command(command, out)
        except LiveError as exc:
            out.errors.append(exc)
            out.events.append(exc.event())
        return out

    def _start(self, command: Start, now: float, out: WireOut) -> None:
        if self.started:
            raise LiveError("session_already_started", "session.start was already accepted; use session.update",
                            param="type", client_event_id=command.event_id)
        parsed = parse_start(command.session, self.info, event_id=command.event_id)
        self.config = parsed.config
        self.audio_in = LiveAudioIn(parsed.config.audio, self.frame_size)
        self.audio_out = LiveAudioOut(parsed.config.audio)
        self.usage = UsageClock(now, self.info.usage_interval_s)
        self.started_at = now
        context = [("instructions" if item.role == "developer" else "thinking", f"{item.role}: {item.text}")
                   for item in parsed.config.history]
        if parsed.config.instructions:
            context.append(("instructions", parsed.config.instructions))
        self._context = tuple(context)
        out.events.append(SessionStarted(self.session(), command.event_id))
        out.events.extend(parsed.infos)
        out.settings = parsed.config.kame
        out.started = True

    def _update(self, command: Update, out: WireOut) -> None:
        assert self.config is not None
        parsed = parse_update(command.session, self.config, self.info, event_id=command.event_id)
        before = self.delegation()
        changed = parsed.config.kame != self.config.kame
        self.config = parsed.config
        changed = changed or self.delegation() != before
        out.events.append(SessionUpdated(self.session(), command.event_id))
        out.events.extend(parsed.infos)
        if changed:
            out.settings = parsed.config.kame

    def _responses_command(self, command: ItemCreate | ResponseCreate, out: WireOut) -> None:
        etype = "response.item.create" if isinstance(command, ItemCreate) else "response.create"
        assert self.config is not None
        if self.config.responses is None:
            raise LiveError("unsupported_event", f"{etype} is not supported: {NEEDS_RESPONSES}", param="type",
                            client_event_id=command.event_id)
        out.asks.append(command)

    # ------------------------------------------------------------------ recogniser
    def speech_started(self, utterance: int, audio_s: float) -> list[LiveEvent]:
        self.user.speech_started(utterance, audio_s)
        return []

    def partial(self, utterance: int, audio_s: float, stable: str, now: float, *, text: str | None = None,
                latency_s: float | None = None) -> list[LiveEvent]:
        """A partial hypothesis: its stable words as fragments; with ``text`` also
        ``kame.input_transcript.partial`` (the whole, still unstable, hypothesis)."""
        out: list[LiveEvent] = []
        if text is not None:
            out.append(KameEvent("kame.input_transcript.partial", {
                "text": text, "stable": stable, "latency_s": None if latency_s is None else round(latency_s, 3)}))
        delta = self.user.stable(utterance, stable, audio_s)
        if delta is not None:
            out.append(delta)
        return out

    def final(self, utterance: int, audio_s: float, text: str, now: float) -> list[LiveEvent]:
        delta = self.user.final(utterance, text, audio_s)
        return [] if delta is None else [delta]

    def delegation_created(self, delegation_id: str, response_id: str | None = None,
                           client_event_id: str | None = None) -> DelegationCreated:
        """``session.delegation.created`` of a delegation the session opened, now on the session timeline."""
        if response_id is not None:
            return DelegationCreated(delegation_id, self.timeline_ms, client_event_id, target="responses",
                                     response_id=response_id)
        return DelegationCreated(delegation_id, self.timeline_ms, client_event_id)

    # ------------------------------------------------------------------ engine output
    def assistant_frame(self, pcm: np.ndarray, piece: str | None, step: int, *, send_audio: bool = True) -> list[LiveEvent]:
        """One output frame: its audio (unless the client lags: ``send_audio=False``) and its text piece."""
        assert self.audio_out is not None
        self.steps = max(self.steps, step + 1)
        data = self.audio_out.encode(pcm)  # always encoded: the resampler's stream stays continuous
        out: list[LiveEvent] = []
        if send_audio:
            out.append(OutputAudioDelta(base64.b64encode(data).decode("ascii")))
        if piece:
            delta = self.assistant.piece(piece, step)
            if delta is not None:
                out.append(delta)
        return out

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> list[LiveEvent]:
        out: list[LiveEvent] = []
        if not self.started:
            return out
        if self.usage is not None:
            usage = self.usage.due(now)
            if usage is not None:
                out.append(usage)
        return out

    def ending(self, label: str, message: str, now: float, client_event_id: str | None = None) -> list[LiveEvent]:
        """The session's last events (none before ``session.started`` or when the client is gone)."""
        if not self.started or self.usage is None:
            return []
        return closing_events(label, message, self.session(), self.usage.seconds(now), client_event_id)
