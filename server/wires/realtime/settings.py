"""Per-session settings of ``/v1/realtime``: ``session.update`` validation and the session object. No I/O.

An update is validated as a whole before anything changes (one ``error``
and nothing applied, or the new settings), so a client never ends up with a
half-applied session. OpenAI fields without a meaning here are accepted and
ignored (docs/protocol.md 3.2); the ``kame`` object is checked strictly
because a typo there would silently do nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kame.oracle.window import Truncation
from kame.server.wires.realtime.events import AUDIO_FORMAT, SAMPLE_RATE, VOICE, ClientError
from kame.server.wires.realtime.functions import (
    MAX_OUTPUT_CHARS,
    FunctionProtocolError,
    parse_tool_choice,
    parse_tools,
    session_tool_choice,
    session_tools,
)
from kame.session.settings import BARGE_IN_POLICIES, ORACLE_POLICIES, SessionSettings

MAX_INSTRUCTIONS_CHARS = 20_000
KAME_KEYS = (
    "backend",
    "oracle_policy",
    "oracle_delay_s",
    "barge_in",
    "record",
    "text_temperature",
    "text_topk",
    "silence_audio",
    "mcp_servers",
    "llm",
    "events",
    "echo_guard",
)
BETA_AUDIO_FORMATS = ("pcm16",)


@dataclass(frozen=True)
class ServerInfo:
    """What the server offers, for validation and for ``session.kame.server``."""

    session_id: str
    model: str = "kame"
    backends: Sequence[str] = ()
    default_backend: str | None = None
    oracle_policies: Sequence[str] = ORACLE_POLICIES
    barge_in_values: Sequence[str] = BARGE_IN_POLICIES
    default_oracle_policy: str = "reset"
    default_barge_in: str = "keep"
    default_oracle_delay_s: float = 0.0
    default_instructions: str | None = None
    asr_kind: str = "none"
    record_available: bool = False
    idle_timeout_s: float = 30.0
    max_duration_s: float = 600.0
    input_buffer_s: float = 10.0
    #: Back-ends that may be sent tools (``allow_tools``); functions on any other are refused.
    tools_backends: Sequence[str] = ()
    #: Configured MCP servers a session may enable by name.
    mcp_servers: Sequence[str] = ()
    #: Longest ``function_call_output`` accepted (characters).
    max_function_output_chars: int = MAX_OUTPUT_CHARS
    #: Whether sessions start with the echo guard on (``asr.echo_guard.enabled``).
    default_echo_guard: bool = False
    #: A PersonaPlex checkpoint's voices (empty: the checkpoint has one voice, ``audio.output.voice`` is ignored).
    voices: Sequence[str] = ()
    default_voice: str | None = None
    #: The front-end takes the instructions as its persona (PersonaPlex) besides the back-end.
    personas: bool = False


# --------------------------------------------------------------------------- validation


def _number(value: Any, param: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not lo <= value <= hi:
        raise ClientError("invalid_value", f"{param} must be a number between {lo:g} and {hi:g}", param=param)
    return float(value)


def _integer(value: Any, param: str, lo: int, hi: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        ok = True
    if not ok or not lo <= value <= hi:
        raise ClientError("invalid_value", f"{param} must be an integer between {lo} and {hi}", param=param)
    return int(value)


def _choice(value: Any, param: str, choices: Sequence[str], code: str = "invalid_value") -> str:
    if not isinstance(value, str) or value not in choices:
        shown = repr(value)[:64]
        raise ClientError(code, f"{param}: {shown} is not one of {', '.join(choices) or '(none configured)'}", param=param)
    return value


def _object(value: Any, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ClientError("invalid_value", f"{param} must be an object", param=param)
    return value


def _check_format(value: Any, param: str) -> None:
    if value is None:
        return
    fmt = _object(value, param)
    if fmt.get("type") != "audio/pcm" or fmt.get("rate", SAMPLE_RATE) != SAMPLE_RATE:
        raise ClientError(
            "unsupported_audio_format",
            f"{param}: only {{\"type\": \"audio/pcm\", \"rate\": {SAMPLE_RATE}}} (16-bit little-endian mono) is supported",
            param=param,
        )


def _check_audio(session: Mapping[str, Any]) -> None:
    audio = session.get("audio")
    if audio is None:
        return
    audio = _object(audio, "session.audio")
    for direction in ("input", "output"):
        part = audio.get(direction)
        if part is None:
            continue
        part = _object(part, f"session.audio.{direction}")
        _check_format(part.get("format"), f"session.audio.{direction}.format")


def _check_audio_beta(session: Mapping[str, Any]) -> None:
    """Beta shapes (``input_audio_format: "pcm16"``), still sent by older clients."""
    for key in ("input_audio_format", "output_audio_format"):
        if key in session and session[key] not in BETA_AUDIO_FORMATS:
            raise ClientError(
                "unsupported_audio_format", f"session.{key}: only \"pcm16\" (24 kHz) is supported", param=f"session.{key}"
            )


def _check_modalities(session: Mapping[str, Any]) -> None:
    for key in ("output_modalities", "modalities"):
        value = session.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or "audio" not in value:
            raise ClientError(
                "invalid_value",
                f"session.{key}: must include \"audio\" (Moshi always speaks; its text comes as the audio transcript)",
                param=f"session.{key}",
            )


def kame_events_in(payload: Any) -> bool | None:
    """Whether a (valid) ``session.update`` turns ``kame.*`` events on or off: a ``kame`` object turns them on
    unless it says ``"events": false``; None: no ``kame`` object, no change."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("kame"), Mapping):
        return None
    return payload["kame"].get("events", True) is not False


def _turn_detection(session: Mapping[str, Any]) -> tuple[bool, Any] | None:
    """The ``turn_detection`` object the update carries (GA ``audio.input`` or beta top level), if any."""
    audio = session.get("audio")
    if isinstance(audio, Mapping) and isinstance(audio.get("input"), Mapping) and "turn_detection" in audio["input"]:
        return True, audio["input"]["turn_detection"]
    if "turn_detection" in session:
        return True, session["turn_detection"]
    return None


def _parse_turn_detection(session: Mapping[str, Any], current: SessionSettings) -> dict[str, Any]:
    """``turn_detection``: ``null`` = client turns (only ``input_audio_buffer.commit`` ends a turn); an object =
    the server's ASR ends them (``server_vad`` and ``semantic_vad`` alike), with ``create_response`` and
    ``interrupt_response``."""
    found = _turn_detection(session)
    if found is None:
        return {}
    value = found[1]
    if value is None:
        return {"turn_detection": "client"}
    param = "session.audio.input.turn_detection"
    td = _object(value, param)
    kind = td.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise ClientError("invalid_value", f"{param}.type: server_vad, semantic_vad or a null turn_detection",
                          param=f"{param}.type")
    out: dict[str, Any] = {"turn_detection": "server_vad"}
    for key in ("interrupt_response", "create_response"):
        if key in td:
            flag = td[key]
            if not isinstance(flag, bool):
                raise ClientError("invalid_value", f"turn_detection.{key} must be true or false", param=f"{param}.{key}")
            out[key] = flag
    return out


def parse_session_update(payload: Any, current: SessionSettings, info: ServerInfo) -> tuple[SessionSettings, tuple[str, ...]]:
    """The settings after ``session.update``'s ``session`` object, and the fields ignored (accepted, without
    a meaning here); or :class:`ClientError`."""
    if payload is None:
        raise ClientError("missing_required_parameter", "session.update needs a session object", param="session")
    session = _object(payload, "session")
    stype = session.get("type", "realtime")
    if stype != "realtime":
        raise ClientError(
            "invalid_value", f"session.type: only \"realtime\" sessions are supported, not {str(stype)[:32]!r}", param="session.type"
        )
    _check_audio(session)
    _check_audio_beta(session)
    _check_modalities(session)
    changes: dict[str, Any] = {}
    voice = _requested_voice(session)
    if voice is not None and info.voices:
        changes["voice"] = _voice(voice, info)
    if "instructions" in session:
        value = session["instructions"]
        if value is not None and not isinstance(value, str):
            raise ClientError("invalid_value", "session.instructions must be a string or null", param="session.instructions")
        if value is not None and len(value) > MAX_INSTRUCTIONS_CHARS:
            raise ClientError(
                "invalid_value",
                f"session.instructions: at most {MAX_INSTRUCTIONS_CHARS} characters",
                param="session.instructions",
            )
        changes["instructions"] = value if value and value.strip() else None
    kame = session.get("kame")
    if kame is not None:
        changes.update(_parse_kame(_object(kame, "session.kame"), info))
    changes.update(_parse_turn_detection(session, current))
    if "truncation" in session:
        changes["truncation"] = _parse_truncation(session["truncation"])
    try:
        if "tools" in session:
            changes["functions"] = tuple(parse_tools(session["tools"]))
        functions = changes.get("functions", current.functions)
        if "tool_choice" in session:
            choice = parse_tool_choice(session["tool_choice"], functions)
            changes["tool_choice"] = None if choice == "auto" else choice
        elif "functions" in changes and current.tool_choice not in (None, "none", "required") \
                and not any(f.name == current.tool_choice for f in functions):
            changes["tool_choice"] = None  # the forced function is gone
    except FunctionProtocolError as exc:
        raise ClientError(exc.code, exc.message, param=exc.param) from None
    backend = changes.get("backend", current.backend) or info.default_backend
    functions = changes.get("functions", current.functions)
    if functions and backend not in info.tools_backends:
        raise ClientError(
            "tools_not_allowed",
            f"back-end {str(backend)[:64]!r} may not be sent tools (allow_tools is off); "
            f"back-ends that may: {', '.join(info.tools_backends) or '(none)'}",
            param="session.tools" if "tools" in session else "session.kame.backend",
        )
    known = {"type", "instructions", "kame", "audio", "output_modalities", "modalities", "tools", "tool_choice",
             "truncation"}
    ignored = tuple(sorted(str(k) for k in session if k not in known))
    return replace(current, **changes), ignored


def _requested_voice(session: Mapping[str, Any]) -> Any:
    """``audio.output.voice`` (GA) or ``voice`` (beta), None when absent."""
    audio = session.get("audio")
    if isinstance(audio, Mapping) and isinstance(audio.get("output"), Mapping) and "voice" in audio["output"]:
        return audio["output"]["voice"]
    return session.get("voice")


def _voice(value: Any, info: ServerInfo) -> str:
    """A voice of the checkpoint (``NAME``, or ``NAME.pt`` as PersonaPlex's clients send it)."""
    from kame.frontend.voices import voice_stem

    param = "session.audio.output.voice"
    stem = voice_stem(value) if isinstance(value, str) else None
    if stem is None or stem not in info.voices:
        raise ClientError("invalid_value", f"{param}: {repr(value)[:64]} is not one of this checkpoint's voices: "
                          f"{', '.join(info.voices)}", param=param)
    return stem


def _parse_kame(kame: Mapping[str, Any], info: ServerInfo) -> dict[str, Any]:
    unknown = sorted(str(k) for k in kame if k not in KAME_KEYS)
    if unknown:
        raise ClientError(
            "unknown_parameter",
            f"session.kame: unknown key(s) {', '.join(u[:32] for u in unknown[:5])} (known: {', '.join(KAME_KEYS)})",
            param=f"session.kame.{unknown[0][:32]}",
        )
    out: dict[str, Any] = {}
    for key, value in kame.items():
        param = f"session.kame.{key}"
        if key == "events":
            if not isinstance(value, bool):
                raise ClientError("invalid_value", f"{param} must be true or false", param=param)
        elif key == "backend":
            if value is None:
                out[key] = None
            else:
                out[key] = _choice(value, param, list(info.backends), code="unknown_backend")
        elif key == "oracle_policy":
            out[key] = None if value is None else _choice(value, param, list(info.oracle_policies))
        elif key == "barge_in":
            out[key] = None if value is None else _choice(value, param, list(info.barge_in_values))
        elif key in ("oracle_delay_s", "text_temperature"):
            out[key] = None if value is None else _number(value, param, 0.0, 10.0)
        elif key == "text_topk":
            out[key] = None if value is None else _integer(value, param, 1, 100_000)
        elif key == "echo_guard":
            if value is not None and not isinstance(value, bool):
                raise ClientError("invalid_value", f"{param} must be true, false or null", param=param)
            out[key] = value
        elif key in ("record", "silence_audio", "llm"):
            if not isinstance(value, bool):
                raise ClientError("invalid_value", f"{param} must be true or false", param=param)
            if key == "record" and value and not info.record_available:
                raise ClientError(
                    "recording_disabled", "session.kame.record: this server does not record (server.record_dir is not set)", param=param
                )
            out[key] = value
        elif key == "mcp_servers":
            if value is None:
                out[key] = None
                continue
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ClientError("invalid_value", f"{param} must be a list of configured MCP server names", param=param)
            unknown = [v for v in value if v not in info.mcp_servers]
            if unknown:
                raise ClientError(
                    "unknown_mcp_server",
                    f"{param}: {unknown[0][:64]!r} is not a configured MCP server (configured: "
                    f"{', '.join(info.mcp_servers) or 'none'}); clients cannot add servers",
                    param=param,
                )
            out[key] = tuple(dict.fromkeys(value))
    return out


# --------------------------------------------------------------------------- the session object


def session_object(settings: SessionSettings, info: ServerInfo, *, kame_events: bool = False) -> dict[str, Any]:
    """The ``session`` of ``session.created`` / ``session.updated`` (GA shape plus ``kame``): the values in effect."""
    asr = info.asr_kind != "none"
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": f"sess_{info.session_id}",
        "model": info.model,
        "output_modalities": ["audio"],
        "instructions": settings.instructions,
        "audio": {
            "input": {
                "format": dict(AUDIO_FORMAT),
                "transcription": {"model": info.asr_kind} if asr else None,
                "turn_detection": {"type": "server_vad", "create_response": settings.create_response,
                                   "interrupt_response": settings.interrupt_response}
                if asr and not settings.client_turns
                else None,
                "noise_reduction": None,
            },
            "output": {"format": dict(AUDIO_FORMAT), "voice": settings.voice or info.default_voice or VOICE,
                       "speed": 1.0},
        },
        "tools": session_tools(settings.functions),
        "tool_choice": session_tool_choice(settings.tool_choice or "auto"),
        "max_output_tokens": "inf",
        "truncation": settings.truncation.as_wire(),
        "kame": {
            "backend": settings.backend or info.default_backend,
            "oracle_policy": settings.oracle_policy or info.default_oracle_policy,
            "oracle_delay_s": info.default_oracle_delay_s if settings.oracle_delay_s is None else settings.oracle_delay_s,
            "barge_in": settings.barge_in or info.default_barge_in,
            "record": settings.record,
            "text_temperature": settings.text_temperature,
            "text_topk": settings.text_topk,
            "silence_audio": settings.silence_audio,
            "llm": settings.llm,
            "echo_guard": info.default_echo_guard if settings.echo_guard is None else settings.echo_guard,
            "mcp_servers": None if settings.mcp_servers is None else list(settings.mcp_servers),
            "events": kame_events,
            "server": {
                "session_id": info.session_id,
                "backends": list(info.backends),
                "oracle_policies": list(info.oracle_policies),
                "asr": info.asr_kind,
                "frame_ms": 80,
                "idle_timeout_s": info.idle_timeout_s,
                "max_duration_s": info.max_duration_s,
                "input_buffer_s": info.input_buffer_s,
                "tools_backends": list(info.tools_backends),
                "mcp_servers": list(info.mcp_servers),
            },
        },
    }


def _parse_truncation(value: Any) -> Truncation:
    """``session.truncation`` as OpenAI's GA API defines it: ``"auto"``, ``"disabled"`` or
    ``{"type": "retention_ratio", "retention_ratio": 0..1, "token_limits": {"post_instructions": N}}``."""
    param = "session.truncation"
    if value in ("auto", "disabled"):
        return Truncation(type=value)
    if not isinstance(value, Mapping) or value.get("type") != "retention_ratio":
        raise ClientError("invalid_value", 'session.truncation: "auto", "disabled" or {"type": "retention_ratio", ...}',
                          param=param)
    unknown = sorted(str(k) for k in value if k not in ("type", "retention_ratio", "token_limits"))
    if unknown:
        raise ClientError("unknown_parameter", f"session.truncation.{unknown[0][:32]}: not a truncation field",
                          param=f"{param}.{unknown[0][:32]}")
    ratio = value.get("retention_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ClientError("invalid_value", "session.truncation.retention_ratio: a number from 0 to 1",
                          param=f"{param}.retention_ratio")
    limits = value.get("token_limits")
    post: Any = None
    if limits is not None:
        if not isinstance(limits, Mapping) or any(k != "post_instructions" for k in limits):
            raise ClientError("invalid_value", "session.truncation.token_limits: {\"post_instructions\": N}",
                              param=f"{param}.token_limits")
        post = limits.get("post_instructions")
        if post is not None and (isinstance(post, bool) or not isinstance(post, int) or post < 1):
            raise ClientError("invalid_value", "session.truncation.token_limits.post_instructions: a positive integer",
                              param=f"{param}.token_limits.post_instructions")
    return Truncation(type="retention_ratio", retention_ratio=float(ratio), post_instructions=post)
