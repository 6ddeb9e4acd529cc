"""The oracle: LLM answers turned into Moshi's extra token stream (pure, I/O-free parts).

See docs/oracle.md. The async loop that wires these to the ASR, the LLM
back-ends and the engine lives elsewhere and only calls these APIs.
"""

from kame.oracle.debounce import Debouncer, Trigger
from kame.oracle.pieces import PieceWords, pieces_to_text
from kame.oracle.prompt import build_messages, build_messages_from_config, system_prompt
from kame.oracle.sanitize import SanitizeOptions, sanitize, settled_words, spoken_words
from kame.oracle.switch import (
    BargeInDecision,
    FeedState,
    SwitchDecision,
    decide_barge_in,
    decide_switch,
)
from kame.oracle.transcript import Transcript, TranscriptView, Turn, UserUpdate
from kame.oracle.word_tokenizer import WordStreamTokenizer

__all__ = [
    "BargeInDecision",
    "Debouncer",
    "FeedState",
    "PieceWords",
    "SanitizeOptions",
    "SwitchDecision",
    "Transcript",
    "TranscriptView",
    "Trigger",
    "Turn",
    "UserUpdate",
    "WordStreamTokenizer",
    "build_messages",
    "build_messages_from_config",
    "decide_barge_in",
    "decide_switch",
    "pieces_to_text",
    "sanitize",
    "settled_words",
    "spoken_words",
    "system_prompt",
]
