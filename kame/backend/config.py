"""Settings of the LLM back-ends."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BackendConfig(BaseModel):
    """One named LLM back-end."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field("openai", description="openai (any OpenAI-compatible server) or scripted.")
