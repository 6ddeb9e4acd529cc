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

import numpy as np

from kame.loudness import at_least
from kame.server.wires.realtime import events as ev
from kame.server.wires.realtime.events import Event, Ids
from kame.vocab import MOSHI_VOCAB, TextVocab

#: Level from which an output frame counts as speech.
SPEAKING_DBFS = -40.0
#: Non-speaking frames that end a response (0.8 s).
END_SILENCE_FRAMES = 10
#: Longest response (30 s): a monologue is cut so that transcripts stay bounded.
MAX_RESPONSE_FRAMES = 375


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
    item_id: str
    frames: int = 0
    quiet: int = 0
    transcript: str = ""


class AssistantTurns:
    """Output frames -> responses (start on speech, end after silence, a user turn, or 30 s)."""

    def __init__(
        self,
        ids: Ids,
        conversation: Conversation,
        *,
        end_silence_frames: int = END_SILENCE_FRAMES,
        max_frames: int = MAX_RESPONSE_FRAMES,
        speaking_dbfs: float = SPEAKING_DBFS,
        vocab: TextVocab = MOSHI_VOCAB,
    ) -> None:
        self.ids = ids
        self.vocab = vocab  #: the loaded model's (its word-start piece becomes a space)
        self.conversation = conversation
        self.end_silence_frames = end_silence_frames
        self.max_frames = max_frames
        self.speaking_dbfs = speaking_dbfs
        self.silence_audio = True
        self.current: _Response | None = None
        self.responses = 0

    def speaking(self, pcm: np.ndarray, text: str | None) -> bool:
        return bool(text) or at_least(pcm, self.speaking_dbfs)

    def frame(self, delta: str | None, *, speaking: bool, text: str | None = None) -> list[Event]:
        """Events for one output frame.

        ``delta`` is its base64 PCM16, None when the frame is dropped (a client
        that does not keep up): the response's lifecycle and transcript go on.
        ``text`` is Moshi's text piece of this frame, if any.
        """
        out: list[Event] = []
        r = self.current
        if r is None:
            if not speaking:
                return [ev.silence_delta(delta)] if self.silence_audio and delta is not None else []
            out += self._open()
            r = self.current
            assert r is not None
        if delta is not None:
            out.append(ev.audio_delta(r.id, r.item_id, delta))
        if text:
            piece = self.vocab.piece_text(text)
            if not r.transcript:
                piece = piece.lstrip()
            if piece:
                r.transcript += piece
                out.append(ev.transcript_delta(r.id, r.item_id, piece))
        r.frames += 1
        r.quiet = 0 if speaking else r.quiet + 1
        if r.quiet >= self.end_silence_frames or r.frames >= self.max_frames:
            out += self.close("completed")
        return out

    def close(self, status: str = "completed") -> list[Event]:
        """End the open response now (user turn ended, session ending); [] if none is open."""
        r = self.current
        if r is None:
            return []
        self.current = None
        previous = self.conversation.previous_of(r.item_id)
        self.conversation.forget(r.item_id)
        return ev.response_end(r.id, r.item_id, previous, r.transcript, status)

    def _open(self) -> list[Event]:
        r = _Response(self.ids.response(), self.ids.item())
        self.current = r
        self.responses += 1
        previous = self.conversation.add(r.item_id)
        return ev.response_start(r.id, r.item_id, previous)


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
