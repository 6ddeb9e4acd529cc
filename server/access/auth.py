"""Who may use the server: an optional bearer token and an origin allow-list. No I/O.

Browsers cannot set headers on a websocket, so besides ``Authorization:
Bearer <token>`` the token is accepted as a ``token`` query parameter or as
the websocket subprotocol ``openai-insecure-api-key.<token>`` (the
convention of OpenAI's realtime API); a client that also offers the
``realtime`` subprotocol gets it echoed back. Tokens are compared in
constant time and never logged or echoed.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import SecretStr

# Masking them where they might appear is kame.redaction's; this name stays for the wires that import it.
from kame.redaction import redact as redact

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
REALTIME_SUBPROTOCOL = "realtime"

@dataclass(frozen=True)
class Credentials:
    """What a request offered, and the subprotocol to accept a websocket with."""

    token: str | None
    subprotocol: str | None


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def websocket_credentials(
    headers: Mapping[str, str], query: Mapping[str, str], subprotocols: Sequence[str]
) -> Credentials:
    """The token from header, query or subprotocol (that order), and the subprotocol to echo."""
    token = bearer_token(headers.get("authorization"))
    if token is None and query.get("token"):
        token = query["token"]
    for proto in subprotocols:
        if token is None and proto.startswith(KEY_SUBPROTOCOL_PREFIX):
            token = proto[len(KEY_SUBPROTOCOL_PREFIX) :] or None
    chosen = REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in subprotocols else None
    return Credentials(token, chosen)


def http_token(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    return bearer_token(headers.get("authorization")) or query.get("token") or None


def token_ok(expected: SecretStr | None, given: str | None) -> bool:
    """True when no token is configured, or ``given`` equals it (constant time)."""
    if expected is None or not expected.get_secret_value():
        return True
    if given is None:
        return False
    return hmac.compare_digest(expected.get_secret_value().encode(), given.encode())


def normalize_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def origin_ok(origin: str | None, allowed: Iterable[str]) -> bool:
    """Empty allow-list: any origin. Otherwise the Origin header must be listed (``*`` allows all).

    Requests without an Origin header (non-browser clients) are allowed: the
    check exists to stop other web pages from using a visitor's browser.
    """
    allowed_set = {normalize_origin(o) for o in allowed}
    if not allowed_set or "*" in allowed_set or origin is None:
        return True
    return normalize_origin(origin) in allowed_set
