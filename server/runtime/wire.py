"""What a wire is: the pure half of a websocket protocol, and the typed commands it hands the runtime.

A wire decodes each client message into :data:`Command` objects and encodes
pipeline events into :class:`Outgoing` messages. It keeps protocol state
(ids, open responses, codec state) but does no I/O, owns no task and never
touches the pipeline: :class:`~kame.server.runtime.session.SessionRuntime`
does all of that, once, for every wire. Adding a protocol = one module
implementing :class:`Wire` plus a :class:`~kame.server.runtime.route.WireRoute`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kame.server.runtime.end import SessionEnd
from kame.session.commands import CommandRefused, ConversationCommand
from kame.session.events import AssistantFrame, PipelineEvent
from kame.session.settings import SessionSettings

if TYPE_CHECKING:
    from starlette.types import Message


#: A transport's mark on a client message that came over a channel the client's page holds (a WebRTC
#: call's data channel, untrusted), as opposed to a trusted server's sideband: ``message[FROM_CHANNEL]``.
FROM_CHANNEL = "kame_from_channel"


@dataclass(frozen=True)
class Outgoing:
    """One message to the client: ``bytes`` go as a binary frame, ``str`` as a text frame (on WebRTC: a data
    channel message).

    ``audio_index``: the output frame it carries (audio may be dropped for a client that lags, and
    its lateness is measured); ``droppable``: a non-audio message that may be dropped too (Moshi's text
    pieces) rather than count against the client.
    """

    data: bytes | str
    audio_index: int | None = None
    droppable: bool = False
    #: Output audio for a transport that carries it itself (WebRTC's RTP track): float32 mono PCM at
    #: 24 kHz; ``data`` is then empty. A websocket wire never sets it (its audio is inside ``data``).
    pcm: np.ndarray | None = field(default=None, compare=False)
    #: The transport drops the output audio it still holds before playing what follows
    #: (``output_audio_buffer.clear``).
    clear_audio: bool = False


@dataclass(frozen=True)
class AudioIn:
    """User audio: 80 ms float32 frames (possibly none: the message still counts as audio activity)."""

    frames: list[np.ndarray]
    event_id: str | None = None


@dataclass(frozen=True)
class SettingsIn:
    """The client's new settings (validated as a whole); ``ignored`` names what had no meaning here."""

    settings: SessionSettings
    event_id: str | None = None
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResetIn:
    """Fresh model state and transcript on the same socket and settings."""

    event_id: str | None = None


@dataclass(frozen=True)
class FunctionOutputIn:
    """The client's output of a function call it was asked to run."""

    call_id: str
    output: str
    event_id: str | None = None
    item_id: str | None = None
    previous_item_id: str | None = None


@dataclass(frozen=True)
class Reply:
    """Messages to send back (nothing else happens)."""

    messages: Sequence[Outgoing]


@dataclass(frozen=True)
class Fault:
    """A client message the wire refused: counted as ``kame_protocol_errors_total{kind}`` (and, with
    ``code``, as a per-protocol client error); ``end`` ends the session, else ``reply`` is sent."""

    kind: str
    message: str
    code: str | None = None
    reply: Sequence[Outgoing] = field(default_factory=tuple)
    end: SessionEnd | None = None


@dataclass(frozen=True)
class EndIn:
    """The client asked to end the session (Live ``session.close``)."""

    end: SessionEnd


@dataclass(frozen=True)
class Ignored:
    """A message that asks for nothing (logged at debug level)."""

    what: str


Command = AudioIn | SettingsIn | ResetIn | FunctionOutputIn | Reply | Fault | EndIn | Ignored | ConversationCommand
"""What a wire hands the runtime. A change to the conversation or to who answers is the session's own command
(:mod:`kame.session.commands`), passed to the pipeline as the wire decoded it, not wrapped: a client message is
typed twice at most (the wire's decoded event, then this command). A client's answer (Live
``session.commentary.append``, :class:`~kame.session.commands.AppendAnswer`) is applied at once; a commit or a
clear of the user's turn after the audio sent before it. The events a command gives at once go back through
:meth:`Wire.event`; a command the session refuses, through :meth:`Wire.command_refused`."""


class Wire:
    """One session's protocol state. Every method is pure: it returns what to do or to send.

    The base class answers everything with nothing (``[]``): a wire overrides what its protocol has a
    message for, and only that (Moshi's protocol has no settings, functions or resets).
    """

    #: Metrics label and log field (``chat``, ``realtime``, ...).
    protocol: str
    #: Client messages in one second beyond which the runtime closes the session (1008); None: no limit.
    max_messages_per_s: int | None = None
    #: Refused client events (:class:`Fault` with a ``code``) after which the runtime closes instead of
    #: answering (1008); None: no budget. Both counted by :mod:`kame.server.runtime.client_limits`.
    max_client_errors: int | None = None

    def opening(self, settings: SessionSettings) -> list[Outgoing]:
        """What the client gets once its pipeline is ready (handshake, ``session.created``)."""
        return []

    def decode(self, message: Message, now: float) -> list[Command]:
        """One websocket message (``websocket.receive``) -> commands."""
        return []

    def transport_audio(self, audio: AudioIn) -> AudioIn:
        """User audio the transport carried itself (WebRTC's RTP), before the runtime takes it: a wire whose
        protocol can mute the microphone (Live's ``input_audio.mute``) silences it here."""
        return audio

    def frame(self, frame: AssistantFrame, index: int, send_audio: bool) -> Sequence[Outgoing | ConversationCommand]:
        """An output frame (``index`` counts every frame of the session); with ``send_audio`` False its
        audio is dropped (the client lags) but its text and the protocol's lifecycle go on. A session command
        among the messages goes to the pipeline (Realtime: the words of audio withheld after a cancel leave the
        back-end's history)."""
        return []

    def event(self, event: PipelineEvent) -> list[Outgoing]:
        """Any other pipeline event."""
        return []

    def settings_applied(self, settings: SessionSettings, command: SettingsIn) -> list[Outgoing]:
        """The pipeline took new settings."""
        return []

    def settings_rejected(self, message: str, command: SettingsIn) -> list[Command]:
        """The pipeline refused new settings (e.g. a back-end that went away); nothing changed."""
        return []

    def function_output_accepted(self, command: FunctionOutputIn) -> list[Outgoing]:
        """The pipeline took a function's output (it was waiting for it)."""
        return []

    def function_output_rejected(self, message: str, command: FunctionOutputIn) -> list[Command]:
        """No call waits for that output (unknown, answered, or timed out)."""
        return []

    def command_refused(self, refused: CommandRefused, command: ConversationCommand) -> Fault | None:
        """The session refused a command this wire decoded (e.g. an append for a delegation id it never opened),
        as this protocol's error; None: only logged."""
        return None

    def client_error(self, code: str, message: str, event_id: str | None) -> Fault | None:
        """A refusal the runtime makes itself (audio sent too far ahead of real time), as this protocol's
        error: a :class:`Fault` whose reply is the protocol's ``error`` event; None where the protocol has
        no error event (Moshi's)."""
        return None

    def reset_starting(self) -> list[Outgoing]:
        """Before a reset: close what is open."""
        return []

    def reset_done(self) -> list[Outgoing]:
        """After a reset: the new conversation begins."""
        return []

    def expiring(self, seconds_left: float) -> list[Outgoing]:
        """The session reaches its maximum duration in ``seconds_left``."""
        return []

    def draining(self, seconds_left: float) -> list[Outgoing]:
        """The server drains: the session has ``seconds_left`` before it is closed (1001)."""
        return []

    def closing(self, end: SessionEnd) -> list[Outgoing]:
        """Last messages before the close frame (not sent when the client is gone)."""
        return []
