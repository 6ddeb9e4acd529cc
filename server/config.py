"""Settings of the HTTP/websocket server."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class ServerConfig(BaseModel):
    """Where the server listens and how it treats sessions."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Listen address.")
    port: int = Field(8998, ge=0, le=65535, description="Listen port.")
    max_sessions: int | None = Field(None, ge=1, description="Session cap; None = frontend.batch_size.")
    auth_token: SecretStr | None = Field(None, description="Optional bearer token (env KAME_AUTH_TOKEN).")
