"""/v1/realtime session lifecycle on the real server: idle timeout, maximum duration (warned first, open
response closed as incomplete), refusal when full (counted), SIGTERM drain. Same rules as /api/chat."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kame.client.realtime_client import RealtimeClient
from tests.support.moshi_client import MoshiClient, ServerProcess
from tests.support.servers import LIFECYCLE

#: the real-time lane under xdist (tests/conftest.py): drained servers of its own besides the shared one
pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def server(lifecycle_server: ServerProcess) -> ServerProcess:
    """tests/support/servers.py ``LIFECYCLE``: no ASR, two slots, 1 s idle timeout, 3 s maximum duration
    warned 1 s before."""
    return lifecycle_server


@pytest.fixture
def drain_server(kame_cache_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """The SIGTERM test's own server (the signal ends it): ``LIFECYCLE`` with a one-tick warm-up."""
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp_path / "server.log",
                        env={**LIFECYCLE.env, "KAME_SERVER__WARMUP_STEPS": "1"}, label="lifecycle (drain)").start()
    yield srv
    srv.stop(signal.SIGKILL)


def url(server: ServerProcess) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/realtime"


def _wait_free(server: ServerProcess, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = server.get_json("/health")[1]["sessions"]
        if s["active"] == 0 and s["free"] == s["max"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"slots not free: {s}")


def test_idle_realtime_client_is_closed(server: ServerProcess) -> None:
    async def main() -> tuple[RealtimeClient, float]:
        c = await RealtimeClient.connect(url(server))
        assert await c.wait_for_type("session.created", 10)
        await c.send_silence(0.4)
        t0 = time.monotonic()
        await c.wait_closed(5)
        return c, time.monotonic() - t0

    c, waited = asyncio.run(main())
    assert (c.close_code, c.close_reason) == (1000, "idle timeout: no audio for 1 s")
    assert 0.5 <= waited <= 2.5
    assert c.errors == []


def test_maximum_duration_warns_then_closes_and_ends_the_open_response(server: ServerProcess) -> None:
    _wait_free(server)

    async def main() -> tuple[RealtimeClient, float]:
        c = await RealtimeClient.connect(url(server))
        assert await c.wait_for_type("session.created", 10)
        t0 = time.monotonic()
        await c.send_silence(6.0)  # stops once the server closes
        await c.wait_closed(3)
        return c, time.monotonic() - t0

    c, lasted = asyncio.run(main())
    assert (c.close_code, c.close_reason) == (1000, "maximum session duration reached (3 s)")
    assert 2.5 <= lasted <= 4.5
    ending = c.of_type("kame.session.ending")
    assert len(ending) == 1 and ending[0]["reason"] == "max_duration" and 0 < ending[0]["seconds_left"] <= 1.0
    assert c.stats.audio_received_s > 1.5
    # every response that was opened was closed before the socket was
    created = [e["response"]["id"] for e in c.of_type("response.created")]
    done = {e["response"]["id"]: e["response"]["status"] for e in c.of_type("response.done")}
    assert created and set(created) == set(done)
    assert list(done.values())[-1] in ("incomplete", "completed")


def test_full_server_refuses_with_1013_and_counts_it(server: ServerProcess) -> None:
    _wait_free(server)
    before = server.metric("kame_sessions_rejected_total", 'reason="full"')

    async def main() -> tuple[int | None, str, bool]:
        first = await RealtimeClient.connect(url(server))
        second = await MoshiClient.connect(server.ws_url)  # the two protocols share the slots
        assert await first.wait_for_type("session.created", 10) and await second.wait_handshake(10)
        third = await RealtimeClient.connect(url(server))
        code, reason = await third.wait_closed(5)
        await asyncio.gather(first.close(), second.close())
        return code, reason, third.session is None

    code, reason, no_session = asyncio.run(main())
    assert (code, reason, no_session) == (1013, "server full, retry later", True)
    assert server.metric("kame_sessions_rejected_total", 'reason="full"') == before + 1


@pytest.mark.server_process_subject
def test_sigterm_drains_realtime_sessions(drain_server: ServerProcess) -> None:
    server = drain_server
    _wait_free(server)

    async def main() -> tuple[list[RealtimeClient], float]:
        clients = [await RealtimeClient.connect(url(server)) for _ in range(2)]
        assert all([await c.wait_for_type("session.created", 10) for c in clients])
        senders = [asyncio.create_task(c.send_silence(3.0)) for c in clients]
        await asyncio.sleep(0.8)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*[c.wait_closed(8) for c in clients])
        await asyncio.gather(*senders)
        return clients, t0

    clients, t0 = asyncio.run(main())
    grace = 2.0  # server.drain_grace_s by default
    for c in clients:
        assert (c.close_code, c.close_reason) == (1001, "server shutting down")
        # told at once, then the session ran on for the grace
        endings = [(t, e) for t, e in c.events if e.get("type") == "kame.session.ending" and e.get("reason") == "draining"]
        assert len(endings) == 1, [(round(t - t0, 2), e) for t, e in endings]
        (told_at, ending), = endings
        assert grace - 0.3 <= ending["seconds_left"] <= grace, ending
        assert told_at - t0 < 1.0
        assert c.stats.frame_arrivals[-1] - t0 > grace - 0.5  # audio flowed through the grace
    server.proc.wait(timeout=max(0.1, 8.0 - (time.monotonic() - t0)))
    assert time.monotonic() - t0 < 8.0
