"""The back-off schedule and the retry decisions of reconnecting clients (no server, no torch)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kame.client.reconnect import (
    Backoff,
    GaveUp,
    Refused,
    Retrier,
    backoff_delay_s,
    handshake_status,
    open_with_retry,
    retry_reason,
)


def test_schedule_doubles_up_to_the_cap_with_jitter_below() -> None:
    p = Backoff(first_s=0.25, factor=2.0, max_s=2.0, jitter=0.5, attempts=6)
    top = [backoff_delay_s(p, n, 0.0) for n in range(1, 7)]
    assert top == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    bottom = [backoff_delay_s(p, n, 1.0) for n in range(1, 7)]
    assert bottom == [0.125, 0.25, 0.5, 1.0, 1.0, 1.0]
    assert backoff_delay_s(Backoff(jitter=0.0), 3, 0.7) == 1.0


@given(st.integers(1, 200), st.floats(0, 1))
def test_delay_stays_in_its_band(retry: int, draw: float) -> None:
    p = Backoff()
    d = backoff_delay_s(p, retry, draw)
    ceiling = min(p.max_s, p.first_s * p.factor ** (retry - 1))
    assert ceiling * (1 - p.jitter) - 1e-12 <= d <= ceiling + 1e-12


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        backoff_delay_s(Backoff(), 0, 0.5)
    with pytest.raises(ValueError):
        backoff_delay_s(Backoff(), 1, 1.5)
    with pytest.raises(ValueError):
        Backoff(first_s=0)
    with pytest.raises(ValueError):
        Backoff(jitter=2)


def test_which_endings_are_retried() -> None:
    assert retry_reason(close_code=1013) and retry_reason(close_code=1001) and retry_reason(close_code=1012)
    assert retry_reason(http_status=503) and retry_reason(http_status=502)
    for code in (1000, 1008, 1011, 1007, None):
        assert retry_reason(close_code=code) is None
    for status in (401, 403, 404, 400, 500):
        assert retry_reason(http_status=status) is None


def test_handshake_status_reads_websockets_invalid_status() -> None:
    from websockets.datastructures import Headers
    from websockets.exceptions import InvalidStatus
    from websockets.http11 import Response

    assert handshake_status(InvalidStatus(Response(503, "Service Unavailable", Headers()))) == 503
    assert handshake_status(OSError("refused")) is None


@dataclass
class FakeSession:
    """What open_with_retry sees of a client: a close code once refused."""

    close_code: int | None
    close_reason: str = ""
    closed: bool = False

    async def close(self, code: int = 1000) -> None:
        self.closed = True


def run_attempts(outcomes: list[object], policy: Backoff) -> tuple[object, list[str], list[float]]:
    said: list[str] = []
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    retrier = Retrier(policy, say=said.append, draw=lambda: 0.0, sleep=sleep)
    it = iter(outcomes)

    async def open_session() -> FakeSession:
        o = next(it)
        if isinstance(o, BaseException):
            raise o
        assert isinstance(o, FakeSession)
        return o

    async def ready(s: FakeSession) -> bool:
        return s.close_code is None

    async def main() -> object:
        try:
            return await open_with_retry(open_session, ready, retrier)
        except (GaveUp, Refused, OSError) as exc:
            return exc

    return asyncio.run(main()), said, slept


def test_refusals_and_drains_are_retried_with_backoff_and_said() -> None:
    from websockets.datastructures import Headers
    from websockets.exceptions import InvalidStatus
    from websockets.http11 import Response

    full = FakeSession(1013, "server full, retry later")
    drain = FakeSession(1001, "server shutting down")
    good = FakeSession(None)
    result, said, slept = run_attempts(
        [full, InvalidStatus(Response(503, "Service Unavailable", Headers())), drain, good], Backoff(first_s=0.1, attempts=5)
    )
    assert result is good
    assert slept == pytest.approx([0.1, 0.2, 0.4])
    assert full.closed and drain.closed
    assert "1013 server full" in said[0] and "HTTP 503" in said[1] and "1001 server shutting down" in said[2]
    assert all("reconnecting in" in s and "new conversation" not in s for s in said)  # none had started


def test_after_a_session_the_message_says_a_new_conversation_starts() -> None:
    said: list[str] = []

    async def sleep(s: float) -> None:
        pass

    retrier = Retrier(Backoff(), say=said.append, draw=lambda: 0.5, sleep=sleep)
    retrier.started = True
    assert asyncio.run(retrier.wait("the server is going away (1001 server shutting down)"))
    assert said == ["the server is going away (1001 server shutting down): reconnecting in 0.2 s (retry 1 of 8); "
                    "a new conversation starts"]


def test_other_refusals_fail_at_once_and_retries_run_out() -> None:
    result, said, _ = run_attempts([FakeSession(1008, "unauthorized")], Backoff())
    assert isinstance(result, Refused) and "1008 unauthorized" in str(result) and said == []
    result, _, _ = run_attempts([OSError("connection refused")], Backoff())
    assert isinstance(result, OSError)
    result, said, slept = run_attempts([FakeSession(1013, "full")] * 4, Backoff(attempts=3))
    assert isinstance(result, GaveUp) and len(slept) == 3 and "giving up" in said[-1]


def test_a_send_cut_short_by_the_server_returns_once_the_close_is_known() -> None:
    """``send_pcm`` that stops because the connection closed under a send returns only once the receiver
    has the close (``closed`` set, the code read): a caller deciding whether to reconnect reads 1001, not
    an open session. Here the receiver takes the close 0.3 s after the send failed (on a loaded machine it
    came after the sender noticed: kame mic then skipped its reconnect)."""
    import numpy as np

    from kame.client.stats import FRAME, AudioSessionBase, StreamStats

    class Session(AudioSessionBase):
        def __init__(self) -> None:
            self.stats = StreamStats()
            self.closed = asyncio.Event()
            self.close_code: int | None = None
            self.pieces = 0

        async def _send_piece(self, piece: np.ndarray, chunk: int) -> int | None:
            self.pieces += 1
            if self.pieces < 3:
                return piece.size
            # the connection is gone (the protocol clients' send_raw caught websockets' ConnectionClosed)
            asyncio.get_running_loop().call_later(0.3, self._receiver_takes_the_close)
            return None

        def _receiver_takes_the_close(self) -> None:
            self.close_code = 1001
            self.closed.set()

    async def main() -> tuple[int, bool, int | None]:
        s = Session()
        sent = await s.send_pcm(np.zeros(10 * FRAME, np.float32), realtime=False)
        return sent, s.closed.is_set(), s.close_code

    sent, closed, code = asyncio.run(main())
    assert sent == 2 * FRAME
    assert closed and code == 1001
