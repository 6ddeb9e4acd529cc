"""Render ``docs/configuration.md`` from the pydantic models (a test keeps it in sync)."""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from kame.config import ENV_ALIASES

HEADER = """# Configuration

Generated from the pydantic models by `kame config docs`; do not edit by hand
(`tests/test_config.py` fails when this file and the models disagree).

Every setting can come from a YAML file (`--config FILE`, or a built-in name:
`default`, `cpu-demo`), from an environment variable, or from a command-line
flag where one exists. Precedence: **flag > environment > file > default**.
Unknown keys and bad values stop kame with one line naming the key.

Environment variables are `KAME_` + the dotted path in upper case with `__`
between levels: `KAME_SERVER__PORT=9000`, `KAME_FRONTEND__SAMPLING__TEMP=0.6`,
`KAME_CACHE_DIR=/data/kame`. Values are read as YAML scalars (`8`, `true`,
`[a, b]`). Other variables: `KAME_CONFIG` (the config file),
`KAME_LLM_BASE_URL` / `KAME_LLM_MODEL` / `KAME_LLM_API_KEY` (the default
LLM back-end, see [backends](backends.md)), `KAME_AUTH_TOKEN` and
`KAME_CHECKPOINT` (short names for `server.auth_token` and
`frontend.checkpoint`).

A name with `__` must name a setting: `KAME_SERVER__PROT` stops kame with
one line naming it. A `KAME_` name without `__` that is neither a top-level
setting nor one of the names above is ignored with one warning line naming
it (never its value): Kubernetes injects `KAME_SERVICE_HOST`,
`KAME_SERVICE_PORT`, `KAME_PORT=tcp://...` and `KAME_PORT_<port>_TCP_*`
into every pod of a namespace with a Service named `kame`
(`enableServiceLinks: false` in the pod spec turns them off).

`kame config show [--config FILE]` prints the effective configuration with
secrets masked.
"""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " \\| ".join(_type_name(a) for a in args)
    if origin in (dict, list, tuple):
        inner = ", ".join(_type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: Any) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(section)"
        if field.default_factory.__name__ == "_default_cache_dir":
            return "`~/.cache/kame`"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "(required)"
    if value is None:
        return "`null`"
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    return f"`{json.dumps(value, default=str)}`"


def _env_name(dotted: str) -> str:
    for alias, target in ENV_ALIASES.items():
        if target == dotted:
            return f"`{alias}`"
    return "`KAME_" + dotted.upper().replace(".", "__") + "`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _dict_value_model(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is dict:
        args = typing.get_args(annotation)
        if len(args) == 2:
            return _model_of(args[1])
    return None


def _section(model: type[BaseModel], prefix: str, out: list[str], title: str) -> None:
    rows: list[str] = []
    subsections: list[tuple[type[BaseModel], str, str]] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        sub = _model_of(field.annotation)
        if sub is not None:
            subsections.append((sub, dotted + ".", dotted))
            continue
        value_model = _dict_value_model(field.annotation)
        if value_model is not None:
            subsections.append((value_model, dotted + ".NAME.", f"{dotted}.NAME"))
        desc = (field.description or "").replace("|", "\\|")
        env = _env_name(dotted) if "NAME" not in dotted else "(file only)"
        rows.append(f"| `{dotted}` | {_type_name(field.annotation)} | {_default_text(field)} | {env} | {desc} |")
    out.append(f"\n## `{title}`\n")
    doc = (model.__doc__ or "").strip()
    if doc:
        out.append(doc.splitlines()[0] + "\n")
    if rows:
        out.append("| key | type | default | environment | description |")
        out.append("| --- | --- | --- | --- | --- |")
        out.extend(rows)
    for sub, sub_prefix, sub_title in subsections:
        _section(sub, sub_prefix, out, sub_title)


def render_markdown(model: type[BaseModel]) -> str:
    """The page for ``model`` (``kame config docs`` renders the whole config, kame.server.config.AppConfig)."""
    out: list[str] = [HEADER.rstrip("\n")]
    _section(model, "", out, "(top level)")
    return "\n".join(out) + "\n"
