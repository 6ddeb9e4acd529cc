"""Server lifecycle: starting state, idle timeout, maximum duration, SIGTERM drain, the no-GPU message."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.moshi_client import MoshiClient, ServerProcess
from tests.support.servers import LIFECYCLE, LIFECYCLE_SLOTS

#: the real-time lane under xdist (tests/conftest.py): server processes of its own (signals, drains)
pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def ended_at_start(lifecycle_server: ServerProcess) -> dict[str, float]:
    """Sessions the shared server ended by idle and maximum duration before this module's tests."""
    return {r: lifecycle_server.metric("kame_sessions_ended_total", f'reason="{r}"') for r in ("idle", "max_duration")}


@pytest.fixture(scope="module")
def server(lifecycle_server: ServerProcess, ended_at_start: dict[str, float]) -> ServerProcess:
    """tests/support/servers.py ``LIFECYCLE``: no ASR, two slots, 1 s idle timeout, 3 s maximum duration
    warned 1 s before, a 30-tick warm-up, collections every 0.5 s."""
    return lifecycle_server


@pytest.fixture
def drain_server(kame_cache_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """The SIGTERM test's own server (the signal ends it): ``LIFECYCLE`` with three slots."""
    env = {**LIFECYCLE.env, "KAME_FRONTEND__BATCH_SIZE": "3", "KAME_SERVER__WARMUP_STEPS": "1"}
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp_path / "server.log", env=env,
                        label="lifecycle (drain)").start()
    yield srv
    srv.stop(signal.SIGKILL)


def test_server_reports_starting_until_warmed_up(server: ServerProcess) -> None:
    assert server.statuses_seen[0] == "starting", server.statuses_seen
    assert server.statuses_seen[-1] == "ok"
    logs = server.logs()
    n = LIFECYCLE_SLOTS
    assert logs.index(f"warm-up: 30 ticks of {n} slots") < logs.index(f"ready: {n} sessions on cpu")


def test_idle_client_is_closed(server: ServerProcess) -> None:
    async def main() -> tuple[MoshiClient, float]:
        c = await MoshiClient.connect(server.ws_url)
        assert await c.wait_handshake(10)
        await c.send_silence(0.4)
        t0 = time.monotonic()
        await c.wait_closed(5)
        return c, time.monotonic() - t0

    c, waited = asyncio.run(main())
    assert c.close_code == 1000
    assert c.close_reason.startswith("idle timeout")
    assert c.errors == [c.close_reason]  # the reason came as a 0x05 message before the close
    assert 0.5 <= waited <= 2.5


def test_maximum_duration_warns_then_closes(server: ServerProcess) -> None:
    async def main() -> tuple[MoshiClient, float]:
        c = await MoshiClient.connect(server.ws_url)
        assert await c.wait_handshake(10)
        t0 = time.monotonic()
        await c.send_silence(6.0)  # stops by itself once the server closes
        await c.wait_closed(3)
        return c, time.monotonic() - t0

    c, lasted = asyncio.run(main())
    assert c.close_code == 1000
    assert c.close_reason.startswith("maximum session duration reached")
    assert 2.5 <= lasted <= 4.5
    (info,) = c.metadata  # the server info after the handshake, nothing else as 0x04
    assert info["lm_model_file"] == "tiny:0"
    notice, reason = c.errors  # 0x05: the warning, then the close reason
    assert notice.startswith("this session ends in 1 s") and "maximum session duration is 3 s" in notice
    assert reason == c.close_reason
    assert c.stats.audio_received_s > 1.5  # it was a live session until then


def test_slots_are_reused_after_timeouts(server: ServerProcess, ended_at_start: dict[str, float]) -> None:
    status, body = server.get_json("/health")
    assert status == 200 and body["sessions"]["active"] == 0
    assert server.metric("kame_sessions_ended_total", 'reason="idle"') - ended_at_start["idle"] >= 1
    assert server.metric("kame_sessions_ended_total", 'reason="max_duration"') - ended_at_start["max_duration"] >= 1


def test_memory_housekeeping_runs(server: ServerProcess) -> None:
    """The allocator settings are applied at start and full collections run on their timer, cheaply."""
    assert "malloc: arena_max=2 mmap_threshold_bytes=131072" in server.logs()
    deadline = time.monotonic() + 5
    while server.metric("kame_gc_seconds_count") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    runs = server.metric("kame_gc_seconds_count")
    assert runs >= 2
    assert server.metric("kame_gc_seconds_sum") / runs < 0.05  # model objects are frozen: not walked


@pytest.mark.server_process_subject
@pytest.mark.alone  # the audio its clients receive through the grace is timing: four workers starved it
def test_sigterm_drains_sessions_and_exits_quickly(drain_server: ServerProcess) -> None:
    """SIGTERM: admission stops at once but the server keeps listening (/ready 503, a new websocket
    1001) while live sessions run on for drain_grace_s (2 s by default); then 1001 and exit < 8 s."""
    grace = 2.0

    async def main() -> tuple[list[MoshiClient], float, dict[str, object], list[float]]:
        clients = await asyncio.gather(*[MoshiClient.connect(drain_server.ws_url) for _ in range(2)])
        assert all(await asyncio.gather(*[c.wait_handshake(10) for c in clients]))
        senders = [asyncio.create_task(c.send_silence(6.0)) for c in clients]
        await asyncio.sleep(0.8)
        t0 = time.monotonic()
        drain_server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        during: dict[str, object] = {}
        during["ready"] = await asyncio.to_thread(drain_server.get_json, "/ready")
        during["ready_k8s"] = (await asyncio.to_thread(drain_server.get, "/ready?full_ok=1"))[0]
        during["health"] = (await asyncio.to_thread(drain_server.get_json, "/health"))[1]["status"]
        late = await MoshiClient.connect(drain_server.ws_url)
        during["late"] = await late.wait_closed(5)
        during["late_handshake"] = late.handshake.is_set()
        during["live_then"] = [c.closed.is_set() for c in clients]
        during["told"] = [list(c.errors) for c in clients]
        closed_at: list[float] = []
        for c in clients:
            await c.wait_closed(8)
            closed_at.append(time.monotonic() - t0)
        await asyncio.gather(*senders)
        return clients, t0, during, closed_at

    clients, t0, during, closed_at = asyncio.run(main())
    assert during["ready"] == (503, {"ready": False, "reason": "draining"})
    assert during["ready_k8s"] == 503 and during["health"] == "draining"
    assert during["late"] == (1001, "server shutting down") and during["late_handshake"] is False
    assert during["live_then"] == [False, False]  # still running 0.3 s into the drain
    for told in during["told"]:  # type: ignore[attr-defined]
        assert told in (["the server is shutting down: this session ends in 2 s"],
                        ["the server is shutting down: this session ends in 1 s"]), told  # 0x05, at once
    for c in clients:
        assert (c.close_code, c.close_reason) == (1001, "server shutting down")
        # 0x05: the drain notice at once, then the close reason before the close frame
        # (this module's 3 s maximum duration adds its own warning in between)
        assert c.errors[0] == "the server is shutting down: this session ends in 2 s", c.errors
        assert c.errors[-1] == "server shutting down", c.errors
        assert c.stats.audio_received_s > 0.8 + grace - 0.5  # audio flowed through the grace
    assert all(grace - 0.2 <= t < grace + 3.0 for t in closed_at), closed_at
    drain_server.proc.wait(timeout=max(0.1, 8.0 - (time.monotonic() - t0)))
    assert time.monotonic() - t0 < 8.0
    assert drain_server.proc.returncode is not None


def test_default_config_without_gpu_says_how_to_run_the_cpu_demo(kame_cache_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAME_")}
    env.update({"KAME_CACHE_DIR": str(kame_cache_dir), "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"})
    out = subprocess.run(
        [sys.executable, "-m", "kame.cli", "serve", "--port", "1"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert "no CUDA GPU" in lines[0] and "kame serve --config cpu-demo" in lines[0]


def test_tiny_checkpoint_spec_resolves_in_the_cache(kame_cache_dir: Path) -> None:
    from kame.errors import UserError
    from kame.server.host import resolve_checkpoint_spec

    path = Path(resolve_checkpoint_spec("tiny:0", kame_cache_dir))
    assert path.is_dir() and (path / "config.json").is_file()
    assert path.is_relative_to(kame_cache_dir)
    assert resolve_checkpoint_spec("SakanaAI/kame", kame_cache_dir) == "SakanaAI/kame"
    with pytest.raises(UserError, match="tiny:SEED"):
        resolve_checkpoint_spec("tiny:x", kame_cache_dir)


@pytest.mark.server_process_subject
def test_a_second_signal_ends_a_long_drain_at_once(kame_cache_dir: Path, tmp_path: Path) -> None:
    """With a Kubernetes-like grace (30 s) a first SIGTERM starts the drain; a second one (an operator's
    second Ctrl-C, or docker stop's escalation) ends it: 1001 at once, exit within seconds."""
    srv = ServerProcess(
        cache_dir=kame_cache_dir,
        log_path=tmp_path / "server.log",
        env={"KAME_ASR__KIND": "none", "KAME_FRONTEND__BATCH_SIZE": "1", "KAME_SERVER__DRAIN_GRACE_S": "30",
             "KAME_SERVER__WARMUP_STEPS": "1"},
    ).start()
    try:
        async def main() -> tuple[MoshiClient, float, float]:
            c = await MoshiClient.connect(srv.ws_url)
            assert await c.wait_handshake(10)
            sender = asyncio.create_task(c.send_silence(20.0))
            await asyncio.sleep(0.5)
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            assert not c.closed.is_set()  # the grace is 30 s
            t_second = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            await c.wait_closed(10)
            closed_after = time.monotonic() - t_second
            sender.cancel()
            return c, t_second, closed_after

        c, t_second, closed_after = asyncio.run(main())
        assert (c.close_code, c.close_reason) == (1001, "server shutting down")
        assert closed_after < 2.0
        srv.proc.wait(timeout=10)
        assert time.monotonic() - t_second < 10.0
        assert "ending the drain now" in srv.logs()
    finally:
        srv.stop(signal.SIGKILL)
