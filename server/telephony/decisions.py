"""The SIP flow's decisions, as pure functions: who may call, what a refusal answers, which bodies are valid.

No I/O and no PJSIP: :mod:`~kame.server.telephony.stack` asks, and the unit tests check each rule alone.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

#: SIP answers to an INVITE kame will not take, and their metrics labels.
FORBIDDEN = (403, "forbidden")
BUSY = (486, "busy")
UNAVAILABLE_DRAINING = (503, "draining")
UNAVAILABLE_STARTING = (503, "starting")
#: Phone formats an accept may name: the codec itself is negotiated in SDP, so they are accepted and dropped.
PHONE_FORMATS = frozenset({"audio/pcmu", "audio/pcma"})
REFER_SCHEMES = ("sip:", "sips:", "tel:")


def host_of(src: str) -> str:
    """The address part of PJSIP's ``host:port`` (``[v6]:port`` for IPv6)."""
    src = src.strip()
    if src.startswith("["):
        return src[1:].split("]", 1)[0]
    if src.count(":") == 1:
        return src.split(":", 1)[0]
    return src


def allowed(src: str, networks: list[str]) -> bool:
    """Whether an INVITE from ``src`` may ring (any source when ``networks`` is empty)."""
    if not networks:
        return True
    try:
        address = ipaddress.ip_address(host_of(src))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in networks)


def admission(*, src: str, allowed: list[str], draining: bool, ready: bool, free_slots: int, ringing: int,
              max_ringing: int) -> tuple[int, str] | None:
    """The SIP refusal of a new INVITE (code, metrics label), or None when it may ring."""
    if not _allowed(src, allowed):
        return FORBIDDEN
    if draining:
        return UNAVAILABLE_DRAINING
    if not ready:
        return UNAVAILABLE_STARTING
    if free_slots <= 0 or ringing >= max_ringing:
        return BUSY
    return None


_allowed = allowed


def retry_delay(attempt: int) -> float:
    """Seconds before a failed webhook's next attempt: 0.5, 1, 2, then 2 (the deadline stops it)."""
    return float(min(2.0, 0.5 * 2 ** (attempt - 1)))


def reject_status(body: Any, *, required: bool) -> int | str:
    """A reject's SIP status code (603 Decline when absent and not ``required``), or the problem's sentence."""
    code = body.get("status_code") if isinstance(body, dict) else None
    if code is None:
        return "status_code is required: a SIP status between 300 and 699." if required else 603
    if not isinstance(code, int) or isinstance(code, bool) or not 300 <= code <= 699:
        return "status_code must be a SIP status between 300 and 699."
    return code


def refer_target(body: Any) -> str | None:
    """The REFER's ``target_uri`` (``sip:``, ``sips:`` or ``tel:``), or None when it is missing or not one."""
    target = body.get("target_uri") if isinstance(body, dict) else None
    if not isinstance(target, str):
        return None
    target = target.strip()
    if not target.lower().startswith(REFER_SCHEMES) or len(target) > 512 or any(c in target for c in "\r\n<>\x00"):
        return None
    return target


def realtime_accept_problem(body: Any) -> str | None:
    """Why a Realtime accept body is not one (a session config of type ``realtime``), or None."""
    if not isinstance(body, dict):
        return "The body must be a Realtime session config (a JSON object with type \"realtime\")."
    if body.get("type", "realtime") != "realtime":
        return "The session's type must be \"realtime\" to answer a call on /v1/realtime/calls."
    return None


def without_phone_format(session: dict[str, Any]) -> dict[str, Any]:
    """``session`` without ``audio.input.format`` / ``audio.output.format`` when they name a phone codec
    (``audio/pcmu``, ``audio/pcma``): on a call, SDP negotiated the codec and the session works at 24 kHz."""
    audio = session.get("audio")
    if not isinstance(audio, dict):
        return session
    out = dict(audio)
    for side in ("input", "output"):
        part = audio.get(side)
        if isinstance(part, dict) and isinstance(part.get("format"), dict) and part["format"].get("type") in PHONE_FORMATS:
            out[side] = {k: v for k, v in part.items() if k != "format"}
    return {**session, "audio": out}


def url_for_log(url: str | None) -> str:
    """A webhook URL without its query or credentials (they may carry a token)."""
    if not url:
        return ""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"


def uri_for_log(uri: str) -> str:
    """A SIP/tel URI without its parameters and headers (kept short)."""
    return uri.split(";", 1)[0].split("?", 1)[0][:80]
