"""How a continuous full-duplex session maps onto Realtime responses and items. No I/O.

Moshi emits one output frame per 80 ms whether it speaks or not, and the
ASR reports user turns on its own clock. OpenAI clients expect audio inside
responses whose items were announced first, and user transcripts tied to a
user item. :class:`AssistantTurns` cuts the output stream into responses
(docs/protocol.md 3.4) and :class:`UserTurns` maps ASR turns to user items
(3.5); both only return the events to send, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.audio.loudness import at_least
from kame.server.wires.realtime import events as ev
from kame.server.wires.realtime.events import Event, Ids
from kame.server.wires.realtime.functions import function_call_items
from kame.vocab import MOSHI_VOCAB, TextVocab

#: Level from which an output frame counts as speech.
SPEAKING_DBFS = -40.0
#: Non-speaking frames that end a response (0.8 s).
END_SILENCE_FRAMES = 10
#: Longest response (30 s): a monologue is cut so that transcripts stay bounded.
MAX_RESPONSE_FRAMES = 375
#: How long a requested response waits for Moshi's first words before it ends empty (6 s: the back-end's
#: answer must reach Moshi first).
REQUEST_WAIT_FRAMES = 75
#: Ended audio messages whose steps are kept (for truncate and delete).
MAX_SPOKEN_ITEMS = 64


@dataclass
class Conversation:
    """Order of items in the conversation, for ``previous_item_id``."""

    last_item_id: str | None = None
    _previous: dict[str, str | None] = field(default_factory=dict)

    def add(self, item_id: str) -> str | None:
        previous = self.last_item_id
        self._previous[item_id] = previous
        self.last_item_id = item_id
        return previous

    def previous_of(self, item_id: str) -> str | None:
        return self._previous.get(item_id)

    def forget(self, item_id: str) -> None:
        self._previous.pop(item_id, None)


@dataclass
class _Response:
    id: str
    requested: bool = False
    metadata: dict[str, str] | None = None
    item_id: str | None = None  #: the audio message, once Moshi spoke in this response
    first_step: int | None = None
    last_step: int | None = None
    frames: int = 0
    quiet: int = 0
    transcript: str = ""
    output: list[dict[str, Any]] = field(default_factory=list)  #: finished output items
    waited: int = 0  #: frames since a requested response was created
    answer_fed: bool = False  #: oracle tokens reached Moshi since it was requested
    answer_idle: int = 0  #: frames since the oracle's last token (once fed)


@dataclass(frozen=True)
class SpokenItem:
    """An assistant audio message that ended: the output steps it covers (for truncate and delete)."""

    item_id: str
    first_step: int
    end_step: int


class AssistantTurns:
    """Output frames -> responses, one at a time (docs/protocol.md 3.4, 3.7).

    An *unrequested* response starts on Moshi's speech and ends after silence,
    a user turn or 30 s. A *requested* one (``response.create``) starts at once,
    takes Moshi's speech from then on, and ends after the end gap of silence
    once Moshi spoke in it, or once the back-end's answer has been fed to
    Moshi in full and the end gap has passed (Moshi may go on talking: that
    is a new response), or after :data:`REQUEST_WAIT_FRAMES` if no answer
    reached Moshi at all. ``response.cancel`` ends it ``cancelled`` and withholds Moshi's
    remaining audio until it has been silent for the end gap, a response is
    requested, or the wire releases it (:meth:`release`: the user's turn was
    committed and will be answered). A user message the client adds (a
    typed turn) ends an unrequested response and holds Moshi's audio for at
    most the end gap (:meth:`typed_turn`). A function call is an output item of the open response,
    which then ends.
    """

    def __init__(
        self,
        ids: Ids,
        conversation: Conversation,
        *,
        end_silence_frames: int = END_SILENCE_FRAMES,
        max_frames: int = MAX_RESPONSE_FRAMES,
        speaking_dbfs: float = SPEAKING_DBFS,
        vocab: TextVocab = MOSHI_VOCAB,
        request_wait_frames: int = REQUEST_WAIT_FRAMES,
    ) -> None:
        self.ids = ids
        self.vocab = vocab  #: the loaded model's (its word-start piece becomes a space)
        self.conversation = conversation
        self.end_silence_frames = end_silence_frames
        self.max_frames = max_frames
        self.speaking_dbfs = speaking_dbfs
        self.request_wait_frames = request_wait_frames
        self.silence_audio = True
        self.current: _Response | None = None
        self.responses = 0
        #: Moshi's audio after a cancel: not sent until it has been silent for the end gap
        self.withholding = False
        self._withheld_quiet = 0
        self._withhold_left: int | None = None  # frames a hold still withholds (None: until silence)
        self._withheld_from: int | None = None  # the first output step withheld
        #: output step ranges ``[start, end)`` withheld after a cancel, not yet taken by the wire: the user
        #: never heard them, so their words leave the back-end's history (:meth:`take_unheard`)
        self.unheard: list[tuple[int, int]] = []
        #: the last audio message that ended (steps known), for truncate/delete
        self.spoken: dict[str, SpokenItem] = {}
        self._step = 0

    def speaking(self, pcm: np.ndarray, text: str | None) -> bool:
        return bool(text) or at_least(pcm, self.speaking_dbfs)

    @property
    def requested_open(self) -> bool:
        return self.current is not None and self.current.requested

    def steps_of(self, item_id: str) -> SpokenItem | None:
        """The output steps of an audio message (ended, or the open response's so far)."""
        r = self.current
        if r is not None and r.item_id == item_id and r.first_step is not None:
            return SpokenItem(item_id, r.first_step, self._step + 1)
        return self.spoken.get(item_id)

    def frame(self, delta: str | None, *, speaking: bool, text: str | None = None, step: int | None = None,
              fed: bool = False) -> list[Event]:
        """Events for one output frame.

        ``delta`` is its base64 PCM16, None when the frame is dropped (a client
        that does not keep up): the response's lifecycle and transcript go on.
        ``text`` is Moshi's text piece of this frame, if any; ``step`` its output step;
        ``fed``: an oracle token (an answer's) was fed to Moshi at this step.
        """
        self._step = self._step + 1 if step is None else step
        out: list[Event] = []
        r = self.current
        if r is not None and r.requested:
            r.waited += 1
            if fed:
                r.answer_fed, r.answer_idle = True, 0
            elif r.answer_fed:
                r.answer_idle += 1
            answered = r.answer_fed and r.answer_idle >= self.end_silence_frames
            if answered or (not r.answer_fed and r.item_id is None and r.waited >= self.request_wait_frames):
                out += self.close("completed")  # this frame belongs to what comes next
        if self.withholding:
            if self._withheld_from is None:
                self._withheld_from = self._step
            self._withheld_quiet = 0 if speaking else self._withheld_quiet + 1
            if self._withhold_left is not None:
                self._withhold_left -= 1
            if self._withheld_quiet < self.end_silence_frames and (self._withhold_left is None or self._withhold_left >= 0):
                return out
            self._stop_withholding(self._step)  # this frame is silent (or the hold is over) and not withheld
        r = self.current
        if r is None:
            if not speaking:
                return out + ([ev.silence_delta(delta)] if self.silence_audio and delta is not None else [])
            out += self._open()
            r = self.current
            assert r is not None
        if r.item_id is None:
            if not speaking:  # a requested response waits for Moshi's first words
                return out
            out += self._add_audio_item(r)
        item_id = r.item_id
        assert item_id is not None
        if delta is not None:
            out.append(ev.audio_delta(r.id, item_id, delta, len(r.output)))
        if text:
            piece = self.vocab.piece_text(text)
            if not r.transcript:
                piece = piece.lstrip()
            if piece:
                r.transcript += piece
                out.append(ev.transcript_delta(r.id, item_id, piece, len(r.output)))
        r.last_step = self._step
        r.frames += 1
        r.quiet = 0 if speaking else r.quiet + 1
        if r.quiet >= self.end_silence_frames or r.frames >= self.max_frames:
            out += self.close("completed")
        return out

    def request(self, metadata: dict[str, str] | None = None) -> list[Event]:
        """``response.create``: an unrequested response still open ends ``completed``; the new one starts now."""
        out = self.close("completed")
        self._stop_withholding(self._step + 1)
        r = _Response(self.ids.response(), requested=True, metadata=metadata)
        self.current = r
        self.responses += 1
        out.append(ev.response_created(r.id, metadata))
        return out

    def cancel(self, reason: str) -> list[Event]:
        """``response.cancel`` (or speech with ``interrupt_response``): the open response ends ``cancelled`` and
        Moshi's remaining audio is withheld until it has been silent for the end gap; [] if none is open."""
        if self.current is None:
            return []
        if not self.withholding or self._withhold_left is not None:
            self.withholding, self._withheld_quiet, self._withheld_from = True, 0, self._withheld_from
            self._withhold_left = None
        return self.close("cancelled", reason)

    def typed_turn(self) -> list[Event]:
        """A user message the client added (a typed turn): an unrequested response still open ends ``completed``
        and Moshi's audio is held for at most the end gap, so that the client's ``response.create`` for it
        finds no response in progress (OpenAI's server never speaks on its own after an added item; clients
        such as the Agents SDK send ``response.create`` only once no response is in progress). A requested
        response goes on; [] then."""
        if self.requested_open:
            return []
        out = self.close("completed")
        if not self.withholding:
            self.withholding, self._withheld_quiet, self._withheld_from = True, 0, None
            self._withhold_left = self.end_silence_frames
        return out

    def release(self) -> None:
        """Audio withheld after a cancel ends now: the next frame is sent (the user's turn was committed and
        the server answers it, so what Moshi says from here on is that answer, even from a model that never
        goes quiet for the end gap)."""
        self._stop_withholding(self._step + 1)

    def take_unheard(self) -> list[tuple[int, int]]:
        """The step ranges withheld since the last call (see :attr:`unheard`)."""
        out, self.unheard = self.unheard, []
        return out

    def _stop_withholding(self, end_step: int) -> None:
        if self.withholding and self._withheld_from is not None and end_step > self._withheld_from:
            self.unheard.append((self._withheld_from, end_step))
        self.withholding, self._withheld_from, self._withhold_left = False, None, None

    def function_call(self, call_id: str, name: str, arguments: str) -> list[Event]:
        """A call of the client's function: an output item of the open response (a new one if none), which ends."""
        out: list[Event] = []
        r = self.current
        if r is None:
            r = _Response(self.ids.response())
            self.current = r
            self.responses += 1
            out.append(ev.response_created(r.id))
        out += self._end_audio_item(r, "completed")
        item_id = self.ids.item()
        previous = self.conversation.add(item_id)
        events, item = function_call_items(r.id, len(r.output), item_id, call_id, name, arguments, previous)
        self.conversation.forget(item_id)
        r.output.append(item)
        out += events
        return out + self.close("completed")

    def close(self, status: str = "completed", reason: str | None = None) -> list[Event]:
        """End the open response now (user turn ended, session ending); [] if none is open."""
        r = self.current
        if r is None:
            return []
        self.current = None
        out = self._end_audio_item(r, status)
        out.append(ev.response_done(r.id, status, [dict(i) for i in r.output], r.metadata, reason))
        return out

    def _end_audio_item(self, r: _Response, status: str) -> list[Event]:
        if r.item_id is None:
            return []
        item_id, r.item_id = r.item_id, None
        previous = self.conversation.previous_of(item_id)
        self.conversation.forget(item_id)
        if r.first_step is not None:
            self.spoken[item_id] = SpokenItem(item_id, r.first_step, (r.last_step or r.first_step) + 1)
            while len(self.spoken) > MAX_SPOKEN_ITEMS:
                self.spoken.pop(next(iter(self.spoken)))
        events, item = ev.audio_item_end(r.id, item_id, previous, r.transcript, status, len(r.output))
        r.output.append(item)
        return events

    def _open(self) -> list[Event]:
        r = _Response(self.ids.response())
        self.current = r
        self.responses += 1
        return [ev.response_created(r.id)]

    def _add_audio_item(self, r: _Response) -> list[Event]:
        r.item_id = self.ids.item()
        r.first_step = self._step
        r.quiet = 0
        r.frames = 0
        previous = self.conversation.add(r.item_id)
        return ev.audio_item_start(r.id, r.item_id, previous, len(r.output))


@dataclass
class _UserTurn:
    item_id: str
    start_s: float
    sent_stable: str = ""
    stopped: bool = False


class UserTurns:
    """ASR turn events -> user items, VAD events and transcription events.

    Turns are keyed by the ASR's utterance number, so a final that arrives
    after the next turn started still lands on its own item. An event for a
    turn never announced (a recogniser without ``speech_started``) opens it.
    """

    def __init__(self, ids: Ids, conversation: Conversation, max_open: int = 8) -> None:
        self.ids = ids
        self.conversation = conversation
        self.max_open = max_open
        self.turns: dict[int, _UserTurn] = {}

    def _turn(self, utterance: int, audio_s: float, out: list[Event]) -> _UserTurn:
        turn = self.turns.get(utterance)
        if turn is None:
            while len(self.turns) >= self.max_open:  # a recogniser that never finalises: forget the oldest
                oldest = min(self.turns)
                self.conversation.forget(self.turns.pop(oldest).item_id)
            turn = _UserTurn(self.ids.item(), audio_s)
            self.turns[utterance] = turn
            previous = self.conversation.add(turn.item_id)
            out += ev.speech_started(turn.item_id, _ms(audio_s), previous)
        return turn

    def speech_started(self, utterance: int, audio_s: float) -> list[Event]:
        out: list[Event] = []
        self._turn(utterance, audio_s, out)
        return out

    def partial(self, utterance: int, audio_s: float, text: str, stable: str, latency_s: float | None) -> list[Event]:
        out: list[Event] = []
        turn = self._turn(utterance, audio_s, out)
        if stable.startswith(turn.sent_stable) and len(stable) > len(turn.sent_stable):
            out.append(ev.transcription_delta(turn.item_id, stable[len(turn.sent_stable) :]))
            turn.sent_stable = stable
        out.append(ev.transcription_partial(turn.item_id, text, stable, latency_s))
        return out

    def speech_stopped(self, utterance: int, audio_s: float) -> list[Event]:
        out: list[Event] = []
        turn = self._turn(utterance, audio_s, out)
        if not turn.stopped:
            turn.stopped = True
            out += ev.speech_stopped(turn.item_id, _ms(audio_s), self.conversation.previous_of(turn.item_id))
        return out

    def final(self, utterance: int, audio_s: float, text: str) -> list[Event]:
        out: list[Event] = []
        turn = self._turn(utterance, audio_s, out)
        if not turn.stopped:
            out += self.speech_stopped(utterance, audio_s)
        previous = self.conversation.previous_of(turn.item_id)
        out += ev.transcription_completed(turn.item_id, text, audio_s - turn.start_s, previous)
        self.turns.pop(utterance, None)
        self.conversation.forget(turn.item_id)
        return out

    def failed(self, message: str) -> list[Event]:
        """The ASR stopped: every open turn failed."""
        out = [ev.transcription_failed(t.item_id, message) for t in self.turns.values()]
        for t in self.turns.values():
            self.conversation.forget(t.item_id)
        self.turns.clear()
        return out


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))
