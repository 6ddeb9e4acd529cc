"""Ephemeral keys (``ek_...``): short-lived credentials a web page may hold, as OpenAI's client secrets. No I/O.

A trusted server mints one with the real key (``POST /v1/realtime/client_secrets``);
the page then opens any number of sessions with it (a WebRTC call or the
websocket) until it expires (``expires_after.seconds``, 10 to 7200, default
600). The key's session config is every such session's starting one, and, as
kame's own rule, bounds it: a session opened with the key cannot switch to
another back-end than the key's, nor enable MCP servers the key did not
(:meth:`EphemeralGrant.narrow`), so a page cannot widen what its server chose.

A key carries its grant, signed: ``ek_`` + the compressed JSON of the settings, the session config and the
expiry time + ``.`` + an HMAC-SHA256 of it. So any replica that holds the same signing secret honours a
key minted by another one (a fleet behind HAProxy: the page's POST and its websocket may reach different
replicas), and no server keeps a table that a flood of mints could fill. The secret is
``server.ephemeral_key_secret``, else derived from ``server.auth_token`` (replicas sharing a token share
it), else random per process (without a token anybody may open sessions anyway). Changing it revokes every
key. The key is not encrypted: its holder (the page) may read its own session config, as it reads the
``session`` object of the mint's answer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from kame.backend.tools import ToolSpec
from kame.oracle.window import Truncation
from kame.session.settings import SessionSettings

if TYPE_CHECKING:
    from kame.server.wires.realtime.settings import ServerInfo

PREFIX = "ek_"
MIN_TTL_S = 10
MAX_TTL_S = 7200
DEFAULT_TTL_S = 600
#: The longest key looked at, and the most its grant may decompress to: a page's instructions and
#: functions fit; a crafted key cannot make the server inflate megabytes.
MAX_KEY_CHARS = 64 * 1024
MAX_GRANT_BYTES = 256 * 1024
_MAC_BYTES = 18
_VERSION = 1


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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signing_secret(configured: str | None, auth_token: str | None) -> bytes:
    """The key ``ek_`` keys are signed with (see the module docstring for the order of choice)."""
    if configured:
        return hashlib.sha256(b"kame ephemeral keys: configured\0" + configured.encode()).digest()
    if auth_token:
        return hashlib.sha256(b"kame ephemeral keys: from auth_token\0" + auth_token.encode()).digest()
    return secrets.token_bytes(32)


def settings_to_json(settings: SessionSettings) -> dict[str, Any]:
    return asdict(settings)


def settings_from_json(data: dict[str, Any]) -> SessionSettings:
    """The inverse of :func:`settings_to_json` (tuples and tool specs rebuilt; unknown names ignored, so a key
    minted by a newer replica still opens a session on an older one)."""
    known = {f.name for f in fields(SessionSettings)}
    values = {k: v for k, v in data.items() if k in known}
    if "functions" in values:
        values["functions"] = tuple(ToolSpec(**f) for f in values["functions"])
    if values.get("mcp_servers") is not None:
        values["mcp_servers"] = tuple(values["mcp_servers"])
    if isinstance(values.get("truncation"), dict):
        values["truncation"] = Truncation(**values["truncation"])
    return SessionSettings(**values)


class EphemeralKeys:
    """Mints and checks the signed keys of one server (or of every replica sharing its secret)."""

    def __init__(self, secret: bytes | None = None, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def _mac(self, body: str) -> bytes:
        return hmac.new(self._secret, b"kame-ek.%d." % _VERSION + body.encode("ascii"), hashlib.sha256).digest()[:_MAC_BYTES]

    def mint(self, settings: SessionSettings, session: dict[str, Any], ttl_s: int) -> tuple[str, EphemeralGrant]:
        grant = EphemeralGrant(settings, session, self.clock() + ttl_s)
        payload = {"v": _VERSION, "exp": grant.expires_at, "nonce": _b64(secrets.token_bytes(9)),
                   "settings": settings_to_json(settings), "session": session}
        body = _b64(zlib.compress(json.dumps(payload, separators=(",", ":")).encode("utf-8"), 9))
        key = f"{PREFIX}{body}.{_b64(self._mac(body))}"
        if len(key) > MAX_KEY_CHARS:
            raise EphemeralKeyError("the session config is too large for a client secret; shorten its instructions or tools.")
        return key, grant

    def lookup(self, key: str | None) -> EphemeralGrant | None:
        """The grant of a live key; None when its signature is wrong, it is malformed, or it has expired."""
        if not is_ephemeral(key) or key is None or len(key) > MAX_KEY_CHARS:
            return None
        body, dot, mac = key[len(PREFIX):].partition(".")
        try:
            if not dot or not hmac.compare_digest(_unb64(mac), self._mac(body)):
                return None
            inflater = zlib.decompressobj()
            raw = inflater.decompress(_unb64(body), MAX_GRANT_BYTES)
            if inflater.unconsumed_tail:
                return None
            payload = json.loads(raw)
            if payload.get("v") != _VERSION:
                return None
            grant = EphemeralGrant(settings_from_json(payload["settings"]), payload["session"], float(payload["exp"]))
        except (binascii.Error, UnicodeEncodeError, ValueError, zlib.error, KeyError, TypeError, AttributeError):
            return None
        return grant if grant.expires_at > self.clock() else None
