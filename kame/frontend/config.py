"""Settings of the Moshi/KAME front-end: checkpoint, batch, precision, sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kame.audio.media import FRAME_S

#: The most engine slots one server may have (frontend.batch_size).
MAX_BATCH_SIZE = 256


class SamplingConfig(BaseModel):
    """Sampling defaults. ``None`` takes the checkpoint's ``lm_gen_config`` value,
    then moshi's own default."""

    model_config = ConfigDict(extra="forbid")

    # finite: a temperature is a divisor of the logits, and clients are told it as JSON
    temp: float | None = Field(None, ge=0, allow_inf_nan=False, description="Audio sampling temperature (batch-wide; finite, >= 0).")
    temp_text: float | None = Field(None, ge=0, allow_inf_nan=False, description="Text sampling temperature (finite, >= 0).")
    top_k: int | None = Field(None, ge=1, description="Audio top-k (batch-wide).")
    top_k_text: int | None = Field(None, ge=1, description="Text top-k.")
    use_sampling: bool = Field(True, description="False decodes greedily (argmax).")


class FrontendConfig(BaseModel):
    """The speech-to-speech front-end (Mimi codec + Moshi LM with the oracle input)."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(
        "SakanaAI/kame",
        description="Hub repo id or local directory (a local directory wins over a Hub id).",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    lora_weights: str | None = Field(
        None,
        description="LoRA adapters (safetensors; local path or hf://OWNER/REPO/FILE) for a checkpoint whose "
        "config.json sets lora (moshi-finetune's output); overrides its lora_name (kame serve --lora-weight).",
    )
    fuse_lora: bool = Field(
        True,
        description="Fuse the LoRA adapters into the weights at load (as KAME's and moshi's servers do); false keeps "
        "them as separate layers (kame serve --no-fuse-lora): more memory and compute a step.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="LM weights dtype; auto = bfloat16 on CUDA, float32 on CPU."
    )
    weights: Literal["bf16", "int8"] = Field(
        "bf16",
        description="LM linear weights: bf16 = as the checkpoint stores them, in frontend.dtype; int8 = quantized at "
        "load with moshi's bitsandbytes layers (int8 weight + float32 scale a row; embeddings and the oracle table "
        "stay in frontend.dtype; about half the weight memory). A q8 checkpoint (quantize: true) is int8 either way. "
        "Compare `kame run --compare-weights bf16,int8` before switching (docs/models.md).",
    )
    batch_size: int = Field(8, ge=1, le=MAX_BATCH_SIZE, description="Engine slots = concurrent sessions on one model "
                            "(kame serve --max-sessions; server.max_sessions is its deprecated old name).")
    cuda_graphs: bool = Field(
        True,
        description="Use moshi's CUDA graphs on GPU for every step of the front-end engine "
        "(and a Kyutai STT, shared or on its own engine); false turns them off.",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile of moshi's kernels for the front-end engine and a Kyutai STT "
        "(CUDA: Triton, needs gcc and the Python headers; CPU: inductor, needs g++); auto = on for CUDA, "
        "off on CPU. Decides whatever NO_TORCH_COMPILE held; a failure to compile at warm-up is logged and "
        "the server runs eager.",
    )
    oracle_idle: Literal["auto", "pad", "zero"] = Field(
        "auto",
        description="Oracle token when idle: pad (3) for KAME checkpoints, zero (-1, exact vanilla Moshi) "
        "for plain Moshi ones; auto picks by whether the checkpoint has oracle_emb.",
    )
    batch_wait_s: float = Field(
        0.03,
        ge=0,
        le=FRAME_S,
        description="Longest a session's frame waits for other sessions' frames to share an engine tick "
        "(more sharing = fewer ticks, less = lower latency for sessions whose audio arrives at other phases).",
    )
    oracle_fifo_size: int = Field(256, ge=8, description="Per-slot oracle token queue bound.")
    seed: int | None = Field(None, description="Seed for sampling (None: random).")
    cpu_threads: int | None = Field(
        1,
        ge=1,
        description="torch intra-op threads when running on CPU (process-wide; null: torch's default). "
        "1 avoids OpenMP spin contention with the server's other threads.",
    )
    voice: str | None = Field(
        None,
        description="Default voice of a PersonaPlex checkpoint (a name from its voices folder; null: NATF2 "
        "when the checkpoint has it, else the first by name). Sessions may choose another.",
    )
    refresh_prompts: Literal["never", "at_pause"] = Field(
        "never",
        description="PersonaPlex in long calls: never = the prompts (voice, persona) are stepped once, at the start, "
        "and leave the LM's attention window after context frames (moshi's sliding window, as PersonaPlex does); "
        "at_pause = once they begin to leave it, the slot steps them again at the next pause (its own text silent "
        "and the caller quiet for refresh_pause_s), keeping its cache: at most once per context frames, the slot "
        "silent and not hearing the caller while it does (docs/personaplex.md, \"Long calls\").",
    )
    refresh_pause_s: float = Field(
        1.0, gt=0, le=30, description="With refresh_prompts at_pause: how long both sides must be quiet before the "
        "prompts are stepped again.",
    )
    refresh_quiet_dbfs: float = Field(
        -45.0, le=0, allow_inf_nan=False, description="With refresh_prompts at_pause: the caller's audio below this "
        "level (RMS of a frame, dBFS) counts as quiet.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)

    @field_validator("compile", mode="before")
    @classmethod
    def _yaml_switch(cls, value: object) -> object:
        """YAML 1.1 reads a bare ``on``/``off`` as a boolean."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value
