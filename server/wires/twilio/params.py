"""A call's settings from the ``start`` message's ``customParameters``. No I/O.

Twilio's Stream URL takes no query string: TwiML's ``<Parameter name= value=>``
elements arrive as ``customParameters`` instead, so they choose what query
parameters choose on the other wires (:func:`kame.server.access.params.parse_session_params`:
``backend``, ``oracle_policy``, ``mcp_servers``, ``llm``, ``echo_guard``,
``text_temperature``, ``text_topk``), plus ``instructions``, ``voice`` and
``interrupt_response``. A bad value refuses the call as a bad query parameter
would; an unknown voice falls back to the default with a notice (as
``/api/chat?voice_prompt=`` does: a caller hears the default voice rather than
nothing). Other names (the app's own, e.g. a caller id) are kept for the log only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from kame.server.access.params import ParamError, parse_session_params
from kame.session.settings import SessionSettings

#: Instructions longer than this are refused (the Realtime API's limit).
MAX_INSTRUCTIONS_CHARS = 20_000
#: The names read here beyond :func:`parse_session_params`'s.
OWN = frozenset({"instructions", "voice", "interrupt_response"})
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


class VoiceCatalog(Protocol):
    """What a checkpoint's voices offer (:class:`kame.frontend.voices.VoiceCatalog`)."""

    @property
    def names(self) -> Collection[str]: ...

    def choose(self, requested: str | None) -> tuple[str | None, str | None]: ...


@dataclass(frozen=True)
class CallParams:
    """The settings a call's parameters chose, the notices for the log, and the names no one reads."""

    settings: SessionSettings
    notices: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()


def call_settings(
    custom: Mapping[str, str],
    base: SessionSettings,
    *,
    backends: Collection[str] | None,
    mcp_servers: Collection[str] = (),
    voices: VoiceCatalog | None = None,
) -> CallParams:
    """``customParameters`` -> the call's settings over ``base``; :class:`ParamError` for a bad value.

    A phone call has barge-in on unless ``interrupt_response`` says otherwise: the caller talking over the
    assistant stops its answer and the audio Twilio still holds is cleared."""
    parsed = parse_session_params({k: v for k, v in custom.items() if k not in OWN}, backends=backends,
                                  mcp_servers=mcp_servers)
    s = parsed.settings
    settings = replace(base, backend=s.backend, oracle_policy=s.oracle_policy, mcp_servers=s.mcp_servers, llm=s.llm,
                       echo_guard=s.echo_guard, text_temperature=s.text_temperature, text_topk=s.text_topk,
                       interrupt_response=True)
    notices: list[str] = []
    instructions = custom.get("instructions")
    if instructions is not None:
        if len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise ParamError(f"custom parameter instructions: at most {MAX_INSTRUCTIONS_CHARS} characters")
        settings = replace(settings, instructions=instructions if instructions.strip() else None)
    flag = custom.get("interrupt_response")
    if flag is not None:
        if flag.strip().lower() not in _FLAGS:
            raise ParamError("custom parameter interrupt_response: expected true or false")
        settings = replace(settings, interrupt_response=_FLAGS[flag.strip().lower()])
    voice = custom.get("voice")
    if voices is not None and voices.names:
        chosen, unknown = voices.choose(voice)
        settings = replace(settings, voice=chosen)
        if unknown is not None:
            notices.append(f"voice: {unknown}")
    elif voice:
        notices.append("voice: this checkpoint has one voice; the parameter is ignored")
    return CallParams(settings, tuple(notices), parsed.ignored)
