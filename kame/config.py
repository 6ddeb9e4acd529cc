"""The whole configuration, and how it is assembled.

Precedence: command-line flag > environment variable > YAML file > default.
Environment variables are ``KAME_`` + the setting's dotted path in upper case
with ``__`` between levels (``KAME_SERVER__PORT=9000``,
``KAME_FRONTEND__SAMPLING__TEMP=0.6``); top-level keys need no ``__``
(``KAME_CACHE_DIR``, ``KAME_DEVICE``). A few short aliases exist
(:data:`ENV_ALIASES`). Values are parsed as YAML scalars, so ``8``, ``true``
and ``[a, b]`` mean what they look like.

A name with ``__`` is meant as a setting: one that names no setting is an
error. A name without ``__`` that is neither a top-level setting nor a
documented alias is ignored with one warning line naming it: Kubernetes
injects ``KAME_SERVICE_HOST``, ``KAME_PORT=tcp://...`` and the like into
every pod of a namespace that has a Service named ``kame``, and those must
not stop the server.
"""

from __future__ import annotations

import logging
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from kame.asr.config import AsrConfig
from kame.backend.config import BackendConfig, LlmConfig, ToolsConfig
from kame.frontend.config import FrontendConfig
from kame.oracle.config import OracleConfig

ENV_PREFIX = "KAME_"
#: Short environment names for settings that people set by hand.
ENV_ALIASES: dict[str, str] = {
    "KAME_AUTH_TOKEN": "server.auth_token",
    "KAME_CHECKPOINT": "frontend.checkpoint",
}
#: KAME_ variables that are not settings of this model (read elsewhere: the project's own scripts, tests and
#: compose files). A kame command run where one is set (``KAME_VENVS=... ./scripts/test.sh``) must not warn.
ENV_NOT_SETTINGS = frozenset(
    {
        "KAME_CONFIG",  # path of the YAML file
        "KAME_LLM_BASE_URL",  # the default back-end, see kame.backend
        "KAME_LLM_MODEL",
        "KAME_LLM_API_KEY",
        "KAME_TORCH_SPEC",  # scripts/install.sh
        "KAME_TORCH_INDEX",
        "KAME_PYTHON",
        "KAME_VENV_SYSTEM_SITE",
        "KAME_LINT_PYTHON",  # scripts/lint.sh
        "KAME_VENVS",  # scripts/test_frameworks.sh: where the frameworks' virtualenvs live
        "KAME_IMAGE_CACHE",  # scripts/test_image.sh
        "KAME_IMAGE_DOCKER",
        "KAME_UPDATE_GOLDEN",  # tests/support/golden.py: rewrite the golden logs
        "KAME_TEST_CACHE_DIR",  # tests/support/real_width.py: the released-width checkpoint, kept between runs
        "KAME_IMAGE",  # deploy/docker-compose.cpu.yml, read by docker-compose on the host
        "KAME_PORT_HOST",
    }
)
SECRET_MASK = "***"

log = logging.getLogger("kame.config")
#: Ignored environment names already warned about in this process (one line each).
_warned_env: set[str] = set()


def _default_cache_dir() -> Path:
    return Path(os.path.expanduser("~/.cache/kame"))


class KameConfig(BaseModel):
    """The core's settings: models, speech recognition, the oracle, LLM back-ends and tools.

    Applications compose it: the server's config (:class:`kame.server.config.AppConfig`, what
    every ``kame`` command loads) adds the ``server`` and ``log`` sections; this module never
    imports the server.
    """

    model_config = ConfigDict(extra="forbid")

    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Where tiny checkpoints and other generated files live (env KAME_CACHE_DIR).",
    )
    device: str = Field("auto", description="auto (CUDA when present, else CPU), cpu, cuda or cuda:N.")
    frontend: FrontendConfig = Field(default_factory=FrontendConfig)
    asr: AsrConfig = Field(default_factory=AsrConfig)
    oracle: OracleConfig = Field(default_factory=OracleConfig)
    backends: dict[str, BackendConfig] = Field(
        default_factory=dict, description="Named LLM back-ends; clients pick them by name."
    )
    default_backend: str | None = Field(
        None, description="Name of the back-end new sessions use (None: the first, or the one from KAME_LLM_*)."
    )
    llm: LlmConfig = Field(default_factory=LlmConfig, description="Caps over all LLM back-ends together.")
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description="Function tools and MCP servers.")

    @classmethod
    def normalize_layer(cls, tree: dict[str, Any], where: str) -> dict[str, Any]:
        """A hook for one layer (file, environment, flags) before the layers merge: renamed settings
        are moved here by models that have some. ``where`` names the layer for messages."""
        return tree

    @model_validator(mode="after")
    def _mcp_names(self) -> KameConfig:
        for name, backend in self.backends.items():
            unknown = [m for m in backend.mcp_servers if m not in self.tools.mcp_servers]
            if unknown:
                raise ValueError(
                    f"backends.{name}.mcp_servers: {', '.join(unknown)} not in tools.mcp_servers"
                )
        return self


Config = TypeVar("Config", bound=KameConfig)


class ConfigError(ValueError):
    """A bad setting; the message is one line naming the key."""


# --------------------------------------------------------------------------- assembling


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (``X``, ``X | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _is_mapping(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (dict, Mapping):
        return True
    return any(_is_mapping(arg) for arg in typing.get_args(annotation) if typing.get_origin(arg) is not None)


def setting_exists(dotted: str, model: type[BaseModel] | None = None) -> bool:
    """Whether ``dotted`` (``frontend.batch_size``) names a setting of ``model`` (:class:`KameConfig`).

    Below a mapping field (``backends.NAME....``) any path is accepted here;
    pydantic validates it with the rest of the layer.
    """
    node: type[BaseModel] = model or KameConfig
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        field = node.model_fields.get(part)
        if field is None:
            return False
        last = i == len(parts) - 1
        if last:
            return True
        if _is_mapping(field.annotation):
            return True
        models = _models_in(field.annotation)
        if not models:
            return False
        node = models[0]
    return True


def is_env_alias(name: str) -> bool:
    """A documented KAME_ name that is not ``KAME_`` + a dotted path."""
    return name in ENV_ALIASES or name in ENV_NOT_SETTINGS


def ignored_env_names(environ: Mapping[str, str], model: type[BaseModel] = KameConfig) -> list[str]:
    """``KAME_`` names without ``__`` that are no setting and no alias (ignored, with a warning)."""
    top_fields = set(model.model_fields)
    out = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or is_env_alias(name) or "__" in name:
            continue
        if name[len(ENV_PREFIX) :].lower() not in top_fields:
            out.append(name)
    return out


def _warn_ignored(name: str) -> None:
    if name in _warned_env:
        return
    _warned_env.add(name)
    log.warning(
        "environment variable %s is not a kame setting: ignored "
        "(settings are KAME_<SECTION>__<KEY>; Kubernetes service links inject such names)",
        name,
    )


def env_overrides(
    environ: Mapping[str, str], *, warn: bool = True, model: type[BaseModel] = KameConfig
) -> dict[str, Any]:
    """Settings of ``model`` found in ``environ`` as a nested dict.

    A ``__`` name that names no setting raises :class:`ConfigError`; other
    unknown ``KAME_`` names are skipped (one warning line each, values never
    logged), and so are aliases of settings ``model`` does not have
    (``KAME_AUTH_TOKEN`` without the server's sections).
    """
    tree: dict[str, Any] = {}
    ignored = set(ignored_env_names(environ, model))
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        if name in ignored:
            if warn:
                _warn_ignored(name)
            continue
        if name in ENV_ALIASES:
            dotted = ENV_ALIASES[name]
            if not setting_exists(dotted, model):
                continue
        else:
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            if not setting_exists(dotted, model):
                raise ConfigError(f"environment variable {name}: no such setting '{dotted}'")
        _set_path(tree, dotted, _parse_scalar(raw))
    return tree


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p}: not found")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" line {line + 1}" if line is not None else ""
        raise ConfigError(f"config file {p}{where}: invalid YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: the top level must be a mapping")
    return data


def _format_error(exc: ValidationError, source: str) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    else:
        msg = err["msg"]
        if "input" in err and not isinstance(err["input"], (dict, list)):
            msg += f" (got {err['input']!r})"
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{source}: {key}: {msg}{more}"


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    model: type[Config] = KameConfig,  # type: ignore[assignment]  # (the TypeVar's bound: the core)
) -> Config:
    """Build the effective ``model`` config: defaults < YAML file < environment < ``overrides``.

    ``overrides`` maps dotted keys (``"frontend.batch_size"``) to values from flags.
    ``path`` None falls back to ``$KAME_CONFIG``. Names of built-in configs
    (``default``, ``cpu-demo``) are accepted as well as paths.
    """
    environ = os.environ if environ is None else environ
    if path is None:
        path = environ.get("KAME_CONFIG") or None
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        resolved = resolve_config_path(path)
        data = read_yaml(resolved)
        source = f"config {resolved}"
    env_tree = env_overrides(environ, model=model)
    flag_tree: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(flag_tree, dotted, value)
    # Validate each layer on its own first so an error names where it came from.
    try:
        data, env_tree, flag_tree = (model.normalize_layer(data, source), model.normalize_layer(env_tree, "environment"),
                                     model.normalize_layer(flag_tree, "command line"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for layer, where in ((data, source), (env_tree, "environment"), (flag_tree, "command line")):
        if layer:
            try:
                model.model_validate(layer)
            except ValidationError as exc:
                raise ConfigError(_format_error(exc, where)) from None
    merged = _deep_merge(_deep_merge(data, env_tree), flag_tree)
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, "config")) from None


def builtin_config_dir() -> Path:
    import kame.configs

    return Path(kame.configs.__file__).parent


def resolve_config_path(path: str | Path) -> Path:
    """A path, or the name of a built-in config such as ``cpu-demo``."""
    p = Path(path)
    if p.exists():
        return p
    if p.suffix == "" and p.parent == Path("."):
        builtin = builtin_config_dir() / f"{p.name}.yaml"
        if builtin.exists():
            return builtin
    raise ConfigError(f"config file {p}: not found")


# --------------------------------------------------------------------------- showing


def _is_secret_name(name: str) -> bool:
    lowered = name.lower()
    return any(s in lowered for s in ("api_key", "token", "secret", "password", "authorization"))


def masked_dump(cfg: BaseModel) -> dict[str, Any]:
    """The config as plain data with every secret replaced by ``***``."""

    def walk(value: Any, name: str = "") -> Any:
        if isinstance(value, SecretStr):
            return SECRET_MASK if value.get_secret_value() else ""
        if isinstance(value, BaseModel):
            return {k: walk(getattr(value, k), k) for k in type(value).model_fields}
        if isinstance(value, dict):
            return {k: (SECRET_MASK if _is_secret_name(str(k)) and v else walk(v, str(k))) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v, name) for v in value]
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, str) and _is_secret_name(name) and value:
            return SECRET_MASK
        return value

    return walk(cfg)


def dump_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(masked_dump(cfg), sort_keys=False, default_flow_style=False)
