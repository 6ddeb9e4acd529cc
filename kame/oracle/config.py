"""Settings of the oracle loop: when to ask the LLM, what to ask, how to feed its answer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OracleConfig(BaseModel):
    """Per-session oracle loop defaults (a session may override some)."""

    model_config = ConfigDict(extra="forbid")

    policy: Literal["reset", "keep_if_same_start", "freeze_when_speaking"] = Field(
        "reset", description="Answer-switch policy."
    )
