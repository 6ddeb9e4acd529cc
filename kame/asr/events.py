"""What a recogniser tells its session, stamped with when it said it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class EventType(str, enum.Enum):
    """Kinds of recogniser events, in the order a turn produces them."""

    SPEECH_STARTED = "speech_started"
    PARTIAL = "partial"  #: hypothesis of the current turn so far (emitted when it changes)
    SPEECH_STOPPED = "speech_stopped"  #: end of turn (after turn.end_silence_s of silence)
    FINAL = "final"  #: the turn's committed text (may be empty: a noise that looked like speech)
    ERROR = "error"  #: the recogniser failed; the stream emits nothing more
    CUT = "cut"  #: the client's cut reached the recogniser: every final of the audio before it came first


@dataclass(frozen=True)
class Emission:
    """An event as a transcriber produces it, before the stream stamps it with times.

    Plain data (picklable) so a worker process can send it through a pipe.
    """

    type: EventType
    text: str = ""
    stable: str = ""
    utterance: int = 0


@dataclass(frozen=True)
class AsrEvent:
    """One recogniser event.

    ``audio_s`` is how much audio (seconds) had been fed to the stream when
    the event was produced, so ``audio_s - <end of a word>`` is the lag a
    listener would see; ``wall_s`` is ``time.time()`` at that moment.
    ``stable`` is, for partials, the prefix committed by local agreement (it
    only grows within a turn); the rest of ``text`` is tentative.
    ``utterance`` numbers the turns of a stream from 0.
    """

    type: EventType
    text: str
    audio_s: float
    wall_s: float
    utterance: int = 0
    stable: str = ""

    @classmethod
    def stamp(cls, em: Emission, audio_s: float, wall_s: float) -> AsrEvent:
        return cls(em.type, em.text, audio_s, wall_s, em.utterance, em.stable)

    def to_json_dict(self) -> dict[str, Any]:
        """The compact form printed by ``kame transcribe --json``."""
        return {"t_s": round(self.audio_s, 3), "type": self.type.value, "text": self.text}
