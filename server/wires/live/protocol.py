"""One Live session's protocol state: client messages and pipeline events in, typed outputs out. No I/O.

:class:`LiveProtocol` is everything ``/v1/live/sessions`` adds on top of the
session runtime. The runtime owns the socket, the pipeline, the clock and
the tasks; it calls

- :meth:`LiveProtocol.message` for each client message: the result says which
  events to send, which 24 kHz frames to feed, which oracle answers to
  reset the oracle with, which settings changed, and whether the client
  asked to close;
- :meth:`speech_started`, :meth:`partial`, :meth:`final` for the
  recogniser's progress: user transcript fragments and delegations, always
  in that order (the words up to a delegation are sent before it);
- :meth:`assistant_frame` for each engine output frame: its audio in the
  session's format and Moshi's text piece as an assistant fragment;
- :meth:`tick` now and then: usage reports and speculative delegations the
  rate limit held back;
- :meth:`ending` once: the last events (an ``info`` with kame's reason, then
  ``session.closed`` with usage).

Nothing here waits, reads a clock or touches the network: ``now`` is passed
in, so every rule is tested without a server.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.audio.media import FRAME_SIZE
from kame.server.wires.ids import Ids
from kame.server.wires.live.audio import LiveAudioIn, LiveAudioOut
from kame.server.wires.live.commentary import (
    OracleAnswer,
    check_length,
)
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
    Appended,
    AppendKind,
    DelegationCreated,
    Info,
    InputAudioMuted,
    InputAudioUnmuted,
    KameEvent,
    LiveError,
    LiveEvent,
    OutputAudioDelta,
    SessionStarted,
    SessionUpdated,
)
from kame.server.wires.live.responses_mode import ResponsesPort, use_responses
from kame.server.wires.live.transcript import (
    FRAME_MS,
    AssistantTranscript,
    UserTranscript,
)
from kame.server.wires.live.usage import UsageClock, closing_events
from kame.session.commands import CommandRefused
from kame.session.delegated_answers import ContextItem, Delegated, DelegatedAnswers, OpenAnswers
from kame.session.responses.source import ResponsesAnswerSource


@dataclass
class WireOut:
    """What one client message asks of the runtime."""

    events: list[LiveEvent] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    answers: list[OracleAnswer] = field(default_factory=list)
    settings: KameLiveSettings | None = None  #: the kame settings after a change
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
        answers: OpenAnswers,
        ids: Ids | None = None,
        frame_size: int = FRAME_SIZE,
        responses: ResponsesPort | None = None,
    ) -> None:
        """``answers``: how this protocol asks the session for its delegated answers (the session builds them, with
        its tokenizer and oracle settings; on a server the pipeline's, through the runtime's ``WireIO``);
        ``responses``: how Responses delegation reaches the session side (needed when ``info.responses`` is set)."""
        self.info = info
        self.open_answers = answers
        self.ids = ids or Ids(info.session_id[:8])
        self.frame_size = frame_size
        self.config: LiveConfig | None = None
        self.muted = False
        self.audio_in: LiveAudioIn | None = None
        self.audio_out: LiveAudioOut | None = None
        self.user = UserTranscript()
        self.assistant = AssistantTranscript()
        #: Who answers and when kame delegates: the session's, asked for at ``session.start`` (this protocol only
        #: translates; it builds no answer source).
        self.answers: DelegatedAnswers | None = None
        self.usage: UsageClock | None = None
        self.responses_port = responses
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

    @property
    def responses(self) -> ResponsesAnswerSource | None:
        """The Responses answer source, when the session uses Responses delegation."""
        return self.answers.responses if self.answers is not None else None

    @property
    def context(self) -> Sequence[ContextItem]:
        """What the client appended, kept as context (the session's)."""
        return self.answers.context if self.answers is not None else ()

    @property
    def _answers(self) -> DelegatedAnswers:
        """The session's delegated answers, once ``session.start`` asked for them."""
        assert self.answers is not None, "the session's answers are asked for at session.start"
        return self.answers

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
                self._append(command, out)
            elif isinstance(command, Mute):
                self.muted = command.muted
                out.events.append(InputAudioMuted(command.event_id) if command.muted else InputAudioUnmuted(command.event_id))
            elif isinstance(command, Update):
                self._update(command, out)
            elif isinstance(command, Close):
                out.close = command
            elif isinstance(command, (ItemCreate, ResponseCreate)):
                self._responses_command(command, out)
        except CommandRefused as refused:  # the session's refusal, as this protocol's error
            exc = LiveError(refused.code, refused.message, param=refused.param,
                            client_event_id=getattr(command, "event_id", None))
            out.errors.append(exc)
            out.events.append(exc.event())
        except LiveError as exc:
            out.errors.append(exc)
            out.events.append(exc.event())
        return out

    def _start(self, command: Start, now: float, out: WireOut) -> None:
        if self.started:
            raise LiveError("session_already_started", "session.start was already accepted; use session.update",
                            param="type", client_event_id=command.event_id)
        parsed = parse_start(command.session, self.info, event_id=command.event_id)
        if self.answers is None:  # the session's (a refused start asked for none)
            self.answers = self.open_answers(self.info.default_delegation, self.info.default_backchannel_words,
                                             self.ids.delegation)
        answers = self.answers
        self.config = parsed.config
        self._apply_kame(parsed.config)
        self.audio_in = LiveAudioIn(parsed.config.audio, self.frame_size)
        self.audio_out = LiveAudioOut(parsed.config.audio)
        self.usage = UsageClock(now, self.info.usage_interval_s)
        self.started_at = now
        for item in parsed.config.history:
            role: AppendKind = "instructions" if item.role == "developer" else "thinking"
            answers.keep(ContextItem(role, f"{item.role}: {item.text}", None, 0))
        if parsed.config.instructions:
            answers.keep(ContextItem("instructions", parsed.config.instructions, None, 0))
        if parsed.config.responses is not None:
            if self.responses_port is None:
                raise RuntimeError("Responses delegation offered without a way to the session side")
            answers.responses = self.responses_port.use(use_responses(
                self._responses_settings,
                self.responses_port,
                judge=answers.judge,
                encode=answers.encode,
                oracle_config=answers.oracle_config,
                history=[(h.role, h.text) for h in parsed.config.history],
            ))
        out.events.append(SessionStarted(self.session(), command.event_id))
        out.events.extend(parsed.infos)
        out.settings = parsed.config.kame
        answers.started = True
        out.started = True

    def _update(self, command: Update, out: WireOut) -> None:
        assert self.config is not None
        parsed = parse_update(command.session, self.config, self.info, event_id=command.event_id)
        changed = parsed.config.kame != self.config.kame
        self.config = parsed.config
        self._apply_kame(parsed.config)
        out.events.append(SessionUpdated(self.session(), command.event_id))
        out.events.extend(parsed.infos)
        if changed:
            out.settings = parsed.config.kame

    def _responses_settings(self) -> Any:
        assert self.config is not None and self.config.responses is not None
        return self.config.responses

    def _responses_command(self, command: ItemCreate | ResponseCreate, out: WireOut) -> None:
        etype = "response.item.create" if isinstance(command, ItemCreate) else "response.create"
        if self.responses is None:
            raise LiveError("unsupported_event", f"{etype} is not supported: {NEEDS_RESPONSES}", param="type",
                            client_event_id=command.event_id)
        if isinstance(command, ItemCreate):
            self._answers.item_create(command.item)
            return
        opened = self._answers.requested(self.timeline_ms)
        if opened is not None:
            out.events.append(delegation_created(opened, command.event_id))

    def _apply_kame(self, config: LiveConfig) -> None:
        self._answers.configure(config.delegation_mode(self.info), config.backchannel_words(self.info))

    def _append(self, command: AppendContext, out: WireOut) -> None:
        check_length(command.content, command.kind, command.event_id)
        result = self._answers.append(command.kind, command.content, command.delegation_id, self.timeline_ms)
        if result.answer is not None:
            out.answers.append(result.answer)
        out.events.append(Appended(command.kind, result.at_ms, result.end_ms, command.event_id))
        if result.unspoken == "superseded":
            out.events.append(Info(
                "delegation_superseded",
                f"commentary for delegation {str(command.delegation_id)[:48]} is kept as context but not spoken: "
                "the user has spoken since (more than a backchannel) and a newer delegation is open",
                client_event_id=command.event_id))
        elif result.unspoken == "nothing_to_speak":
            out.events.append(Info("nothing_to_speak", "the commentary has no speakable words; kept as context",
                                   client_event_id=command.event_id))

    # ------------------------------------------------------------------ recogniser
    def speech_started(self, utterance: int, audio_s: float) -> list[LiveEvent]:
        self.user.speech_started(utterance, audio_s)
        if self.answers is not None:
            self.answers.speech_started(utterance)
        return []

    def partial(self, utterance: int, audio_s: float, stable: str, now: float, *, text: str | None = None,
                latency_s: float | None = None) -> list[LiveEvent]:
        """A partial hypothesis: its stable words as fragments (then maybe a delegation); with ``text``
        also ``kame.input_transcript.partial`` (the whole, still unstable, hypothesis)."""
        out: list[LiveEvent] = []
        if text is not None:
            out.append(KameEvent("kame.input_transcript.partial", {
                "text": text, "stable": stable, "latency_s": None if latency_s is None else round(latency_s, 3)}))
        delta = self.user.stable(utterance, stable, audio_s)
        if delta is not None:
            out.append(delta)
            if self.answers is not None:
                self._delegated(self.answers.stable(now, utterance, stable, self.timeline_ms), out)
        return out

    def final(self, utterance: int, audio_s: float, text: str, now: float) -> list[LiveEvent]:
        out: list[LiveEvent] = []
        delta = self.user.final(utterance, text, audio_s)
        if delta is not None:
            out.append(delta)
        if self.answers is not None:
            self._delegated(self.answers.final(now, utterance, text, self.timeline_ms), out)
        return out

    @staticmethod
    def _delegated(opened: Delegated | None, out: list[LiveEvent]) -> None:
        if opened is not None:
            out.append(delegation_created(opened))

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
        self._delegated(self._answers.poll(now, self.timeline_ms), out)
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


def delegation_created(opened: Delegated, client_event_id: str | None = None) -> DelegationCreated:
    """``session.delegation.created`` of a delegation the session opened."""
    if opened.response_id is not None:
        return DelegationCreated(opened.delegation_id, opened.offset_ms, client_event_id, target="responses",
                                 response_id=opened.response_id)
    return DelegationCreated(opened.delegation_id, opened.offset_ms, client_event_id)
