"""The ``/v1/realtime`` wire on a WebRTC call: the same events on the ``oai-events`` data channel, audio as RTP.

OpenAI's WebRTC sessions carry the websocket's JSON events without audio
deltas (the audio is the RTP track), and add the output audio buffer:
``output_audio_buffer.started`` when a response's audio starts,
``output_audio_buffer.stopped`` once it ended, and the client's
``output_audio_buffer.clear``, which withholds the rest of the response's
audio (the RTP track plays silence instead; what the transport still held is
dropped) and answers ``output_audio_buffer.cleared``. Everything else is
:class:`~kame.server.wires.realtime.wire.RealtimeWire` unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kame.server.runtime.wire import Command, Outgoing, Reply
from kame.server.wires.peek import peek
from kame.server.wires.realtime.events import ClientError, Event
from kame.server.wires.realtime.wire import RealtimeWire
from kame.session import events as pe
from kame.session.commands import ConversationCommand

if TYPE_CHECKING:
    from starlette.types import Message

_CLEAR = "output_audio_buffer.clear"
_APPEND = "input_audio_buffer.append"


class RealtimeRtpWire(RealtimeWire):
    """:class:`RealtimeWire` whose output audio goes to the transport's RTP track as PCM."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._audio_responses: set[str] = set()  # responses whose audio started
        self._withheld: str | None = None  # the response output_audio_buffer.clear silenced
        self._last_response: str | None = None

    # ------------------------------------------------------------------ client -> server
    def decode(self, message: Message, now: float) -> list[Command]:
        text = message.get("text")
        if isinstance(text, str) and (_CLEAR in text or _APPEND in text):
            etype, event_id = peek(text)
            if etype == _CLEAR:
                return self._clear(event_id)
            if etype == _APPEND:
                exc = ClientError(
                    "unsupported_event",
                    "input_audio_buffer.append is not used on a WebRTC call: the microphone's audio travels as RTP",
                    param="type", event_id=event_id,
                )
                return [self._client_error(exc)]
        return super().decode(message, now)

    def _clear(self, event_id: str | None) -> list[Command]:
        current = self.assistant.current
        response_id = current.id if current is not None else self._last_response
        if current is not None:
            self._withheld = current.id
        cleared: Event = {"type": "output_audio_buffer.cleared", "response_id": response_id}
        out = self._out([cleared])
        return [Reply([Outgoing(out[0].data, clear_audio=True)])]

    # ------------------------------------------------------------------ server -> client
    def frame(self, frame: pe.AssistantFrame, index: int, send_audio: bool) -> list[Outgoing | ConversationCommand]:
        text = frame.piece
        speaking = self.assistant.speaking(frame.pcm, text)
        current = self.assistant.current
        fed = frame.oracle_id >= 0 and frame.oracle_id != self.vocab.pad_id
        events = self._out(self.assistant.frame(None, speaking=speaking, text=text, step=frame.step, fed=fed))
        forget = self._forget_unheard()
        playing = self.assistant.current or current
        if not send_audio:
            return [*events, *forget]
        pcm = frame.pcm
        if playing is not None and playing.id == self._withheld:
            pcm = np.zeros_like(frame.pcm)
        return [Outgoing("", audio_index=index, pcm=pcm), *events, *forget]

    def _out(self, events: list[Event], index: int | None = None, *, kame: bool = False) -> list[Outgoing]:
        return super()._out(self._with_buffer_events(events), None, kame=kame)

    def _with_buffer_events(self, events: list[Event]) -> list[Event]:
        """``output_audio_buffer.started`` after a response's audio part opens, ``.stopped`` after its
        ``response.done``."""
        out: list[Event] = []
        for e in events:
            out.append(e)
            etype = e.get("type")
            if etype == "response.content_part.added" and e.get("part", {}).get("type") == "audio":
                rid = str(e.get("response_id"))
                self._audio_responses.add(rid)
                self._last_response = rid
                out.append({"type": "output_audio_buffer.started", "response_id": rid})
            elif etype == "response.done":
                rid = str(e.get("response", {}).get("id"))
                if rid in self._audio_responses:
                    self._audio_responses.discard(rid)
                    if self._withheld == rid:
                        self._withheld = None
                    out.append({"type": "output_audio_buffer.stopped", "response_id": rid})
        return out

