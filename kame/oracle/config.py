"""Settings of the oracle loop: when to ask the LLM, what to ask, how to feed its answer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kame.oracle.sanitize import SanitizeOptions
from kame.oracle.switch import BargeInPolicy, Policy


class SanitizerConfig(BaseModel):
    """How an LLM answer is turned into spoken text before tokenizing (changes the oracle tokens)."""

    model_config = ConfigDict(extra="forbid")

    keep_question: bool = Field(
        False, description="Keep '?' (default: '.', as the training data had only '.' and ',')."
    )
    keep_exclamation: bool = Field(False, description="Keep '!' (default: '.').")
    case: Literal["keep", "lower"] = Field("keep", description="Letter case of the answer.")
    numbers: Literal["keep", "spell"] = Field("keep", description="keep digits, or spell numbers as words.")
    spell_symbols: bool = Field(
        True, description="Say %, &, +, =, @, degrees and $/€/£ amounts as words (else drop them)."
    )

    def options(self) -> SanitizeOptions:
        return SanitizeOptions(
            keep_question=self.keep_question,
            keep_exclamation=self.keep_exclamation,
            case=self.case,
            numbers=self.numbers,
            spell_symbols=self.spell_symbols,
        )


class OracleConfig(BaseModel):
    """Per-session oracle loop defaults (a session may override some)."""

    model_config = ConfigDict(extra="forbid")

    policy: Policy = Field(
        "reset",
        description="Answer-switch policy: reset on every new answer (published), keep the sequence when the "
        "new answer starts with the words already fed, or stop resetting once the assistant has spoken "
        "(as in training).",
    )
    barge_in: BargeInPolicy = Field(
        "keep", description="When the user starts speaking while the assistant speaks: keep or clear the queued answer."
    )
    barge_in_idle_steps: int = Field(
        12,
        ge=1,
        description="The assistant counts as speaking until this many steps (80 ms) pass without a text piece.",
    )
    min_new_words: int = Field(2, ge=1, description="Restart the LLM when the user's word count grew by this much.")
    max_restarts: int = Field(5, ge=1, description="At most this many LLM starts per restart_window_s.")
    restart_window_s: float = Field(2.0, ge=0, description="Sliding window of the restart rate limit (seconds).")
    final_restarts: Literal["always", "if_changed"] = Field(
        "always",
        description="A final transcript restarts the LLM always (published), or only if its text differs from "
        "the text of the last start.",
    )
    max_answer_words: int = Field(30, ge=1, description="Reply length the prompt asks the LLM for (words).")
    max_fed_words: int | None = Field(
        45, ge=1, description="Hard cap on words fed per answer (null: no cap); the LLM stream is cancelled there."
    )
    tokenizer_lookahead_words: int = Field(
        0,
        ge=0,
        description="Commit a word's tokens only once this many more words are known and its encoding "
        "is stable (0: at once; SentencePiece with split_by_whitespace needs none).",
    )
    word_end_pad_steps: int | None = Field(
        3,
        ge=1,
        description="Steps without a piece that end the assistant's current word (null: only the next "
        "word ends it); decides when the assistant 'has spoken' for freeze_when_speaking.",
    )
    history_max_turns: int | None = Field(
        None,
        ge=1,
        description="Most conversation turns sent to the LLM (null: no such cap; the conversation sent is the "
        "longest that fits the back-end's context_tokens, oldest turns dropped first).",
    )
    history_max_chars: int = Field(
        400_000,
        ge=100,
        description="Most characters of conversation a session keeps (a memory bound: ~100k tokens, hours of "
        "talk); what is sent is the part of it that fits the back-end's context_tokens.",
    )
    language: str = Field("English", description="Language the LLM is asked to reply in.")
    persona: str | None = Field(
        None, description="Operator persona for the LLM (not for Moshi), added to the system prompt."
    )
    instructions: str | None = Field(
        None, description="Default per-session instructions for the LLM (a session may replace them)."
    )
    oracle_delay_s: float = Field(
        0.0, ge=0, description="Extra artificial delay before an answer is fed (for latency experiments)."
    )
    tool_backchannel_words: int = Field(
        3,
        ge=1,
        description="A user turn of fewer words (a backchannel such as 'uh huh') neither cancels a request "
        "waiting on tools nor makes its answer stale.",
    )
    sanitize: SanitizerConfig = Field(default_factory=SanitizerConfig)
