"""From ``KameConfig`` + environment to the final set of named back-ends.

Pure: it reads the environ mapping it is given and returns new config
objects. Only environment variable NAMES end up in the result; keys stay in
the environment and are read at request time, so dumps of the resolved
config can never contain one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from pydantic import ValidationError

from kame.backend.config import BackendConfig
from kame.backend.presets import PRESETS, apply_preset
from kame.errors import UserError

if TYPE_CHECKING:  # kame.config imports this package: no runtime import
    from kame.config import KameConfig

ENV_BACKEND_NAME = "env"
ENV_BASE_URL = "KAME_LLM_BASE_URL"
ENV_MODEL = "KAME_LLM_MODEL"
ENV_API_KEY = "KAME_LLM_API_KEY"
ENV_API_KEY_FALLBACK = "OPENAI_API_KEY"


class BackendConfigError(UserError):
    """The back-end settings do not add up (unknown default, dangling fallback, no URL)."""


@dataclass(frozen=True)
class ResolvedBackends:
    """Every back-end with presets applied, and the name new sessions use."""

    backends: Mapping[str, BackendConfig]
    default: str | None

    @property
    def names(self) -> list[str]:
        return list(self.backends)


def _env_backend(existing: BackendConfig | None, environ: Mapping[str, str]) -> BackendConfig | None:
    base_url = (environ.get(ENV_BASE_URL) or "").strip() or None
    model = (environ.get(ENV_MODEL) or "").strip() or None
    if base_url is None and model is None:
        return existing
    update: dict[str, object] = {}
    if base_url is not None:
        update["base_url"] = base_url
    if model is not None:
        update["model"] = model
    if existing is not None:
        data = {**existing.model_dump(exclude_unset=True), **update}
    else:
        if base_url is None:
            update["preset"] = "openai"  # only a model given: OpenAI's endpoint
        data = {
            "kind": "openai",
            "description": f"from ${ENV_BASE_URL}" if base_url else f"from ${ENV_MODEL}",
            "api_key_env": [ENV_API_KEY, ENV_API_KEY_FALLBACK],
            **update,
        }
    try:
        return BackendConfig.model_validate(data)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise BackendConfigError(f"${ENV_BASE_URL} / ${ENV_MODEL}: {msg}") from None


def resolve_backends(cfg: KameConfig, environ: Mapping[str, str]) -> ResolvedBackends:
    """The named back-ends of ``cfg`` plus the one defined by ``KAME_LLM_*``, validated.

    ``KAME_LLM_BASE_URL`` and/or ``KAME_LLM_MODEL`` define (or, when the file
    already has one, override the URL/model of) the back-end named ``env``,
    whose key comes from ``KAME_LLM_API_KEY`` or else ``OPENAI_API_KEY``.
    Default: ``default_backend`` if set, else ``env`` if it exists, else the
    first back-end in the file.
    """
    backends: dict[str, BackendConfig] = dict(cfg.backends)
    env_cfg = _env_backend(backends.get(ENV_BACKEND_NAME), environ)
    from_env = any((environ.get(v) or "").strip() for v in (ENV_BASE_URL, ENV_MODEL))
    if env_cfg is not None:
        backends[ENV_BACKEND_NAME] = env_cfg
    resolved: dict[str, BackendConfig] = {}
    for name, bcfg in backends.items():
        if not name or any(c.isspace() for c in name):
            raise BackendConfigError(f"backends: {name!r} is not a usable back-end name")
        full = apply_preset(bcfg)
        if full.kind == "openai" and not full.base_url:
            raise BackendConfigError(
                f"backends.{name}: needs base_url or a preset ({', '.join(PRESETS)})"
            )
        resolved[name] = full
    for name, full in resolved.items():
        if full.fallback is not None:
            if full.fallback == name:
                raise BackendConfigError(f"backends.{name}.fallback: a back-end cannot be its own fallback")
            if full.fallback not in resolved:
                raise BackendConfigError(
                    f"backends.{name}.fallback: unknown back-end {full.fallback!r}; valid: {', '.join(resolved)}"
                )
    if cfg.default_backend is not None:
        if cfg.default_backend not in resolved:
            valid = ", ".join(resolved) or "(none configured)"
            raise BackendConfigError(f"default_backend: unknown back-end {cfg.default_backend!r}; valid: {valid}")
        default: str | None = cfg.default_backend
    elif from_env:
        default = ENV_BACKEND_NAME
    else:
        default = next(iter(resolved), None)
    return ResolvedBackends(MappingProxyType(resolved), default)
