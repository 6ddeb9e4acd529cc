"""Back-end settings: validation, presets, and the KAME_LLM_* environment back-end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from kame.backend.config import BackendConfig, LlmConfig
from kame.backend.presets import PRESETS, apply_preset
from kame.backend.registry import BackendRegistry
from kame.backend.resolve import BackendConfigError, resolve_backends
from kame.config import ConfigError, KameConfig, dump_yaml, load_config
from tests.support.llm_server import LlmServer

USER = [{"role": "user", "content": "Hi"}]
KEY = "sk-kametest-PRESET-5b1e0c"

PUBLIC_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1/",
    "gemini": "https://generativelanguage.googleapis.com/v1beta/openai/",
    "openrouter": "https://openrouter.ai/api/v1",
    "vllm": "http://localhost:8000/v1",
    "ollama": "http://localhost:11434/v1",
    "llamacpp": "http://localhost:8080/v1",
}


def kame(backends: dict[str, Any], **top: Any) -> KameConfig:
    return KameConfig.model_validate({"backends": backends, **top})


# ---------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "openai", "base_url": "http://x/v1", "bogus": 1},
        {"kind": "openai", "timeouts": {"first_token": 1}},
        {"kind": "openai", "caps": {"max_concurrent": 0}},
        {"kind": "nope"},
        {"kind": "scripted", "base_url": "http://x/v1"},
        {"kind": "scripted", "scripted": {"rules": {}, "speed": 3}},
        {"kind": "openai", "scripted": {"replies": ["x"]}},
        {"kind": "openai", "base_url": "localhost:8000"},
        {"kind": "openai", "preset": "not-a-preset"},
    ],
)
def test_bad_backend_settings_are_rejected(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BackendConfig.model_validate(data)


def test_llm_section_rejects_unknown_keys_and_kameconfig_has_it() -> None:
    with pytest.raises(ValidationError):
        LlmConfig.model_validate({"max_concurrent": 3})
    assert kame({}, llm={"max_concurrent_requests": 3}).llm.max_concurrent_requests == 3


def test_every_field_is_described() -> None:
    from kame.backend import config as mod

    for model in (mod.BackendConfig, mod.TimeoutsConfig, mod.CapsConfig, mod.BreakerConfig, mod.ScriptedConfig,
                  mod.LlmConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


def test_a_key_pasted_into_api_key_env_is_rejected_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides={"backends.x.api_key_env": KEY, "backends.x.preset": "openai"})
    assert KEY not in str(info.value)
    assert "api_key_env" in str(info.value)


# ---------------------------------------------------------------------- presets


def test_presets_have_documented_public_defaults() -> None:
    assert set(PRESETS) == set(PUBLIC_URLS)
    for name, url in PUBLIC_URLS.items():
        resolved = apply_preset(BackendConfig(preset=name))  # type: ignore[arg-type]
        assert resolved.base_url == url
    assert apply_preset(BackendConfig(preset="openai")).key_env_names() == ["OPENAI_API_KEY"]
    assert apply_preset(BackendConfig(preset="ollama")).key_env_names() == []
    assert apply_preset(BackendConfig(preset="gemini")).extra_body == {"reasoning_effort": "none"}


def test_preset_fields_can_be_overridden_and_deleted() -> None:
    cfg = BackendConfig.model_validate({
        "preset": "vllm", "model": "Qwen/Qwen3-8B", "api_key_env": "",
        "extra_body": {"chat_template_kwargs": None, "top_k": 20}, "headers": {"X-A": "1"},
    })
    full = apply_preset(cfg)
    assert full.model == "Qwen/Qwen3-8B"
    assert full.key_env_names() == []
    assert full.extra_body == {"top_k": 20}
    assert full.headers == {"X-A": "1"}
    # The table itself is not changed by resolving.
    assert dict(PRESETS["vllm"].extra_body)["chat_template_kwargs"]["enable_thinking"] is False


@pytest.mark.parametrize("preset", sorted(PUBLIC_URLS))
def test_each_preset_talks_to_the_local_server_when_base_url_is_overridden(llm_server: LlmServer, preset: str) -> None:
    spec = PRESETS[preset]
    environ = {name: KEY for name in spec.api_key_env}
    reg = BackendRegistry.from_config(kame({"p": {"preset": preset, "base_url": llm_server.base_url}}), environ)

    async def main() -> str:
        try:
            return await reg.stream("p", USER).text()
        finally:
            await reg.aclose()

    assert asyncio.run(main()) == "Hello there, how can I help you today?"
    req = llm_server.chat_requests()[0]
    assert req.model == (spec.model or "test-model")  # no suggestion: first of GET /models
    for key in spec.extra_body:
        assert key in req.body
    if preset == "gemini":
        assert req.body["reasoning_effort"] == "none"
    if preset == "vllm":
        assert req.body["chat_template_kwargs"] == {"enable_thinking": False}
    for header, value in spec.headers.items():
        assert req.headers[header.lower()] == value
    if spec.api_key_env:
        assert req.headers["authorization"] == f"Bearer {KEY}"
    else:
        assert "authorization" not in req.headers


# ---------------------------------------------------------------------- environment


def test_env_backend_becomes_the_default(llm_server: LlmServer) -> None:
    cfg = kame({"demo": {"kind": "scripted"}})
    environ = {"KAME_LLM_BASE_URL": llm_server.base_url, "KAME_LLM_MODEL": "env-model", "KAME_LLM_API_KEY": KEY,
               "OPENAI_API_KEY": "sk-other"}
    resolved = resolve_backends(cfg, environ)
    assert resolved.default == "env" and resolved.names == ["demo", "env"]
    env = resolved.backends["env"]
    assert env.base_url == llm_server.base_url and env.model == "env-model"
    assert env.key_env_names() == ["KAME_LLM_API_KEY", "OPENAI_API_KEY"]
    assert KEY not in env.model_dump_json() and KEY not in repr(resolved)
    # default_backend wins over the environment.
    assert resolve_backends(kame({"demo": {"kind": "scripted"}}, default_backend="demo"), environ).default == "demo"
    # Without KAME_LLM_*: the first configured back-end.
    assert resolve_backends(cfg, {}).default == "demo" and resolve_backends(cfg, {}).names == ["demo"]
    assert resolve_backends(kame({}), {}).default is None


def test_env_key_falls_back_to_openai_api_key(llm_server: LlmServer) -> None:
    environ = {"KAME_LLM_BASE_URL": llm_server.base_url, "KAME_LLM_MODEL": "m", "OPENAI_API_KEY": "sk-openai-fallback"}
    reg = BackendRegistry.from_config(kame({}), environ)

    async def main() -> None:
        await reg.stream(None, USER).text()
        environ["KAME_LLM_API_KEY"] = KEY  # read at request time
        await reg.stream(None, USER).text()

    asyncio.run(main())
    first, second = llm_server.chat_requests()
    assert first.headers["authorization"] == "Bearer sk-openai-fallback"
    assert second.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in dump_yaml(kame({}))


def test_env_overrides_url_and_model_of_a_configured_env_backend() -> None:
    cfg = kame({"env": {"preset": "ollama", "description": "mine"}})
    resolved = resolve_backends(cfg, {"KAME_LLM_BASE_URL": "http://gpu-box:11434/v1"})
    env = resolved.backends["env"]
    assert env.base_url == "http://gpu-box:11434/v1" and env.model == "llama3.2" and env.description == "mine"
    only_model = resolve_backends(kame({}), {"KAME_LLM_MODEL": "gpt-4.1-mini"}).backends["env"]
    assert only_model.base_url == "https://api.openai.com/v1" and only_model.model == "gpt-4.1-mini"
    with pytest.raises(BackendConfigError, match="KAME_LLM_BASE_URL"):
        resolve_backends(kame({}), {"KAME_LLM_BASE_URL": "localhost:8000"})


@pytest.mark.parametrize(
    ("backends", "top", "match"),
    [
        ({"a": {"kind": "scripted"}}, {"default_backend": "b"}, "default_backend: unknown back-end 'b'; valid: a"),
        ({"a": {"kind": "scripted", "fallback": "zz"}}, {}, "fallback: unknown back-end 'zz'"),
        ({"a": {"kind": "scripted", "fallback": "a"}}, {}, "its own fallback"),
        ({"a": {"kind": "openai", "model": "m"}}, {}, "needs base_url or a preset"),
    ],
)
def test_inconsistent_backends_give_clear_errors(backends: dict[str, Any], top: dict[str, Any], match: str) -> None:
    with pytest.raises(BackendConfigError, match=match):
        resolve_backends(kame(backends, **top), {})


def test_yaml_config_builds_a_working_registry(tmp_path: Any, llm_server: LlmServer) -> None:
    path = tmp_path / "kame.yaml"
    path.write_text(
        "backends:\n"
        "  local:\n"
        "    preset: vllm\n"
        f"    base_url: {llm_server.base_url}\n"
        "    fallback: demo\n"
        "    caps: {max_concurrent: 4}\n"
        "  demo:\n"
        "    kind: scripted\n"
        "    scripted: {first_token_delay_s: 0, chunks_per_s: 1000, replies: [canned]}\n"
        "default_backend: local\n"
        "llm: {max_concurrent_requests: 8}\n"
    )
    cfg = load_config(path, environ={})
    reg = BackendRegistry.from_config(cfg, {})
    assert reg.names == ["local", "demo"] and reg.default_name == "local"

    async def main() -> list[str]:
        return [await reg.stream(None, USER).text(), await reg.stream("demo", USER).text()]

    assert asyncio.run(main()) == ["Hello there, how can I help you today?", "canned"]
