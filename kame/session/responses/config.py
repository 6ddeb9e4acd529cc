"""A client's Responses delegation config -> the answer source's settings (:mod:`.settings`). No I/O.

The rules hold whatever wire the config came in on (``param`` names where, for errors); the full
table is in docs/protocol.md. ``model`` names a configured back-end, else a model for the default one;
``instructions`` go into the back-end's system message; ``function`` tools are the client's. An
``mcp`` tool may only name (``server_label``) an MCP server the operator configured: anything that
would make kame connect where the client chose (``server_url``, ``connector_id``, ...) is refused, as
are hosted tools. ``reasoning``, ``text`` and ``service_tier`` are accepted and reported as ignored
(an ``error`` would stop Pipecat).

A config or update is validated as a whole before anything changes: one
:class:`DelegationConfigError` and nothing applied, or new settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from kame.session.function_tools import FunctionTool, ToolErrors, function_tool, tool_list, unique
from kame.session.responses.settings import (
    BackendCatalog,
    BackendTarget,
    DelegationConfigError,
    McpServerRef,
    ResponsesDelegationSettings,
    ToolChoiceSpec,
)

#: Where the Live API's ``session.start`` / ``session.update`` keep this object (the default ``param``).
PARAM = "session.delegation.responses"
MAX_INSTRUCTIONS_CHARS = 64_000
MAX_MODEL_CHARS = 200

#: The Live API's names for the faults of a client's tools (:mod:`kame.session.function_tools` checks them).
ERRORS = ToolErrors(lambda code, message, param: DelegationConfigError(code, message, param=param),
                    wrong_type="invalid_type", too_long="string_above_max_length",
                    too_many="array_above_max_length", missing="invalid_value")

#: Every field of ``ResponsesDelegationConfig`` (openai SDK 3.57).
KNOWN_FIELDS = (
    "model",
    "instructions",
    "max_output_tokens",
    "parallel_tool_calls",
    "reasoning",
    "service_tier",
    "text",
    "tool_choice",
    "tools",
)
#: Accepted, not used (the wire reports them in an ``info``).
IGNORED_FIELDS = ("reasoning", "service_tier", "text")
_FUNCTION_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
_MCP_REMOTE_KEYS = ("server_url", "connector_id", "tunnel_id", "headers", "authorization")
_MCP_KEYS = frozenset(
    {
        "type",
        "server_label",
        "allowed_tools",
        "require_approval",
        "server_description",
        "allowed_callers",
        "defer_loading",
        *_MCP_REMOTE_KEYS,
    }
)
#: Tool types of the Live API that are hosted by OpenAI (no counterpart in kame).
HOSTED_TOOL_TYPES = (
    "web_search",
    "file_search",
    "code_interpreter",
    "shell",
    "image_generation",
    "custom",
    "namespace",
    "tool_search",
    "programmatic_tool_calling",
    "computer",
    "apply_patch",
)
_CHOICE_MODES = ("auto", "none", "required")
_MODES: dict[str, Literal["auto", "none", "required"]] = {"auto": "auto", "none": "none", "required": "required"}


# --------------------------------------------------------------------------- parsing


def parse_responses_config(raw: object, catalog: BackendCatalog, *, param: str = PARAM) -> ResponsesDelegationSettings:
    """Validate a whole ``delegation.responses`` object (``session.start``); raises :class:`DelegationConfigError`."""
    obj = _mapping(raw, param)
    if "model" not in obj:
        raise DelegationConfigError("missing_required_parameter", f"{param}.model is required", param=f"{param}.model")
    return _build(obj, None, catalog, param)


def update_responses_config(
    current: ResponsesDelegationSettings, raw: object, catalog: BackendCatalog, *, param: str = PARAM
) -> ResponsesDelegationSettings:
    """Apply a ``session.update``'s ``delegation.responses``: omitted fields keep their values, ``tools`` replaces."""
    return _build(_mapping(raw, param), current, catalog, param)


def _build(
    obj: Mapping[str, Any],
    current: ResponsesDelegationSettings | None,
    catalog: BackendCatalog,
    param: str,
) -> ResponsesDelegationSettings:
    unknown = [k for k in obj if k not in KNOWN_FIELDS]
    if unknown:
        raise DelegationConfigError(
            "unknown_parameter",
            f"{param}: unknown field(s) {', '.join(sorted(map(str, unknown)))}; known: {', '.join(KNOWN_FIELDS)}",
            param=f"{param}.{unknown[0]}",
        )
    model = current.model if current is not None else ""
    target = current.target if current is not None else None
    if "model" in obj:
        model = _model(obj["model"], f"{param}.model")
        target = resolve_target(model, catalog, param=f"{param}.model")
    assert target is not None
    instructions = current.instructions if current is not None else None
    if "instructions" in obj:
        instructions = _instructions(obj["instructions"], f"{param}.instructions")
    functions = current.functions if current is not None else ()
    mcp = current.mcp_servers if current is not None else ()
    if "tools" in obj and obj["tools"] is not None:
        functions, mcp = _tools(obj["tools"], catalog, f"{param}.tools")
    choice = current.tool_choice if current is not None else ToolChoiceSpec()
    if "tool_choice" in obj and obj["tool_choice"] is not None:
        choice = _tool_choice(obj["tool_choice"], functions, mcp, catalog, f"{param}.tool_choice")
    elif "tools" in obj:
        choice = _recheck_choice(choice, functions, mcp, catalog, f"{param}.tool_choice")
    max_output = current.max_output_tokens if current is not None else None
    if "max_output_tokens" in obj:
        max_output = _max_tokens(obj["max_output_tokens"], f"{param}.max_output_tokens")
    parallel = current.parallel_tool_calls if current is not None else True
    if "parallel_tool_calls" in obj and obj["parallel_tool_calls"] is not None:
        if not isinstance(obj["parallel_tool_calls"], bool):
            raise DelegationConfigError(
                "invalid_type", f"{param}.parallel_tool_calls must be a boolean", param=f"{param}.parallel_tool_calls"
            )
        parallel = obj["parallel_tool_calls"]
    ignored = dict(current.ignored) if current is not None else {}
    for name in IGNORED_FIELDS:
        if obj.get(name) is not None:
            ignored[name] = obj[name]
    if (functions or mcp) and target.backend not in catalog.tools_allowed:
        raise DelegationConfigError(
            "tools_not_allowed",
            f"{param}.tools: back-end {target.backend!r} may not be sent tools (its tools setting is off); "
            f"back-ends that may: {', '.join(sorted(catalog.tools_allowed)) or '(none)'}",
            param=f"{param}.tools",
        )
    if choice.mode == "required" and choice.forced is None and not _any_offered(choice, functions, mcp, catalog):
        raise DelegationConfigError(
            "invalid_value", f"{param}.tool_choice: 'required' but no tool is on offer", param=f"{param}.tool_choice"
        )
    return ResponsesDelegationSettings(
        model=model,
        target=target,
        instructions=instructions,
        functions=functions,
        mcp_servers=mcp,
        tool_choice=choice,
        max_output_tokens=max_output,
        parallel_tool_calls=parallel,
        ignored=ignored,
    )


def resolve_target(model: str, catalog: BackendCatalog, *, param: str = f"{PARAM}.model") -> BackendTarget:
    """``model`` as a configured back-end's name, else as a model on the default back-end."""
    if model in catalog.backends:
        return BackendTarget(model, None)
    if catalog.default is None:
        raise DelegationConfigError(
            "invalid_value",
            f"{param}: {model!r} is not a configured back-end and the server has no default back-end; "
            f"configured: {', '.join(catalog.backends) or '(none)'}",
            param=param,
        )
    if catalog.default not in catalog.model_override:
        # A scripted default (the CPU demo) has no models: the delegation runs on it as it is.
        return BackendTarget(catalog.default, None)
    return BackendTarget(catalog.default, model)


def model_notice(model: str, target: BackendTarget) -> str | None:
    """Why ``model`` is not the model the back-end is asked for (None: it is, or it names the back-end)."""
    if model == target.backend or target.model == model:
        return None
    return (
        f"{model!r} is not a configured back-end, and the default back-end {target.backend!r} takes no model "
        "name: the delegation runs on it as configured"
    )


# --------------------------------------------------------------------------- fields


def _mapping(raw: object, param: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise DelegationConfigError("invalid_type", f"{param} must be an object", param=param)
    return raw


def _model(value: object, param: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DelegationConfigError("invalid_value", f"{param} must be a non-empty string", param=param)
    if len(value) > MAX_MODEL_CHARS or any(c.isspace() for c in value):
        raise DelegationConfigError(
            "invalid_value",
            f"{param}: not a usable model or back-end name (no spaces, at most {MAX_MODEL_CHARS} characters)",
            param=param,
        )
    return value


def _instructions(value: object, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DelegationConfigError("invalid_type", f"{param} must be a string or null", param=param)
    if len(value) > MAX_INSTRUCTIONS_CHARS:
        raise DelegationConfigError(
            "string_above_max_length", f"{param}: at most {MAX_INSTRUCTIONS_CHARS} characters", param=param
        )
    return value if value.strip() else None


def _max_tokens(value: object, param: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DelegationConfigError("invalid_value", f"{param} must be a positive integer or null", param=param)
    return value


def _tools(
    value: object, catalog: BackendCatalog, param: str
) -> tuple[tuple[FunctionTool, ...], tuple[McpServerRef, ...]]:
    value = tool_list(value, param, ERRORS)
    refused: list[str] = []
    first_refused: str | None = None
    functions: list[FunctionTool] = []
    mcp: list[McpServerRef] = []
    for i, tool in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(tool, Mapping):
            raise DelegationConfigError("invalid_type", f"{where} must be an object", param=where)
        kind = tool.get("type")
        if kind == "function":
            functions.append(_function(tool, where))
        elif kind == "mcp":
            remote = [k for k in _MCP_REMOTE_KEYS if tool.get(k) is not None]
            if remote:
                refused.append(f"mcp with {'/'.join(remote)} ({where})")
                first_refused = first_refused or where
                continue
            mcp.append(_mcp_ref(tool, catalog, where))
        elif isinstance(kind, str) and kind in HOSTED_TOOL_TYPES:
            refused.append(f"{kind} ({where})")
            first_refused = first_refused or where
        else:
            raise DelegationConfigError(
                "invalid_value", f"{where}.type: unknown tool type {kind!r}", param=f"{where}.type"
            )
    if refused:
        configured = ", ".join(sorted(catalog.mcp_servers)) or "none"
        raise DelegationConfigError(
            "unsupported_tool",
            f"{param}: kame runs no hosted tools; refused: {'; '.join(refused)}. Use function tools (your client "
            f'runs them) or an MCP server configured on this server, given as {{"type": "mcp", '
            f'"server_label": NAME}} (configured: {configured})',
            param=first_refused,
        )
    unique(functions, param, ERRORS)
    labels = [m.server_label for m in mcp]
    dupe_labels = sorted({n for n in labels if labels.count(n) > 1})
    if dupe_labels:
        raise DelegationConfigError(
            "invalid_value", f"{param}: MCP server(s) {', '.join(dupe_labels)} listed twice", param=param
        )
    return tuple(functions), tuple(mcp)


def _known_fields(tool: Mapping[str, Any], known: Any, where: str, kind: str) -> None:
    """Refuse a tool object with fields outside ``known``, naming the first as the param."""
    extra = sorted(str(k) for k in tool if k not in known)
    if extra:
        raise DelegationConfigError(
            "unknown_parameter",
            f"{where}: unknown field(s) {', '.join(extra)} of {kind}",
            param=f"{where}.{extra[0]}",
        )


def _function(tool: Mapping[str, Any], where: str) -> FunctionTool:
    _known_fields(tool, _FUNCTION_KEYS, where, "a function tool")
    return function_tool(tool, where, ERRORS)


def _mcp_ref(tool: Mapping[str, Any], catalog: BackendCatalog, where: str) -> McpServerRef:
    _known_fields(tool, _MCP_KEYS, where, "an mcp tool")
    label = tool.get("server_label")
    configured = ", ".join(sorted(catalog.mcp_servers)) or "none"
    if not isinstance(label, str) or not label:
        raise DelegationConfigError(
            "invalid_value",
            f"{where}.server_label: name an MCP server configured on this server (configured: {configured})",
            param=f"{where}.server_label",
        )
    if label not in catalog.mcp_servers:
        raise DelegationConfigError(
            "invalid_value",
            f"{where}.server_label: no MCP server {label!r} is configured on this server (configured: {configured})",
            param=f"{where}.server_label",
        )
    approval = tool.get("require_approval")
    if approval not in (None, "never"):
        raise DelegationConfigError(
            "invalid_value",
            f"{where}.require_approval: kame has no approval flow; use 'never' or omit it",
            param=f"{where}.require_approval",
        )
    offered = tuple(catalog.mcp_servers[label])
    allowed = tool.get("allowed_tools")
    names: tuple[str, ...] | None = None
    if isinstance(allowed, Mapping):
        listed = allowed.get("tool_names")
        if allowed.get("read_only") is not None:
            raise DelegationConfigError(
                "invalid_value",
                f"{where}.allowed_tools.read_only: not supported; list tool_names",
                param=f"{where}.allowed_tools.read_only",
            )
        allowed = listed
    if allowed is not None:
        if (
            not isinstance(allowed, Sequence)
            or isinstance(allowed, str)
            or not all(isinstance(n, str) for n in allowed)
        ):
            raise DelegationConfigError(
                "invalid_type", f"{where}.allowed_tools must be a list of tool names", param=f"{where}.allowed_tools"
            )
        unknown = [n for n in allowed if n not in offered]
        if unknown:
            raise DelegationConfigError(
                "invalid_value",
                f"{where}.allowed_tools: {', '.join(unknown)} not offered by MCP server {label!r} "
                f"(offered: {', '.join(offered) or 'none'})",
                param=f"{where}.allowed_tools",
            )
        names = tuple(allowed)
    return McpServerRef(label, names)


def _tool_keys(functions: Sequence[FunctionTool], mcp: Sequence[McpServerRef], catalog: BackendCatalog) -> set[str]:
    keys = {f"function:{f.name}" for f in functions}
    for ref in mcp:
        names = (
            ref.allowed_tools if ref.allowed_tools is not None else tuple(catalog.mcp_servers.get(ref.server_label, ()))
        )
        keys.update(f"mcp:{ref.server_label}:{n}" for n in names)
    return keys


def _any_offered(
    choice: ToolChoiceSpec, functions: Sequence[FunctionTool], mcp: Sequence[McpServerRef], catalog: BackendCatalog
) -> bool:
    return any(choice.offers(k) for k in _tool_keys(functions, mcp, catalog))


def _choice_key(entry: object, keys: set[str], where: str) -> str:
    if not isinstance(entry, Mapping):
        raise DelegationConfigError("invalid_type", f"{where} must be an object", param=where)
    kind = entry.get("type")
    if kind == "function":
        key = f"function:{entry.get('name')}"
        if key not in keys:
            raise DelegationConfigError(
                "invalid_value", f"{where}: no function tool named {entry.get('name')!r}", param=f"{where}.name"
            )
        return key
    if kind == "mcp":
        key = f"mcp:{entry.get('server_label')}:{entry.get('name')}"
        if key not in keys:
            raise DelegationConfigError(
                "invalid_value",
                f"{where}: no tool {entry.get('name')!r} on an enabled MCP server {entry.get('server_label')!r}",
                param=where,
            )
        return key
    raise DelegationConfigError(
        "unsupported_tool",
        f"{where}: kame runs no hosted tools ({kind!r}); choose a function or an enabled MCP server's tool",
        param=f"{where}.type",
    )


def _tool_choice(
    value: object,
    functions: Sequence[FunctionTool],
    mcp: Sequence[McpServerRef],
    catalog: BackendCatalog,
    param: str,
) -> ToolChoiceSpec:
    keys = _tool_keys(functions, mcp, catalog)
    if isinstance(value, str):
        if value not in _CHOICE_MODES:
            raise DelegationConfigError(
                "invalid_value", f"{param} must be one of {', '.join(_CHOICE_MODES)} or an object", param=param
            )
        return ToolChoiceSpec(mode=_MODES[value], raw=value)
    if not isinstance(value, Mapping):
        raise DelegationConfigError("invalid_type", f"{param} must be a string or an object", param=param)
    if value.get("type") == "allowed_tools":
        mode = value.get("mode") or "auto"
        if mode not in _CHOICE_MODES:
            raise DelegationConfigError(
                "invalid_value", f"{param}.mode must be one of {', '.join(_CHOICE_MODES)}", param=f"{param}.mode"
            )
        entries = value.get("tools")
        if not isinstance(entries, Sequence) or isinstance(entries, str):
            raise DelegationConfigError("invalid_type", f"{param}.tools must be an array", param=f"{param}.tools")
        allowed = tuple(_choice_key(e, keys, f"{param}.tools[{i}]") for i, e in enumerate(entries))
        return ToolChoiceSpec(mode=_MODES[mode], allowed=allowed, raw=dict(value))
    forced = _choice_key(value, keys, param)
    return ToolChoiceSpec(mode="required", forced=forced, raw=dict(value))


def _recheck_choice(
    choice: ToolChoiceSpec,
    functions: Sequence[FunctionTool],
    mcp: Sequence[McpServerRef],
    catalog: BackendCatalog,
    param: str,
) -> ToolChoiceSpec:
    """After ``tools`` changed without a new ``tool_choice``: the old choice must still name existing tools."""
    keys = _tool_keys(functions, mcp, catalog)
    named = ([choice.forced] if choice.forced else []) + list(choice.allowed or ())
    missing = [k.split(":", 1)[1] for k in named if k not in keys]
    if missing:
        raise DelegationConfigError(
            "invalid_value",
            f"{param}: the current tool_choice names tools the new tools no longer have ({', '.join(missing)}); "
            "send a tool_choice with the tools",
            param=param,
        )
    return choice
