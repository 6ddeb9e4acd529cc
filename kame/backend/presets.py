"""Provider presets: the defaults that make ``preset: gemini`` enough to get going.

Every field of a preset can be overridden in the back-end's config. The
model names are suggestions (small, fast models suit KAME: the answer is
useful only if its first words arrive within a second or so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kame.backend.config import BackendConfig


@dataclass(frozen=True)
class Preset:
    """Defaults of one provider."""

    name: str
    title: str
    base_url: str
    api_key_env: tuple[str, ...]
    model: str | None
    #: The suggested model's context window in tokens (None: unknown, it depends on the served model).
    context_tokens: int | None = None
    #: The window is the server's setting (Ollama's num_ctx, llama-server's -c), whatever the model.
    server_window: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    note: str = ""


def _frozen(d: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(d)


PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        p.name: p
        for p in (
            Preset(
                name="openai",
                title="OpenAI",
                base_url="https://api.openai.com/v1",
                api_key_env=("OPENAI_API_KEY",),
                model="gpt-4.1-nano",
                context_tokens=1_047_576,
                note="gpt-4.1-nano made KAME's training predictions; gpt-4.1 was the paper's best back-end.",
            ),
            Preset(
                name="anthropic",
                title="Anthropic (OpenAI-compatible endpoint)",
                base_url="https://api.anthropic.com/v1/",
                api_key_env=("ANTHROPIC_API_KEY",),
                model="claude-haiku-4-5",
                context_tokens=200_000,
                note="Extended thinking is off unless extra_body sets thinking; temperature is capped at 1.",
            ),
            Preset(
                name="gemini",
                title="Google Gemini (OpenAI-compatible endpoint)",
                base_url="https://generativelanguage.googleapis.com/v1beta/openai/",
                api_key_env=("GEMINI_API_KEY",),
                model="gemini-2.5-flash",
                context_tokens=1_048_576,
                extra_body=_frozen({"reasoning_effort": "none"}),
                note="reasoning_effort none switches thinking off (it delays the first token by seconds).",
            ),
            Preset(
                name="openrouter",
                title="OpenRouter",
                base_url="https://openrouter.ai/api/v1",
                api_key_env=("OPENROUTER_API_KEY",),
                model="openai/gpt-4.1-nano",
                context_tokens=1_047_576,
                headers=_frozen({"X-Title": "kame"}),
            ),
            Preset(
                name="vllm",
                title="vLLM (local OpenAI-compatible server)",
                base_url="http://localhost:8000/v1",
                api_key_env=("VLLM_API_KEY",),
                model=None,
                extra_body=_frozen({"chat_template_kwargs": _frozen({"enable_thinking": False})}),
                note="model null: the first served model; enable_thinking false silences Qwen3-style thinking.",
            ),
            Preset(
                name="ollama",
                title="Ollama",
                base_url="http://localhost:11434/v1",
                api_key_env=(),
                model="llama3.2",
                context_tokens=4096,
                server_window=True,
                note="No key needed. Ollama cuts prompts to its num_ctx (4096 by default): raise both together.",
            ),
            Preset(
                name="llamacpp",
                title="llama.cpp server (llama-server)",
                base_url="http://localhost:8080/v1",
                api_key_env=("LLAMA_API_KEY",),
                model=None,
                context_tokens=4096,
                server_window=True,
                note="The key is only needed when llama-server runs with --api-key; the window is its -c (4096).",
            ),
        )
    }
)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Shallow merge; a ``None`` value in ``over`` deletes the key."""
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def apply_preset(cfg: BackendConfig) -> BackendConfig:
    """``cfg`` with its preset's defaults filled in (fields set in ``cfg`` win)."""
    if cfg.kind != "openai":
        return cfg
    if cfg.preset is None:
        return cfg.model_copy(update={"extra_body": _merge({}, cfg.extra_body)})
    preset = PRESETS[cfg.preset]
    update: dict[str, Any] = {
        "headers": _merge(preset.headers, cfg.headers),
        "extra_body": _merge(_plain(preset.extra_body), cfg.extra_body),
    }
    if cfg.base_url is None:
        update["base_url"] = preset.base_url
    if cfg.model is None:
        update["model"] = preset.model
    if cfg.api_key_env is None:
        update["api_key_env"] = list(preset.api_key_env)
    if cfg.context_tokens is None and preset.context_tokens is not None \
            and (preset.server_window or cfg.model is None or cfg.model == preset.model):
        update["context_tokens"] = preset.context_tokens  # the window of the preset's model, not of another one
    return cfg.model_copy(update=update)


def _plain(value: Any) -> Any:
    """Mutable deep copy of a frozen preset value (so callers cannot alter the table)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
