"""Secrets masked out of text: the one ``redact`` for logs, errors sent to clients and back-end errors.

Why one function: a token that one path masks and another prints is a leak. It masks the values it
is given (API keys read from the environment, the server's token) and what looks like a credential
wherever it appears: ``token=`` and ``resume=`` in query strings, the ``openai-insecure-api-key.`` websocket
subprotocol and ``Bearer`` headers. It only masks: shortening for a one-line message is the
caller's (:func:`kame.backend.errors.error_detail`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_PATTERNS = (
    re.compile(r"(?i)(token=)[^&\s\"']+"),
    re.compile(r"(?i)\b(resume=)[^&\s\"']+"),  # a session's resume handle (server/runtime/resume.py)
    re.compile(r"(?i)(openai-insecure-api-key\.)[^,\s\"']+"),
    re.compile(r"(?i)(bearer\s+)[^\s,\"']+"),
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret and every credential-looking value replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(rf"\g<1>{MASK}", text)
    return text


def client_safe(message: str, limit: int = 300) -> str:
    """An error message fit for a client: URLs and token-like values masked, length bounded."""
    text = redact(_URL.sub("<url>", str(message)))
    return text if len(text) <= limit else text[: limit - 3] + "..."
