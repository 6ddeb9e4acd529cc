"""``X-Twilio-Signature``: who may call ``/twilio/voice`` and open ``/twilio/media``. No I/O.

Twilio signs each request with its account's auth token: base64 of HMAC-SHA1
over the full URL it requested (scheme, host, path, query) followed by every
POST parameter, sorted by name, as name then value (a repeated name: each of
its distinct values, sorted, as Twilio's Python library does). A websocket upgrade has no parameters: the URL alone. The
URL is the one Twilio used, which a server behind a proxy must rebuild
(:func:`public_url`): the configured ``twilio.public_url``, else the forwarded
headers. A URL with or without its scheme's default port is accepted either way,
as Twilio's own libraries do (proxies differ). Comparisons are in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def compute(auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()) -> str:
    """The signature Twilio sends for ``url`` and the POST ``params`` (name, value pairs; names may repeat)."""
    grouped: dict[str, set[str]] = {}
    for name, value in params:
        grouped.setdefault(name, set()).add(value)
    data = url + "".join(name + value for name in sorted(grouped) for value in sorted(grouped[name]))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _port_variants(url: str) -> list[str]:
    """``url`` as given, and with its default port added or removed."""
    parts = urlsplit(url)
    default = _DEFAULT_PORTS.get(parts.scheme)
    if default is None or parts.hostname is None:
        return [url]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    auth = parts.netloc.rpartition("@")[0]
    auth = auth + "@" if auth else ""
    if parts.port is None:
        other = f"{auth}{host}:{default}"
    elif parts.port == default:
        other = f"{auth}{host}"
    else:
        return [url]
    return [url, urlunsplit((parts.scheme, other, parts.path, parts.query, parts.fragment))]


def valid(auth_token: str, signature: str | None, url: str, params: Iterable[tuple[str, str]] = ()) -> bool:
    """True when ``signature`` is Twilio's for this request."""
    if not signature or not auth_token:
        return False
    pairs = list(params)
    return any(hmac.compare_digest(compute(auth_token, u, pairs).encode(), signature.encode()) for u in _port_variants(url))


def public_url(configured: str | None, headers: Mapping[str, str], scheme: str, path: str, query: str = "") -> str:
    """The URL the request was made to, as its sender saw it: ``configured`` (``twilio.public_url``) + path, else
    ``X-Forwarded-Proto`` / ``X-Forwarded-Host`` (first values) or ``Host``. ``scheme``: the request's own
    (``http``/``ws``); a websocket's is written ``wss``/``ws`` after a forwarded ``https``/``http``."""
    ws = scheme in ("ws", "wss")
    if configured:
        base = configured.rstrip("/")
        if ws:
            base = "wss" + base[len("https"):] if base.startswith("https") else "ws" + base[len("http"):]
    else:
        proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower() or scheme
        if ws:
            proto = {"https": "wss", "http": "ws"}.get(proto, proto)
        host = headers.get("x-forwarded-host", "").split(",")[0].strip() or headers.get("host", "") or "localhost"
        base = f"{proto}://{host}"
    return base + path + (f"?{query}" if query else "")
