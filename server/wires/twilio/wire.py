"""The ``/twilio/media`` wire: Twilio Media Streams over the session runtime. No I/O.

The endpoint (:mod:`.routes`) reads ``connected`` and ``start`` before the
session; this wire takes the call from there. ``media`` is G.711 at 8 kHz,
resampled to the engine's 24 kHz frames (:mod:`kame.server.wires.live.audio`,
through :mod:`kame.audio.pcm`); every output frame goes back as one ``media``
message (80 ms) in the call's law. Responses are delimited as the Realtime
wire delimits them (:class:`~kame.server.wires.realtime.turns.AssistantTurns`):
each one that ends is followed by a ``mark`` named after it, which Twilio
sends back once the caller has heard it; the caller's speech that cancels the
answer (``interrupt_response``, on for calls) sends ``clear`` (then the
cancelled response's mark) and withholds the rest, as a Realtime response
cancelled by ``turn_detected``. A keypad press
joins the conversation as a user message (``dtmf:N``) and is reported to
``on_dtmf`` (the endpoint logs and counts it). ``stop`` ends the session; a
message that is not Twilio's is refused (logged, counted, closed after
:data:`MAX_CLIENT_ERRORS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from starlette import status

from kame.audio.media import FRAME_SIZE
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.wire import AudioIn, Command, EndIn, Fault, Ignored, Outgoing, Wire
from kame.server.wires.live.audio import LiveAudioFormat, LiveAudioIn, LiveAudioOut
from kame.server.wires.realtime.events import Ids
from kame.server.wires.realtime.turns import AssistantTurns, Conversation
from kame.server.wires.twilio import protocol as messages
from kame.session import commands as sc
from kame.session import events as pe
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from starlette.types import Message

PROTOCOL = "twilio"
PATH = "/twilio/media"
#: Twilio sends 50 media messages a second; a client far above that is not Twilio.
MAX_MESSAGES_PER_S = 400
#: Refused messages after which the call is closed (1008): Twilio sends none.
MAX_CLIENT_ERRORS = 20
_AUDIO_EVENTS = frozenset({"response.output_audio.delta", "kame.output_audio.delta"})


class TwilioWire(Wire):
    """One call's stream: its ids, codec state, open responses and the marks Twilio has not played yet."""

    protocol = PROTOCOL
    max_messages_per_s = MAX_MESSAGES_PER_S
    max_client_errors = MAX_CLIENT_ERRORS

    def __init__(self, start: messages.Start, settings: SessionSettings, *, frame_size: int = FRAME_SIZE,
                 vocab: TextVocab = MOSHI_VOCAB, on_dtmf: Callable[[str], None] | None = None) -> None:
        self.start = start
        self.stream_sid = start.stream_sid
        self.settings = settings
        self.vocab = vocab
        fmt = LiveAudioFormat(start.encoding, start.sample_rate)  # type: ignore[arg-type]  # checked by messages.decode
        self._in = LiveAudioIn(fmt, frame_size)
        self._out = LiveAudioOut(fmt)
        self.ids = Ids("tw" + start.stream_sid[-6:])
        self.assistant = AssistantTurns(self.ids, Conversation(), vocab=vocab)
        self.on_dtmf = on_dtmf
        #: marks sent and not yet echoed back, in order
        self.marks_pending: list[str] = []
        self.marks_played = 0
        self.clears = 0
        self.digits = 0
        self._turns_ended: tuple[int, ...] = ()  # the caller's last turns that ended (a final after its stop: once)

    # ------------------------------------------------------------------ Twilio -> kame
    def decode(self, message: Message, now: float) -> list[Command]:
        try:
            msg = messages.decode(message.get("text") if message.get("text") is not None else message.get("bytes"))
        except messages.ProtocolError as exc:
            return [Fault(kind="twilio", message=f"not a Media Streams message: {exc}", code="invalid_message")]
        if isinstance(msg, messages.Media):
            if msg.track not in ("inbound", "inbound_track"):
                return [Ignored(f"media of track {msg.track}")]
            return [AudioIn(self._in.push(msg.payload))]
        if isinstance(msg, messages.Dtmf):
            return self._dtmf(msg.digit)
        if isinstance(msg, messages.Mark):
            if msg.name in self.marks_pending:
                del self.marks_pending[: self.marks_pending.index(msg.name) + 1]
                self.marks_played += 1
                return [Ignored(f"mark {msg.name} played")]
            return [Ignored(f"mark {msg.name[:64]} not ours")]
        if isinstance(msg, messages.Stop):
            return [EndIn(SessionEnd("client_closed", status.WS_1000_NORMAL_CLOSURE, "call ended"))]
        return [Ignored(f"{type(msg).__name__.lower()} again")]

    def _dtmf(self, digit: str) -> list[Command]:
        self.digits += 1
        if self.on_dtmf is not None:
            self.on_dtmf(digit)
        item = sc.ContextItem(f"dtmf:{self.digits}", "user", f"(the caller pressed {digit} on the keypad)")
        return [sc.AddContext(item)]

    # ------------------------------------------------------------------ kame -> Twilio
    def frame(self, frame: pe.AssistantFrame, index: int, send_audio: bool) -> Sequence[Outgoing | sc.ConversationCommand]:
        audio = self._out.encode(frame.pcm)  # always: the resampler's stream stays continuous
        speaking = self.assistant.speaking(frame.pcm, frame.piece)
        fed = frame.oracle_id >= 0 and frame.oracle_id != self.vocab.pad_id
        events = self.assistant.frame("-" if send_audio else None, speaking=speaking, text=frame.piece, step=frame.step,
                                      fed=fed)
        out: list[Outgoing | sc.ConversationCommand] = []
        for e in events:
            kind = e["type"]
            if kind in _AUDIO_EVENTS and audio:
                out.append(Outgoing(messages.media(self.stream_sid, audio), audio_index=index))
            elif kind == "response.done":
                out += self._mark(str(e["response"]["id"]))
        return out + self._forget_unheard()

    def _mark(self, name: str) -> list[Outgoing]:
        self.marks_pending.append(name)
        del self.marks_pending[:-64]  # a client that never echoes marks does not grow this
        return [Outgoing(messages.mark(self.stream_sid, name))]

    def _forget_unheard(self) -> list[sc.ConversationCommand]:
        """What Moshi said after a barge-in was never played: it leaves the back-end's history."""
        return [sc.ForgetSpeech(start, end) for start, end in self.assistant.take_unheard()]

    def event(self, event: pe.PipelineEvent) -> list[Outgoing]:
        if isinstance(event, pe.AnswerCancelled) and event.reason == "turn_detected":
            return self.barge_in()
        if isinstance(event, (pe.SpeechStopped, pe.UserFinal)) and not self.settings.client_turns:
            # the caller's turn is over (its speech stopped, or a final from a recogniser that announces no stop):
            # Moshi's next words are a new response, and the answer to this turn is not withheld (as the Realtime
            # wire does on input_audio_buffer.committed)
            if event.utterance in self._turns_ended:
                return []
            self._turns_ended = (self._turns_ended + (event.utterance,))[-8:]
            closed = self.assistant.close("completed")
            if self.settings.create_response:
                self.assistant.release()
            return [m for e in closed if e["type"] == "response.done" for m in self._mark(str(e["response"]["id"]))]
        return []

    def barge_in(self) -> list[Outgoing]:
        """The caller talks over the assistant: Twilio drops what it still holds (it then echoes the marks that
        were pending), the open response ends (its mark follows the clear) and Moshi's rest is withheld."""
        cancelled = [e for e in self.assistant.cancel("turn_detected") if e["type"] == "response.done"]
        if not cancelled and not self.marks_pending:
            return []
        self.clears += 1
        out = [Outgoing(messages.clear(self.stream_sid))]
        for e in cancelled:  # the cancelled response's mark: Twilio echoes it at once (nothing is left to play)
            out += self._mark(str(e["response"]["id"]))
        return out

    def client_error(self, code: str, message: str, event_id: str | None) -> Fault:
        return Fault(kind="twilio", message=message, code=code)

