"""Settings of the LLM back-ends (``backends.NAME``) and their global caps (``llm``).

One model covers both kinds (``openai`` and ``scripted``) so that the config
reference can list every field; a validator rejects fields that do not
belong to the chosen kind. API keys are never settings: a back-end names
the environment variable that holds its key (``api_key_env``), and the key
is read from the environment at request time.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PresetName = Literal["openai", "anthropic", "gemini", "openrouter", "vllm", "ollama", "llamacpp"]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OPENAI_ONLY = ("preset", "base_url", "model", "api_key_env", "headers", "extra_body", "max_retries")


def _default_rules() -> dict[str, str]:
    return {
        "hello": "Hi there, nice to hear from you. What would you like to talk about today?",
        "your name": "I am KAME, a voice assistant that starts thinking while you are still talking.",
        "weather": "I cannot look outside, but I hope it is sunny where you are.",
        "joke": "Why did the turtle cross the road, to get to the shell station.",
        "thank": "You are very welcome, it was a pleasure talking with you.",
        "bye": "Goodbye, talk to you soon.",
    }


class TimeoutsConfig(BaseModel):
    """Time limits of one request; first-token and total are enforced by kame itself."""

    model_config = ConfigDict(extra="forbid")

    connect_s: float = Field(3.0, gt=0, description="TCP/TLS connect timeout.")
    first_token_s: float = Field(
        5.0, gt=0, description="From sending the request to the first text chunk; an answer later than this is useless."
    )
    total_s: float = Field(30.0, gt=0, description="Whole reply, from request to the last chunk.")
    check_s: float = Field(3.0, gt=0, description="Reachability check (GET {base_url}/models).")


class CapsConfig(BaseModel):
    """Concurrency and rate caps of one back-end (null: no cap)."""

    model_config = ConfigDict(extra="forbid")

    max_concurrent: int | None = Field(None, ge=1, description="Requests streaming at the same time.")
    max_requests_per_s: float | None = Field(None, gt=0, description="Request starts per second (token bucket).")
    burst: int | None = Field(None, ge=1, description="Token bucket size (null: max(1, max_requests_per_s)).")
    max_wait_s: float = Field(
        0.2, ge=0, description="How long a request may wait for a free slot before failing with BackendBusy."
    )


class BreakerConfig(BaseModel):
    """Circuit breaker: stop calling a back-end that keeps failing, probe it again later."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Use the breaker for this back-end.")
    failure_threshold: int = Field(3, ge=1, description="Consecutive failures that open the breaker.")
    cooldown_s: float = Field(5.0, gt=0, description="Rest before the first probe (half-open).")
    backoff_factor: float = Field(2.0, ge=1, description="Cooldown multiplier after each failed probe.")
    max_cooldown_s: float = Field(60.0, gt=0, description="Upper bound of the cooldown.")


class ScriptedToolRule(BaseModel):
    """A scripted tool call: when the keyword is heard and the tool is offered, call it."""

    model_config = ConfigDict(extra="forbid")

    keyword: str = Field(description="Case-insensitive keyword in the last user message.")
    tool: str = Field(description="Name of the tool to call (only if the request offers it).")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments of the call.")
    say_first: str = Field("Let me check.", description='Text streamed before the call ("" for none).')
    answer: str = Field(
        "Here is what I found, {result}.",
        description="Reply once the result is back; {result} is the tool's output.",
    )
    answer_on_error: str = Field(
        "Sorry, I could not get that right now.", description="Reply when the call failed, was refused or timed out."
    )


class ScriptedConfig(BaseModel):
    """The scripted back-end (kind scripted): canned, deterministic replies for demos and tests."""

    model_config = ConfigDict(extra="forbid")

    rules: dict[str, str] = Field(
        default_factory=_default_rules,
        description="Keyword (case-insensitive, in the last user message) -> reply; the first match in order wins.",
    )
    replies: list[str] = Field(
        default_factory=list, description="Replies cycled in order when no rule matches (before default_reply)."
    )
    default_reply: str = Field(
        "I heard you say {user}. Tell me more about that.",
        description="Reply when nothing else applies; {user} is the last user message (first max_user_words words).",
    )
    max_user_words: int = Field(12, ge=1, description="Words of the user's message quoted by {user}.")
    first_token_delay_s: float = Field(0.3, ge=0, description="Delay before the first chunk (simulated latency).")
    chunks_per_s: float = Field(20.0, gt=0, description="Chunks (words) per second after the first.")
    tool_rules: list[ScriptedToolRule] = Field(
        default_factory=list, description="Scripted tool calls (checked before rules when tools are offered)."
    )


class BackendConfig(BaseModel):
    """One named LLM back-end."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["openai", "scripted"] = Field(
        "openai", description="openai (any OpenAI-compatible server) or scripted."
    )
    description: str = Field("", description="Free text shown to clients in the back-end list.")
    preset: PresetName | None = Field(
        None, description="Provider defaults (base_url, api_key_env, model, extra_body); fields set here override them."
    )
    base_url: str | None = Field(None, description="OpenAI-compatible API root, e.g. http://localhost:8000/v1.")
    model: str | None = Field(
        None, description="Model name sent to the server (null: the preset's, else the first of GET /models)."
    )
    api_key_env: str | list[str] | None = Field(
        None,
        description='Environment variable(s) holding the API key, first set wins (null: the preset\'s; "": no key).',
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (merged over the preset's).")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra JSON fields of each request, e.g. to switch off thinking (merged over the preset's; null deletes).",
    )
    max_tokens: int | None = Field(100, ge=1, description="Cap on the reply length in tokens (null: server default).")
    context_tokens: int | None = Field(
        None,
        ge=256,
        description="The model's context window in tokens: the conversation sent is the longest that fits it "
        "with the instructions, tools and max_tokens (null: the preset's, else 8192; set it to the server's "
        "window, e.g. vLLM's --max-model-len or Ollama's num_ctx).",
    )
    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature (null: server default).")
    max_retries: int = Field(
        0, ge=0, le=5, description="Client-side retries of failed requests (0: a newer request comes soon anyway)."
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig, description="Time limits of one request.")
    caps: CapsConfig = Field(default_factory=CapsConfig, description="Concurrency and rate caps of this back-end.")
    breaker: BreakerConfig = Field(default_factory=BreakerConfig, description="Circuit breaker of this back-end.")
    allow_tools: bool = Field(
        True,
        description="May requests with function tools go to this back-end (every kind, every preset; false: never "
        "offer tools)? A server that refuses them (HTTP 400, e.g. vLLM without --enable-auto-tool-choice) is "
        "marked tool-less at its first refusal and asked again without them.",
    )
    mcp_servers: list[str] = Field(
        default_factory=list, description="MCP servers (tools.mcp_servers names) enabled for sessions on this back-end."
    )
    fallback: str | None = Field(
        None, description="Back-end used when this one's breaker is open or it fails before its first token."
    )
    scripted: ScriptedConfig = Field(default_factory=ScriptedConfig, description="Replies of a scripted back-end.")

    @model_validator(mode="after")
    def _check(self) -> BackendConfig:
        # Messages never quote values: a key pasted by mistake must not be echoed.
        if self.kind == "scripted":
            wrong = [f for f in _OPENAI_ONLY if f in self.model_fields_set]
            if wrong:
                raise ValueError(f"{', '.join(wrong)}: only for kind openai, not scripted")
        elif "scripted" in self.model_fields_set:
            raise ValueError("scripted: only for kind scripted")
        names = [self.api_key_env] if isinstance(self.api_key_env, str) else (self.api_key_env or [])
        for name in names:
            if name and not _ENV_NAME.match(name):
                raise ValueError(
                    "api_key_env must be the NAME of an environment variable (like OPENAI_API_KEY), not the key"
                )
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return self

    def tools_allowed(self) -> bool:
        """Whether requests that carry function tools may be sent here (``allow_tools``)."""
        return self.allow_tools

    def key_env_names(self) -> list[str]:
        """The environment variables to try for the key, in order (empty: no key)."""
        if self.api_key_env is None or self.api_key_env == "":
            return []
        if isinstance(self.api_key_env, str):
            return [self.api_key_env]
        return [n for n in self.api_key_env if n]


class LlmConfig(BaseModel):
    """Caps over all back-ends together."""

    model_config = ConfigDict(extra="forbid")

    max_concurrent_requests: int | None = Field(
        64, ge=1, description="LLM requests streaming at the same time, all back-ends together (null: no cap)."
    )
    max_requests_per_s: float | None = Field(
        None, gt=0, description="LLM request starts per second, all back-ends together (null: no cap)."
    )
    burst: int | None = Field(None, ge=1, description="Token bucket size for max_requests_per_s.")
    max_wait_s: float = Field(
        0.2, ge=0, description="How long a request may wait for a global slot before failing with BackendBusy."
    )


class McpServerConfig(BaseModel):
    """One operator-configured MCP server: a stdio command or a streamable-HTTP URL.

    Secrets never go in this file: ``env_from`` and ``bearer_token_env``
    name variables of kame's own environment whose values are passed on;
    they are redacted from every error and log line.
    """

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(None, description="Executable of a stdio server (with args); or use url.")
    args: list[str] = Field(default_factory=list, description="Arguments of the stdio command.")
    cwd: str | None = Field(None, description="Working directory of the stdio command.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Non-secret environment variables of the stdio command."
    )
    env_from: dict[str, str] = Field(
        default_factory=dict,
        description="Variables of the stdio command taken from kame's environment: {CHILD_VAR: KAME_ENV_NAME}.",
    )
    url: str | None = Field(None, description="Streamable-HTTP endpoint of a remote server; or use command.")
    bearer_token_env: str | None = Field(
        None, description="Environment variable holding a bearer token sent to the url."
    )
    tools: list[str] = Field(
        default_factory=list, description="Allow-list: the only tools of this server the LLM is offered."
    )
    read_only: list[str] = Field(
        default_factory=list,
        description="Tools (of the allow-list) without side effects: they may run on partial transcripts.",
    )
    timeout_s: float = Field(5.0, gt=0, description="Per-call timeout.")
    connect_timeout_s: float = Field(
        10.0, gt=0, description="Bound on starting/connecting to the server and listing its tools."
    )
    max_output_chars: int = Field(4000, ge=1, description="Longer tool outputs are cut to this size.")
    enabled: bool = Field(
        False, description="On for every session (server-wide); else only where a back-end or a session enables it."
    )

    @model_validator(mode="after")
    def _check(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of command (stdio) or url (streamable HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        for name in [*self.env_from.values(), *([self.bearer_token_env] if self.bearer_token_env else [])]:
            if not _ENV_NAME.match(name):
                raise ValueError("env_from values and bearer_token_env must be NAMES of environment variables")
        unknown = [t for t in self.read_only if t not in self.tools]
        if unknown:
            raise ValueError(f"read_only names tools missing from the allow-list: {', '.join(unknown)}")
        return self


class ToolsConfig(BaseModel):
    """Function tools of the back-end LLMs: the tool loop's bounds and the MCP servers."""

    model_config = ConfigDict(extra="forbid")

    max_rounds: int = Field(3, ge=1, le=10, description="Tool rounds per request; then the LLM must answer.")
    call_timeout_s: float = Field(5.0, gt=0, description="Default per-call timeout.")
    client_call_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Live API Responses delegation: how long a function the client runs may take before the "
        "back-end is told it returned nothing and answers anyway.",
    )
    cache_ttl_s: float = Field(
        30.0, ge=0, description="How long a read-only call's result is reused by later requests of the session."
    )
    max_output_chars: int = Field(4000, ge=1, description="Tool outputs are cut to this size before the LLM.")
    max_client_output_chars: int = Field(
        32768, ge=1, description="Longest function_call_output a /v1/realtime client may send (larger: an error)."
    )
    mcp_servers: dict[str, McpServerConfig] = Field(
        default_factory=dict, description="MCP servers by name (clients may enable them by name, never add one)."
    )
