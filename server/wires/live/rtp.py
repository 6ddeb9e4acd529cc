"""The Live wire on a WebRTC session: the same events on the ``oai-events`` data channel, audio as RTP. No I/O.

OpenAI's Live WebRTC sessions (``POST /v1/live/sessions`` with a ``webrtc``
transport) carry the websocket's JSON events without
``session.output_audio.delta`` (the assistant's voice is the RTP track) and
without ``session.input_audio.append`` (the microphone is the peer's track:
an append is refused). The session is started by the create request itself:
``session.started`` arrives on the channel, and a ``session.start`` sent
there is refused like a second one on a websocket. What the page may send
and receive is bounded by ``client.data_channel`` (:mod:`.channel`); a
sideband's events are not. ``session.input_audio.mute`` silences the RTP
input on the server's clock. Everything else is
:class:`~kame.server.wires.live.wire.LiveWire` unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kame.server.runtime.wire import FROM_CHANNEL, AudioIn, Command, Outgoing, SettingsIn
from kame.server.wires.live.channel import ChannelPermissions, refused_client_event
from kame.server.wires.live.events import LiveError
from kame.server.wires.live.wire import LiveWire
from kame.server.wires.peek import peek
from kame.session import events as pe
from kame.session.settings import SessionSettings

if TYPE_CHECKING:
    from starlette.types import Message

_APPEND = "session.input_audio.append"


class LiveRtpWire(LiveWire):
    """:class:`LiveWire` whose audio is the call's RTP, and whose page is bounded by ``permissions``."""

    def __init__(self, *args: Any, permissions: ChannelPermissions | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.permissions = permissions or ChannelPermissions()
        self._noticed = False

    # ------------------------------------------------------------------ client -> server
    def decode(self, message: Message, now: float) -> list[Command]:
        text = message.get("text")
        payload = text if text is not None else message.get("bytes")
        restricted = message.get(FROM_CHANNEL) and self.permissions.client is not None
        if restricted or (isinstance(text, str) and _APPEND in text):
            etype, event_id = peek(payload)
            refused = refused_client_event(self.permissions, etype, event_id) if restricted and etype else None
            if refused is None and etype == _APPEND:
                refused = LiveError("unsupported_event",
                                    f"{_APPEND} is not used on a WebRTC session: the microphone's audio travels as RTP",
                                    param="type", client_event_id=event_id)
            if refused is not None:
                return [self._client_error(refused)]
        return super().decode(message, now)

    def transport_audio(self, audio: AudioIn) -> AudioIn:
        if not self.live.muted:
            return audio
        return AudioIn([np.zeros_like(f) for f in audio.frames], audio.event_id)

    def settings_applied(self, settings: SessionSettings, command: SettingsIn) -> list[Outgoing]:
        out = super().settings_applied(settings, command)
        if not self._noticed and self.live.started and not self.permissions.unrestricted:
            self._noticed = True  # after session.started: the page learns what its channel may carry
            out += self._out([self.permissions.notice()])
        return out

    # ------------------------------------------------------------------ server -> client
    def frame(self, frame: pe.AssistantFrame, index: int, send_audio: bool) -> list[Outgoing]:
        self._now = max(self._now, frame.t)
        if not self.live.started:
            return []
        events = self.live.assistant_frame(frame.pcm, frame.piece, index, send_audio=False)
        events += self.live.tick(self._now)
        out = self._out(events)
        if send_audio:
            out.insert(0, Outgoing("", audio_index=index, pcm=frame.pcm))
        return out
