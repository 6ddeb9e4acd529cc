"""The drain of the session manager (kame.server.runtime.manager), with stand-in sessions and real asyncio time."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from kame.server.runtime.manager import DRAIN_REASON, DrainClock, SessionManager
from kame.server.telemetry.metrics import ServerMetrics


@dataclass
class Session:
    id: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ended: tuple[str, int | None, str] | None = None
    told: list[float] = field(default_factory=list)

    def end(self, label: str, code: int | None, reason: str = "", error: str | None = None) -> None:
        if self.ended is None:
            self.ended = (label, code, reason)
            asyncio.get_running_loop().call_later(0.05, self.done.set)  # the close handshake


@dataclass
class Noticed(Session):
    def notify_draining(self, seconds_left: float) -> None:
        self.told.append(seconds_left)


def test_drain_clock() -> None:
    c = DrainClock(started=100.0, grace_s=5.0)
    assert c.deadline == 105.0 and c.seconds_left(101.5) == 3.5 and c.seconds_left(200.0) == 0.0


def test_sessions_are_told_run_on_for_the_grace_then_are_closed_with_1001() -> None:
    async def main() -> tuple[SessionManager, list[Session], float]:
        m = SessionManager(ServerMetrics())
        a, b, plain = Noticed("a"), Noticed("b"), Session("plain")
        for s in (a, b, plain):
            m.add(s)
        t0 = time.monotonic()
        await m.drain_sessions(0.6, 1.0)
        return m, [a, b, plain], time.monotonic() - t0

    m, (a, b, plain), took = asyncio.run(main())
    assert m.draining and m.metrics.draining._value.get() == 1  # type: ignore[attr-defined]
    assert a.told == b.told and len(a.told) == 1 and 0.5 < a.told[0] <= 0.6
    assert plain.told == []  # no notice hook: closed at the end all the same
    for s in (a, b, plain):
        assert s.ended == ("draining", 1001, DRAIN_REASON)
    assert 0.6 <= took < 1.2


def test_the_drain_ends_early_when_sessions_leave_and_when_cut() -> None:
    async def leave() -> float:
        m = SessionManager(ServerMetrics())
        s = Noticed("s")
        m.add(s)

        async def client_hangs_up() -> None:
            await asyncio.sleep(0.2)
            s.done.set()
            m.remove(s)

        t0 = time.monotonic()
        await asyncio.gather(m.drain_sessions(30.0, 1.0), client_hangs_up())
        assert s.ended is None  # it left on its own: nothing to close
        return time.monotonic() - t0

    assert asyncio.run(leave()) < 1.0

    async def cut() -> tuple[float, Session]:
        m = SessionManager(ServerMetrics())
        s = Noticed("s")
        m.add(s)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        t0 = time.monotonic()
        await m.drain_sessions(30.0, 1.0, stop)
        return time.monotonic() - t0, s

    took, s = asyncio.run(cut())
    assert took < 1.0 and s.ended is not None and s.ended[1] == 1001


def test_a_session_registered_during_the_drain_is_told_at_once() -> None:
    async def main() -> Noticed:
        m = SessionManager(ServerMetrics())
        assert m.begin_draining(10.0) and not m.begin_draining(10.0)
        late = Noticed("late")
        m.add(late)
        return late

    late = asyncio.run(main())
    assert len(late.told) == 1 and late.told[0] == pytest.approx(10.0, abs=0.5)


def test_a_failing_notice_does_not_stop_the_drain() -> None:
    class Broken(Session):
        def notify_draining(self, seconds_left: float) -> None:
            raise RuntimeError("socket gone")

    async def main() -> Session:
        m = SessionManager(ServerMetrics())
        s = Broken("x")
        m.add(s)
        await m.drain_sessions(0.1, 0.5)
        return s

    assert asyncio.run(main()).ended == ("draining", 1001, DRAIN_REASON)
