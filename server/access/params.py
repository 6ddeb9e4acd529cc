"""Per-session options taken from the ``/api/chat`` query string. No I/O.

Kyutai's web client puts its sampling options in the URL. Moshi samples
audio with batch-wide settings, so only the text ones can be honoured per
session (``text_temperature``, ``text_topk``); ``audio_temperature``,
``audio_topk``, ``text_seed``, ``audio_seed``, ``pad_mult``,
``repetition_penalty*`` are accepted and ignored. ``backend`` and
``oracle_policy`` choose the LLM back-end and the answer-switch policy;
``mcp_servers`` (comma-separated names) enables operator-configured MCP
servers for the session (names only: a client cannot add a server).
A wire may read parameters of its own (:class:`WireParams`, e.g. ``/api/chat``'s
``text_prompt``), checked at admission like these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from kame.session.settings import ORACLE_POLICIES, SessionSettings

#: Query parameters known to be ignored (batch-wide in moshi, or client-side only).
IGNORED_PARAMS = frozenset(
    {
        "audio_temperature",
        "audio_topk",
        "text_seed",
        "audio_seed",
        "seed",
        "pad_mult",
        "repetition_penalty",
        "repetition_penalty_context",
        "token",  # authentication, handled before
        "worker_auth_id",
        "email",
    }
)


class ParamError(ValueError):
    """A query parameter with an unusable value (the message names it, never echoes secrets)."""


@dataclass(frozen=True)
class QueryParams:
    """The session settings the URL chose, and the parameters ignored."""

    settings: SessionSettings = field(default_factory=SessionSettings)
    ignored: tuple[str, ...] = field(default_factory=tuple)


class WireParams(Protocol):
    """A wire's own query parameters, parsed at admission (a bad value refuses the session as ``bad_params``)."""

    #: The names it reads (not reported as ignored).
    known: ClassVar[frozenset[str]]


#: Parses a wire's own parameters from the query string, or raises :class:`ParamError`.
ParseWireParams = Callable[[Mapping[str, str]], WireParams]


def _float(name: str, raw: str, lo: float, hi: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ParamError(f"query parameter {name}: not a number") from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise ParamError(f"query parameter {name}: must be between {lo:g} and {hi:g}")
    return value


def _int(name: str, raw: str, lo: int, hi: int) -> int:
    try:
        value = float(raw)  # the web client may send "25.0"
    except ValueError:
        raise ParamError(f"query parameter {name}: not an integer") from None
    if not math.isfinite(value) or value != int(value) or not lo <= value <= hi:
        raise ParamError(f"query parameter {name}: must be an integer between {lo} and {hi}")
    return int(value)


def parse_session_params(
    query: Mapping[str, str],
    *,
    backends: Collection[str] | None = None,
    oracle_policies: Collection[str] | None = None,
    mcp_servers: Collection[str] = (),
) -> QueryParams:
    """Validate the query string; ``backends`` None accepts any name."""
    oracle_policies = ORACLE_POLICIES if oracle_policies is None else oracle_policies
    temp = query.get("text_temperature")
    topk = query.get("text_topk")
    backend = query.get("backend") or None
    policy = query.get("oracle_policy") or None
    if backend is not None and backends is not None and backend not in backends:
        valid = ", ".join(sorted(backends)) or "none configured"
        raise ParamError(f"query parameter backend: unknown back-end {backend[:64]!r} (available: {valid})")
    if policy is not None and oracle_policies is not None and policy not in oracle_policies:
        raise ParamError(
            f"query parameter oracle_policy: {policy[:64]!r} is not one of {', '.join(sorted(oracle_policies))}"
        )
    servers: tuple[str, ...] | None = None
    raw_servers = query.get("mcp_servers")
    if raw_servers is not None:
        servers = tuple(dict.fromkeys(n.strip() for n in raw_servers.split(",") if n.strip()))
        unknown = [n for n in servers if n not in mcp_servers]
        if unknown:
            valid = ", ".join(sorted(mcp_servers)) or "none configured"
            raise ParamError(f"query parameter mcp_servers: unknown MCP server {unknown[0][:64]!r} (configured: {valid})")
    raw_llm = (query.get("llm") or "").strip().lower()
    if raw_llm not in ("", "0", "1", "true", "false"):
        raise ParamError("query parameter llm: expected 0 or 1")
    raw_echo = (query.get("echo_guard") or "").strip().lower()
    if raw_echo not in ("", "0", "1", "true", "false"):
        raise ParamError("query parameter echo_guard: expected 0 or 1")
    known = {"text_temperature", "text_topk", "backend", "oracle_policy", "mcp_servers", "llm", "echo_guard"}
    ignored = tuple(sorted(k for k in query if k not in known))
    settings = SessionSettings(
        text_temperature=None if temp in (None, "") else _float("text_temperature", temp, 0.0, 10.0),
        text_topk=None if topk in (None, "") else _int("text_topk", topk, 1, 100_000),
        backend=backend,
        oracle_policy=policy,  # type: ignore[arg-type]  # checked against oracle_policies above
        mcp_servers=servers,
        llm=raw_llm not in ("0", "false"),
        echo_guard=None if raw_echo == "" else raw_echo in ("1", "true"),
    )
    return QueryParams(settings=settings, ignored=ignored)
