"""Typed back-end errors.

The oracle loop only needs to tell "try again later" (busy, rate limited,
breaker open) from "this back-end is broken" (auth, malformed) and from
timeouts; the server maps ``kind`` to metrics and to the client's error
message. Messages are built by us from sanitized parts only: they never
carry an API key (see :func:`error_detail`).
"""

from __future__ import annotations

from collections.abc import Iterable

from kame.redaction import redact

MAX_DETAIL_CHARS = 200


def error_detail(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` redacted (:func:`kame.redaction.redact`), on one line, cut to a sane length."""
    text = " ".join(redact(text, secrets).split())
    if len(text) > MAX_DETAIL_CHARS:
        text = text[: MAX_DETAIL_CHARS - 3] + "..."
    return text


class BackendError(Exception):
    """A request to an LLM back-end failed. ``kind`` is a short stable label for metrics."""

    kind = "error"

    def __init__(self, backend: str, message: str, *, status_code: int | None = None) -> None:
        super().__init__(f"back-end {backend!r}: {message}")
        self.backend = backend
        self.status_code = status_code


class BackendTimeout(BackendError):
    """No first token, or no end of the reply, within the configured time.

    ``phase`` is ``connect``, ``first_token``, ``total`` or ``read``.
    """

    kind = "timeout"

    def __init__(self, backend: str, phase: str, seconds: float | None) -> None:
        limit = f" after {seconds:g} s" if seconds is not None else ""
        super().__init__(backend, f"timed out waiting for {phase.replace('_', ' ')}{limit}")
        self.phase = phase
        self.seconds = seconds


class BackendRateLimited(BackendError):
    """The provider answered HTTP 429."""

    kind = "rate_limited"

    def __init__(self, backend: str, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(backend, message, status_code=429)
        self.retry_after_s = retry_after_s


class BackendServerError(BackendError):
    """The provider answered 5xx, or sent an error event inside the stream."""

    kind = "server_error"


class BackendAuthError(BackendError):
    """The provider refused the credentials (401/403), or none were found."""

    kind = "auth"


class BackendRequestError(BackendError):
    """The provider rejected the request itself (other 4xx: unknown model, bad parameter)."""

    kind = "bad_request"


class BackendMalformedStream(BackendError):
    """The response was not a chat-completions SSE stream we can read."""

    kind = "malformed"


class BackendUnavailable(BackendError):
    """The server could not be reached (connection refused, reset, DNS)."""

    kind = "unavailable"


class BackendToolsNotAllowed(BackendError):
    """A request with function tools for a back-end whose ``allow_tools`` is off (never sent)."""

    kind = "tools_not_allowed"


class BackendToolsRefused(BackendError):
    """The server refused the request because of its function tools (e.g. vLLM without
    ``--enable-auto-tool-choice``): the registry marks the back-end tool-less and asks again without them.

    ``reason`` is the server's own message (redacted), ``server`` which refusal it matched.
    """

    kind = "tools_refused"

    def __init__(self, backend: str, message: str, *, reason: str, server: str, status_code: int | None = None) -> None:
        super().__init__(backend, message, status_code=status_code)
        self.reason = reason
        self.server = server


class BackendBusy(BackendError):
    """A concurrency or rate cap was hit and no slot freed within the short wait."""

    kind = "busy"


class BackendCircuitOpen(BackendError):
    """The back-end's circuit breaker is open: it failed repeatedly and is resting."""

    kind = "circuit_open"

    def __init__(self, backend: str, retry_in_s: float) -> None:
        super().__init__(backend, f"circuit breaker open after repeated failures; next try in {retry_in_s:.1f} s")
        self.retry_in_s = retry_in_s


class UnknownBackend(KeyError):
    """A client named a back-end that is not configured."""

    def __init__(self, name: str | None, valid: Iterable[str]) -> None:
        self.name = name
        self.valid = sorted(valid)
        names = ", ".join(self.valid) or "(none configured)"
        if name is None:
            msg = f"no default back-end; name one of: {names} (or set KAME_LLM_BASE_URL / backends in the config)"
        else:
            msg = f"unknown back-end {name!r}; valid names: {names}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])
