"""Ephemeral keys (``ek_...``): short-lived credentials a web page may hold, as OpenAI's client secrets. No I/O.

A trusted server mints one with the real key (``POST /v1/realtime/client_secrets``);
the page then opens any number of sessions with it (a WebRTC call or the
websocket) until it expires (``expires_after.seconds``, 10 to 7200, default
600). The key's session config is every such session's starting one, and, as
kame's own rule, bounds it: a session opened with the key cannot switch to
another back-end than the key's, nor enable MCP servers the key did not
(:meth:`EphemeralGrant.narrow`), so a page cannot widen what its server chose.

Keys live in memory only (a restart revokes them) and are looked up by their
SHA-256, so neither a timing difference nor a dump of this table gives one away.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kame.server.wires.realtime.settings import ServerInfo
    from kame.session.settings import SessionSettings

PREFIX = "ek_"
MIN_TTL_S = 10
MAX_TTL_S = 7200
DEFAULT_TTL_S = 600
#: Keys held at once; minting beyond it first forgets expired keys, then refuses.
MAX_KEYS = 10_000


class EphemeralKeyError(ValueError):
    """A mint request that cannot be honoured (the message is one sentence for the client)."""


@dataclass(frozen=True)
class EphemeralGrant:
    """What a key allows: its starting settings, the raw session config it was minted with, and when it expires."""

    settings: SessionSettings
    session: dict[str, Any]
    expires_at: float  # time.time()

    def narrow(self, info: ServerInfo) -> ServerInfo:
        """``info`` with the back-ends and MCP servers a session of this key may choose: the key's own."""
        backend = self.settings.backend or info.default_backend
        backends = tuple(b for b in info.backends if b == backend)
        servers = tuple(s for s in info.mcp_servers if s in (self.settings.mcp_servers or ()))
        tools = tuple(b for b in info.tools_backends if b in backends)
        return replace(info, backends=backends, mcp_servers=servers, tools_backends=tools)


def is_ephemeral(token: str | None) -> bool:
    return bool(token) and token.startswith(PREFIX)  # type: ignore[union-attr]


def ttl_seconds(expires_after: Any) -> int:
    """``expires_after`` of a mint request -> seconds (OpenAI's rules), or :class:`EphemeralKeyError`."""
    if expires_after is None:
        return DEFAULT_TTL_S
    if not isinstance(expires_after, dict):
        raise EphemeralKeyError("expires_after must be an object with \"seconds\".")
    anchor = expires_after.get("anchor", "created_at")
    if anchor != "created_at":
        raise EphemeralKeyError("expires_after.anchor must be \"created_at\".")
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise EphemeralKeyError(f"expires_after.seconds must be an integer between {MIN_TTL_S} and {MAX_TTL_S}.")
    return seconds


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "replace")).digest()


class EphemeralKeys:
    """The keys minted by this server process."""

    def __init__(self, clock: Callable[[], float] = time.time, max_keys: int = MAX_KEYS) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self._grants: dict[bytes, EphemeralGrant] = {}

    def __len__(self) -> int:
        return len(self._grants)

    def mint(self, settings: SessionSettings, session: dict[str, Any], ttl_s: int) -> tuple[str, EphemeralGrant]:
        now = self.clock()
        if len(self._grants) >= self.max_keys:
            self.prune(now)
            if len(self._grants) >= self.max_keys:
                raise EphemeralKeyError("too many client secrets are live on this server; retry later.")
        key = PREFIX + secrets.token_urlsafe(24)
        grant = EphemeralGrant(settings, session, now + ttl_s)
        self._grants[_digest(key)] = grant
        return key, grant

    def lookup(self, key: str | None) -> EphemeralGrant | None:
        """The grant of a live key; None when unknown or expired (an expired key is forgotten)."""
        if not is_ephemeral(key):
            return None
        assert key is not None
        digest = _digest(key)
        grant = self._grants.get(digest)
        if grant is None:
            return None
        if grant.expires_at <= self.clock():
            del self._grants[digest]
            return None
        return grant

    def prune(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        for digest in [d for d, g in self._grants.items() if g.expires_at <= now]:
            del self._grants[digest]
