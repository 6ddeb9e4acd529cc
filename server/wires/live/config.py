"""``session.start`` / ``session.update`` -> the resolved Live configuration. No I/O.

Every field of ``openai/types/live/session_config.py`` is either applied,
accepted and ignored with an ``info`` (it has no meaning for a Moshi
front-end: ``store``, ``voice``, ``safety_identifier``,
``acknowledgement_delay_ms``, ...), or refused with an ``error`` (a feature
kame does not have: ``delegation.type`` ``"decisions"``, ``"responses"``
on a server that offers no back-end for it, non-empty ``triggers``, ...).
``delegation.responses`` is resolved by :mod:`kame.session.responses.config`. A command is validated as a whole before
anything changes. The ``kame`` object is kame's extension and is checked
strictly, since a typo there would silently do nothing. docs/protocol.md
section 4 lists every field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from openai.types.live.session_config import SessionConfig

from kame.audio.media import SAMPLE_RATE
from kame.server.wires.live.audio import (
    DEFAULT_FORMAT,
    G711_RATE,
    PCM_RATES,
    LiveAudioFormat,
)
from kame.server.wires.live.decode import sdk_validate
from kame.server.wires.live.events import Info, LiveError
from kame.session.delegation_rules import DELEGATION_MODES, DelegationMode
from kame.session.responses.config import IGNORED_FIELDS, model_notice, parse_responses_config, update_responses_config
from kame.session.responses.settings import BackendCatalog, DelegationConfigError, ResponsesDelegationSettings

VOICE = "moshi"
MAX_INSTRUCTIONS_CHARS = 65_536  # 16,384 tokens in the contract; characters are checked before any tokenizer runs
KAME_KEYS = ("delegation", "backchannel_words", "text_temperature", "text_topk", "record", "echo_guard")


@dataclass(frozen=True)
class LiveServerInfo:
    """What the server offers, for validation and for ``session.kame.server``."""

    session_id: str
    model: str = "kame"
    asr: str = "none"
    max_duration_s: float = 600.0
    idle_timeout_s: float = 30.0
    record_available: bool = False
    default_delegation: DelegationMode = "turn"
    default_backchannel_words: int = 3
    usage_interval_s: float = 5.0
    #: The back-ends a Responses delegation may use (None: Responses delegation is not offered).
    responses: BackendCatalog | None = None
    #: Unix time the session was admitted: ``expires_at`` is this plus ``max_duration_s`` (0 when that is 0).
    admitted_at: float = 0.0
    #: A WebRTC session (``POST /v1/live/sessions``): its audio is RTP, negotiated in the SDP, not a format.
    webrtc: bool = False
    #: A WebRTC session's ``client`` as resolved (:mod:`.channel`), echoed in the session resource.
    client: Mapping[str, Any] | None = None
    #: Whether sessions start with the echo guard on (``asr.echo_guard.enabled``).
    default_echo_guard: bool = False
    #: A PersonaPlex checkpoint's voices (empty: one voice, ``audio.output.voice`` is ignored).
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    #: The front-end takes ``session.instructions`` as its persona (PersonaPlex).
    personas: bool = False


@dataclass(frozen=True)
class KameLiveSettings:
    """The ``session.kame`` extension (None: the server's default)."""

    delegation: DelegationMode | None = None
    backchannel_words: int | None = None
    text_temperature: float | None = None
    text_topk: int | None = None
    record: bool = False
    #: The echo guard (None: the server's ``asr.echo_guard.enabled``, or the ``echo_guard`` query parameter).
    echo_guard: bool | None = None


@dataclass(frozen=True)
class HistoryItem:
    """One message of ``session.input`` (text-only startup history)."""

    role: Literal["developer", "user", "assistant"]
    text: str


@dataclass(frozen=True)
class LiveConfig:
    """The resolved session: what ``session.started`` / ``session.updated`` report."""

    model: str
    #: Unix seconds the session is closed at; 0: no cap (``server.max_duration_s: 0``). An int either way:
    #: the SDK's ``SessionResource.expires_at`` is a required int, so a standard client still parses it.
    expires_at: int
    audio: LiveAudioFormat = DEFAULT_FORMAT
    instructions: str | None = None
    history: tuple[HistoryItem, ...] = ()
    acknowledgement_delay_ms: int | None = None
    kame: KameLiveSettings = field(default_factory=KameLiveSettings)
    #: ``delegation.responses`` resolved (None: client delegation).
    responses: ResponsesDelegationSettings | None = None
    #: The voice chosen at ``session.start`` (PersonaPlex checkpoints; None: the default).
    voice: str | None = None

    @property
    def delegation_type(self) -> Literal["client", "responses"]:
        return "responses" if self.responses is not None else "client"

    def delegation_mode(self, info: LiveServerInfo) -> DelegationMode:
        if self.responses is not None:
            return "turn"  # only the request after the user's turn may run the client's functions
        return self.kame.delegation or info.default_delegation

    def backchannel_words(self, info: LiveServerInfo) -> int:
        value = self.kame.backchannel_words
        return info.default_backchannel_words if value is None else value


@dataclass(frozen=True)
class Parsed:
    """A validated command: the new configuration and the notices to send."""

    config: LiveConfig
    infos: tuple[Info, ...] = ()


# --------------------------------------------------------------------------- pieces


def _object(value: Any, param: str, event_id: str | None) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise LiveError("invalid_value", f"{param} must be an object", param=param, client_event_id=event_id)
    return value


def _ignored(param: str, why: str, event_id: str | None) -> Info:
    return Info("ignored_parameter", f"{param} is accepted and ignored: {why}", client_event_id=event_id)


def _audio_format(value: Any, event_id: str | None) -> LiveAudioFormat:
    param = "session.audio.format"
    fmt = _object(value, param, event_id)
    ftype, rate = fmt.get("type"), fmt.get("rate")
    if ftype == "audio/pcm":
        rate = SAMPLE_RATE if rate is None else rate
        if rate not in PCM_RATES or isinstance(rate, bool):
            raise LiveError("unsupported_audio_format", f"{param}.rate: audio/pcm supports 24000 or 16000 Hz",
                            param=f"{param}.rate", client_event_id=event_id)
    elif ftype in ("audio/pcmu", "audio/pcma"):
        rate = G711_RATE if rate is None else rate
        if rate != G711_RATE or isinstance(rate, bool):
            raise LiveError("unsupported_audio_format", f"{param}.rate: {ftype} (G.711) is 8000 Hz",
                            param=f"{param}.rate", client_event_id=event_id)
    else:
        raise LiveError("unsupported_audio_format",
                        f"{param}.type: {str(ftype)[:32]!r} is not one of audio/pcm, audio/pcmu, audio/pcma",
                        param=f"{param}.type", client_event_id=event_id)
    return LiveAudioFormat(ftype, int(rate))


@dataclass(frozen=True)
class _Delegation:
    ack: int | None
    responses: ResponsesDelegationSettings | None


def _responses(
    d: Mapping[str, Any],
    info: LiveServerInfo,
    current: ResponsesDelegationSettings | None,
    event_id: str | None,
    infos: list[Info],
) -> ResponsesDelegationSettings:
    """``delegation.responses`` on kame's back-ends (:mod:`kame.session.responses.config`)."""
    assert info.responses is not None
    raw = d.get("responses")
    param = "session.delegation.responses"
    try:
        if current is None:
            if raw is None:
                raise DelegationConfigError(
                    "missing_required_parameter", f"{param} is required (at least its model)", param=param
                )
            settings = parse_responses_config(raw, info.responses, param=param)
        else:
            settings = current if raw is None else update_responses_config(current, raw, info.responses, param=param)
    except DelegationConfigError as exc:
        raise LiveError(exc.code, exc.message, param=exc.param, client_event_id=event_id) from None
    if isinstance(raw, Mapping) and "model" in raw:
        notice = model_notice(settings.model, settings.target)
        if notice is not None:
            infos.append(_ignored(f"{param}.model", notice, event_id))
    if isinstance(raw, Mapping):
        for name in IGNORED_FIELDS:
            if raw.get(name) is not None:
                infos.append(_ignored(f"{param}.{name}",
                                      "kame's back-ends speak chat completions; provider options are the "
                                      "operator's (backends.NAME.extra_body)", event_id))
    return settings


def _delegation(value: Any, event_id: str | None, infos: list[Info], info: LiveServerInfo | None = None,
                current: LiveConfig | None = None) -> _Delegation:
    """``delegation`` -> its acknowledgement delay and, for Responses delegation, the resolved back-end."""
    if value is None:
        return _Delegation(None, current.responses if current is not None else None)
    d = _object(value, "session.delegation", event_id)
    dtype = d.get("type")
    if current is not None and dtype in ("client", "responses") and dtype != current.delegation_type:
        raise LiveError("unsupported_delegation",
                        f"session.delegation.type cannot change after session.start (this session uses "
                        f"{current.delegation_type!r} delegation)",
                        param="session.delegation.type", client_event_id=event_id)
    responses: ResponsesDelegationSettings | None = None
    if dtype == "responses" and info is not None and info.responses is not None:
        responses = _responses(d, info, current.responses if current is not None else None, event_id, infos)
    elif dtype == "responses":
        raise LiveError(
            "unsupported_delegation",
            "session.delegation.type: \"responses\" (a hosted Responses model) is not available; kame offers "
            "\"client\" delegation: your application answers with session.commentary.append",
            param="session.delegation.type", client_event_id=event_id)
    if dtype == "decisions":
        raise LiveError("unsupported_delegation",
                        "session.delegation.type: \"decisions\" (the Decisions API) is not available; use \"client\"",
                        param="session.delegation.type", client_event_id=event_id)
    elif dtype not in ("client", "responses"):
        raise LiveError("invalid_value", f"session.delegation.type: {str(dtype)[:32]!r} is not \"client\" or \"responses\"",
                        param="session.delegation.type", client_event_id=event_id)
    delay = d.get("acknowledgement_delay_ms")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise LiveError("invalid_value", "session.delegation.acknowledgement_delay_ms must be an integer >= 0",
                            param="session.delegation.acknowledgement_delay_ms", client_event_id=event_id)
        infos.append(_ignored("session.delegation.acknowledgement_delay_ms",
                              "Moshi speaks on its own from the first frame; kame requests no acknowledgements",
                              event_id))
    known = ("type", "acknowledgement_delay_ms") + (("responses",) if responses is not None else ())
    for key in d:
        if key not in known:
            infos.append(_ignored(f"session.delegation.{str(key)[:32]}", f"not part of {dtype} delegation", event_id))
    ack = delay if isinstance(delay, int) and not isinstance(delay, bool) else None
    return _Delegation(ack, responses)


def _triggers(value: Any, event_id: str | None) -> None:
    if value is None or value == []:
        return
    raise LiveError("unsupported_parameter",
                    "session.triggers: Decisions triggers are not available (send an empty list or omit it)",
                    param="session.triggers", client_event_id=event_id)


def _number(value: Any, param: str, lo: float, hi: float, event_id: str | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not lo <= value <= hi:
        raise LiveError("invalid_value", f"{param} must be a number between {lo:g} and {hi:g}", param=param,
                        client_event_id=event_id)
    return float(value)


def _integer(value: Any, param: str, lo: int, hi: int, event_id: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise LiveError("invalid_value", f"{param} must be an integer between {lo} and {hi}", param=param,
                        client_event_id=event_id)
    return value


def _kame(value: Any, current: KameLiveSettings, info: LiveServerInfo, event_id: str | None) -> KameLiveSettings:
    k = _object(value, "session.kame", event_id)
    unknown = sorted(str(x) for x in k if x not in KAME_KEYS)
    if unknown:
        raise LiveError("unknown_parameter",
                        f"session.kame: unknown key(s) {', '.join(u[:32] for u in unknown[:5])} "
                        f"(known: {', '.join(KAME_KEYS)})",
                        param=f"session.kame.{unknown[0][:32]}", client_event_id=event_id)
    changes: dict[str, Any] = {}
    for key, v in k.items():
        param = f"session.kame.{key}"
        if key == "delegation":
            if v is not None and v not in DELEGATION_MODES:
                raise LiveError("invalid_value", f"{param}: {str(v)[:32]!r} is not one of {', '.join(DELEGATION_MODES)}",
                                param=param, client_event_id=event_id)
            changes[key] = v
        elif key == "backchannel_words":
            changes[key] = None if v is None else _integer(v, param, 0, 100, event_id)
        elif key == "text_temperature":
            changes[key] = None if v is None else _number(v, param, 0.0, 10.0, event_id)
        elif key == "text_topk":
            changes[key] = None if v is None else _integer(v, param, 1, 100_000, event_id)
        elif key == "echo_guard":
            if v is not None and not isinstance(v, bool):
                raise LiveError("invalid_value", f"{param} must be true, false or null", param=param,
                                client_event_id=event_id)
            changes[key] = v
        elif key == "record":
            if not isinstance(v, bool):
                raise LiveError("invalid_value", f"{param} must be true or false", param=param, client_event_id=event_id)
            if v and not info.record_available:
                raise LiveError("recording_disabled",
                                f"{param}: this server does not record (server.record_dir is not set)",
                                param=param, client_event_id=event_id)
            changes[key] = v
    return replace(current, **changes)


def _history(session: Mapping[str, Any], event_id: str | None) -> tuple[HistoryItem, ...]:
    items = sdk_validate(SessionConfig, {"model": "x", "input": session.get("input")}, event_id, "session").input or []
    if len(items) > 128:
        raise LiveError("invalid_value", "session.input: at most 128 messages", param="session.input",
                        client_event_id=event_id)
    out = []
    for item in items:
        text = "".join(part.text for part in item.content)
        out.append(HistoryItem(item.role, text))
    return tuple(out)


# --------------------------------------------------------------------------- commands

#: ``MediaSessionConfig`` fields (a WebRTC session's) beyond ``SessionConfig``'s.
_WEBRTC_ONLY = ("idle_timeout_s", "wake_policy")
_START_KNOWN = {"model", "audio", "client", "delegation", "input", "instructions", "safety_identifier", "store",
                "triggers", "kame"}


def _voice(value: Any, info: LiveServerInfo, event_id: str | None) -> str:
    """A voice of the checkpoint (``NAME`` or ``NAME.pt``), or ``invalid_value`` naming them."""
    from kame.frontend.voices import voice_stem

    param = "session.audio.output.voice"
    stem = voice_stem(value) if isinstance(value, str) else None
    if stem is None or stem not in info.voices:
        raise LiveError("invalid_value", f"{param}: {repr(value)[:64]} is not one of this checkpoint's voices: "
                        f"{', '.join(info.voices)}", param=param, client_event_id=event_id)
    return stem


def parse_start(session: Mapping[str, Any], info: LiveServerInfo, event_id: str | None = None) -> Parsed:
    """``session.start``'s ``session`` -> the resolved configuration, or :class:`LiveError`."""
    infos: list[Info] = []
    model = session.get("model")
    if not isinstance(model, str) or not model.strip():
        raise LiveError("missing_required_parameter", "session.model is required (any name: kame serves its own model)",
                        param="session.model", client_event_id=event_id)
    fmt = DEFAULT_FORMAT
    voice: str | None = None
    audio = session.get("audio")
    if audio is not None:
        audio = _object(audio, "session.audio", event_id)
        if audio.get("format") is not None and info.webrtc:
            raise LiveError("unsupported_parameter",
                            "session.audio.format is for WebSockets: a WebRTC session negotiates its audio in the SDP",
                            param="session.audio.format", client_event_id=event_id)
        if audio.get("format") is not None:
            fmt = _audio_format(audio["format"], event_id)
        output = audio.get("output")
        requested = None if output is None else _object(output, "session.audio.output", event_id).get("voice")
        if requested is not None and info.voices:
            voice = _voice(requested, info, event_id)
        elif requested is not None:
            infos.append(_ignored("session.audio.output.voice",
                                  f"Moshi speaks with the voice of its checkpoint ({VOICE!r})", event_id))
    delegation = _delegation(session.get("delegation"), event_id, infos, info)
    _triggers(session.get("triggers"), event_id)
    instructions = session.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise LiveError("invalid_value", "session.instructions must be a string", param="session.instructions",
                        client_event_id=event_id)
    if instructions is not None and len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise LiveError("invalid_value", "session.instructions: at most 16,384 tokens", param="session.instructions",
                        client_event_id=event_id)
    # The rest of the shape (types of store, safety_identifier, client, input) as the SDK defines it.
    plain = {k: v for k, v in session.items() if k in ("model", "store", "safety_identifier", "client")}
    sdk_validate(SessionConfig, plain, event_id, "session")
    history = _history(session, event_id) if session.get("input") is not None else ()
    kame = _kame(session["kame"], KameLiveSettings(), info, event_id) if session.get("kame") is not None else KameLiveSettings()
    if instructions and instructions.strip() and not info.personas:
        infos.append(Info("context_only",
                          "session.instructions are kept as context for delegations: the Moshi front-end takes no "
                          "text instructions", client_event_id=event_id))
    if history:
        infos.append(Info("context_only",
                          "session.input is kept as context for delegations: the Moshi front-end takes no text history",
                          client_event_id=event_id))
    ignored = [
        ("store", "kame does not store sessions (server.record_dir records on the server's side)"),
        ("safety_identifier", "kame runs no safety monitoring service"),
    ]
    if info.webrtc:
        ignored += [(key, "Moshi listens full-duplex for the whole session; inference never pauses")
                    for key in _WEBRTC_ONLY]
    else:
        ignored.append(("client", "it configures WebRTC data channels; this is a websocket session"))
    for key, why in ignored:
        if session.get(key) is not None:
            infos.append(_ignored(f"session.{key}", why, event_id))
    for key in session:
        if key not in _START_KNOWN and not (info.webrtc and key in _WEBRTC_ONLY):
            infos.append(_ignored(f"session.{str(key)[:32]}", "not a Live session field", event_id))
    if info.asr == "none":
        infos.append(Info("no_transcription",
                          "this server runs without speech recognition: no input transcript and no delegations",
                          client_event_id=event_id))
    if delegation.responses is not None and kame.delegation == "speculative":
        infos.append(_speculative_ignored(event_id))
    config = LiveConfig(
        model=model.strip()[:128],
        expires_at=int(info.admitted_at + info.max_duration_s) if info.max_duration_s > 0 else 0,
        audio=fmt,
        instructions=instructions if instructions and instructions.strip() else None,
        history=history,
        acknowledgement_delay_ms=delegation.ack,
        kame=kame,
        responses=delegation.responses,
        voice=voice,
    )
    return Parsed(config, tuple(infos))


_IMMUTABLE = ("model", "audio", "instructions", "input", "client", "store", "safety_identifier")


def parse_update(session: Mapping[str, Any], current: LiveConfig, info: LiveServerInfo,
                 event_id: str | None = None) -> Parsed:
    """``session.update``'s ``session`` -> the configuration after it, or :class:`LiveError` (nothing applied)."""
    infos: list[Info] = []
    for key in _IMMUTABLE:
        if key in session:
            raise LiveError("immutable_parameter", f"session.{key} cannot change after session.start",
                            param=f"session.{key}", client_event_id=event_id)
    ack = current.acknowledgement_delay_ms
    responses = current.responses
    if session.get("delegation") is not None:
        delegation = _delegation(session["delegation"], event_id, infos, info, current)
        ack = ack if delegation.ack is None else delegation.ack
        responses = delegation.responses
    _triggers(session.get("triggers"), event_id)
    kame = current.kame
    if session.get("kame") is not None:
        kame = _kame(session["kame"], current.kame, info, event_id)
    for key in session:
        if key not in ("delegation", "triggers", "kame"):
            infos.append(_ignored(f"session.{str(key)[:32]}", "not a Live session field", event_id))
    if responses is not None and kame.delegation == "speculative" and session.get("kame") is not None:
        infos.append(_speculative_ignored(event_id))
    return Parsed(replace(current, acknowledgement_delay_ms=ack, kame=kame, responses=responses), tuple(infos))


def _speculative_ignored(event_id: str | None) -> Info:
    return _ignored("session.kame.delegation",
                    "with Responses delegation only the request after the user's turn is delegated (it may run "
                    "your functions); kame's speculative requests stay inside kame", event_id)


# --------------------------------------------------------------------------- the session resource


def session_resource(config: LiveConfig, info: LiveServerInfo) -> dict[str, Any]:
    """The ``session`` of ``session.started`` / ``updated`` / ``closed`` (``SessionResource`` plus ``kame``)."""
    voice = config.voice or info.default_voice or VOICE
    delegation: dict[str, Any] = {"type": config.delegation_type}
    if config.responses is not None:
        delegation["responses"] = config.responses.as_config()
    if config.acknowledgement_delay_ms is not None:
        delegation["acknowledgement_delay_ms"] = config.acknowledgement_delay_ms
    out: dict[str, Any] = {
        "id": f"live_{info.session_id}",
        "expires_at": config.expires_at,
        "model": config.model,
        "status": "active",
        "audio": {"output": {"voice": voice}} if info.webrtc else {"format": config.audio.to_json(),
                                                                    "output": {"voice": voice}},
        "delegation": delegation,
        "instructions": config.instructions,
        "store": False,
        "triggers": [],
        "kame": {
            "delegation": config.delegation_mode(info),
            "backchannel_words": config.backchannel_words(info),
            "text_temperature": config.kame.text_temperature,
            "text_topk": config.kame.text_topk,
            "record": config.kame.record,
            "echo_guard": info.default_echo_guard if config.kame.echo_guard is None else config.kame.echo_guard,
            "server": {
                "session_id": info.session_id,
                "model": info.model,
                "asr": info.asr,
                "frame_ms": 80,
                "idle_timeout_s": info.idle_timeout_s,
                "max_duration_s": info.max_duration_s,
                "usage_interval_s": info.usage_interval_s,
            },
        },
    }
    if info.client is not None:
        out["client"] = dict(info.client)
    if config.history:
        out["input"] = [
            {"type": "message", "role": h.role,
             "content": [{"type": "output_text" if h.role == "assistant" else "input_text", "text": h.text}]}
            for h in config.history
        ]
    return out
