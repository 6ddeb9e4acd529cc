"""Reconnecting after a refusal or a drain: which endings are worth another try, and when.

A kame replica refuses a session it has no room for (close 1013 "server full, retry later", or
"server starting"), closes its sessions with 1001 "server shutting down" when it drains for a
rolling update, and a load balancer in front answers the websocket handshake with HTTP 503 when
no replica has room. All three mean "try again shortly, probably elsewhere". Clients wait a
growing, jittered delay (so that the sessions of a drained replica do not all come back in the
same instant) and say so to the user. A reconnect starts a new conversation, unless the server gave
the session a resume handle (kame's events on): then a dropped connection or a drain reconnects with
``?resume=HANDLE`` and the conversation goes on (docs/protocol.md, "Reconnecting").

:func:`backoff_delay_s` and :func:`retry_reason` are pure; :class:`Retrier` adds the clock, the
random draw and the message; :func:`open_with_retry` is the connect loop the clients share.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

#: Close codes after which a new session is worth trying (RFC 6455 / IANA registry).
RETRY_CLOSE_CODES: dict[int, str] = {
    1001: "the server is going away (drain or restart)",
    1012: "the server is restarting",
    1013: "the server is busy",
}
#: HTTP statuses of a refused websocket handshake worth another try (503 from a load balancer
#: with no replica that has room; 502/504 from a gateway whose replica just went away).
RETRY_HTTP_STATUSES: dict[int, str] = {
    502: "the gateway lost its server",
    503: "no server has room",
    504: "the gateway timed out",
}


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with jitter: retry ``n`` (1 = the first) waits a uniform draw in
    ``[(1 - jitter) * d, d]`` with ``d = min(max_s, first_s * factor ** (n - 1))``; after
    ``attempts`` retries in a row the client gives up."""

    first_s: float = 0.25
    factor: float = 2.0
    max_s: float = 8.0
    jitter: float = 0.5
    attempts: int = 8

    def __post_init__(self) -> None:
        if not (self.first_s > 0 and self.factor >= 1 and self.max_s >= self.first_s and 0 <= self.jitter <= 1):
            raise ValueError(f"invalid back-off {self}")
        if self.attempts < 0:
            raise ValueError("attempts must be >= 0")


def backoff_delay_s(policy: Backoff, retry: int, draw: float) -> float:
    """Seconds to wait before retry number ``retry`` (1-based); ``draw`` is uniform in [0, 1)."""
    if retry < 1:
        raise ValueError("retry counts from 1")
    if not 0.0 <= draw <= 1.0:
        raise ValueError("draw must be in [0, 1]")
    ceiling = min(policy.max_s, policy.first_s * policy.factor ** min(retry - 1, 64))
    return ceiling * (1.0 - policy.jitter * draw)


def retry_reason(*, close_code: int | None = None, http_status: int | None = None) -> str | None:
    """Why another try makes sense, or None when it does not (a policy refusal, bad parameters...)."""
    if http_status is not None:
        return RETRY_HTTP_STATUSES.get(http_status)
    if close_code is not None:
        return RETRY_CLOSE_CODES.get(close_code)
    return None


def handshake_status(exc: BaseException) -> int | None:
    """The HTTP status of a websocket handshake the server refused (websockets' ``InvalidStatus``)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return int(status) if isinstance(status, int) else None


class GaveUp(Exception):
    """Every retry was refused; the message says what the last refusal was."""


class Refused(Exception):
    """The server ended the attempt in a way a retry would not fix (the message says how)."""


class Retrier:
    """Counts consecutive failed attempts, waits the back-off before the next one and tells the user.

    ``reset()`` after a session got going: its end starts a fresh count."""

    def __init__(
        self,
        policy: Backoff | None = None,
        *,
        say: Callable[[str], None] = print,
        draw: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.policy = policy or Backoff()
        self.say = say
        self._draw = draw
        self._sleep = sleep
        self.failures = 0  # consecutive, since the last reset
        self.reconnects = 0  # sessions opened after the first one (each a new conversation)
        self.started = False  # a session got going once: later tries start a new conversation
        self.waited_s = 0.0

    def reset(self) -> None:
        self.failures = 0

    async def wait(self, why: str, *, resuming: bool = False) -> bool:
        """Wait before the next try; False (without waiting) when the retries are used up. ``resuming``: the
        next try takes the same conversation back (no "new conversation" note)."""
        self.failures += 1
        if self.failures > self.policy.attempts:
            self.say(f"{why}: giving up after {self.policy.attempts} retries")
            return False
        delay = backoff_delay_s(self.policy, self.failures, self._draw())
        note = "; a new conversation starts" if self.started and not resuming else ""
        self.say(f"{why}: reconnecting in {delay:.1f} s (retry {self.failures} of {self.policy.attempts}){note}")
        self.waited_s += delay
        await self._sleep(delay)
        return True


class _Session(Protocol):
    close_code: int | None
    close_reason: str

    async def close(self, code: int = 1000) -> None: ...


S = TypeVar("S", bound=_Session)


def describe(code: int | None, reason: str, why: str) -> str:
    detail = f"{code} {reason}".strip() if code is not None else reason
    return f"{why} ({detail})" if detail else why


async def open_with_retry(
    open_session: Callable[[], Awaitable[S]],
    ready: Callable[[S], Awaitable[bool]],
    retrier: Retrier,
) -> S:
    """``open_session()`` until ``ready(session)`` says it is usable, retrying HTTP 502/503/504
    handshakes and 1001/1012/1013 closes with the back-off; other failures raise at once
    (:class:`Refused`, or the connect error itself), and :class:`GaveUp` when retries run out."""
    while True:
        try:
            session = await open_session()
        except Exception as exc:
            status = handshake_status(exc)
            why = retry_reason(http_status=status) if status is not None else None
            if why is None:
                raise
            message = describe(None, f"HTTP {status}", why)
        else:
            if await ready(session):
                retrier.started = True
                return session
            code, text = session.close_code, session.close_reason
            await session.close()
            why = retry_reason(close_code=code)
            if why is None:
                detail = f"{code} {text}".strip() if code is not None else (text or "closed without a code")
                raise Refused(f"the server refused the session ({detail})")
            message = describe(code, text, why)
        if not await retrier.wait(message):
            raise GaveUp(f"{message}; gave up after {retrier.policy.attempts} retries")


# --------------------------------------------------------------------------- resuming (docs/protocol.md)
#: Close codes of a connection that dropped rather than one the server ended (1006: no close frame).
DROPPED_CLOSE_CODES = frozenset({1006})
#: The events that carry a session's resume handle (Realtime events; /api/chat's 0x04 JSON has the same).
HANDLE_EVENTS = frozenset({"kame.session.resumable", "kame.session.ending"})


def latest_handle(events: Iterable[Any]) -> str | None:
    """The last resume handle the server gave (``kame.session.resumable``, or a drain's
    ``kame.session.ending``), None when it gave none (a server or session without resume)."""
    handle: str | None = None
    for event in events:
        if isinstance(event, dict) and event.get("type") in HANDLE_EVENTS and event.get("handle"):
            handle = str(event["handle"])
    return handle


def resume_reason(close_code: int | None, handle: str | None, *, moving: bool = False) -> str | None:
    """Why to reconnect WITH the handle (the same conversation goes on), or None: no handle, or an ending
    a resume cannot mend. ``moving``: the client left on its own after the drain's notice."""
    if handle is None:
        return None
    if moving:
        return "the server is draining: the conversation moves to another replica"
    if close_code is None or close_code in DROPPED_CLOSE_CODES:
        return "the connection dropped"
    return retry_reason(close_code=close_code)
