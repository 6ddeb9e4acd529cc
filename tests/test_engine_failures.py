"""The engine thread never dies silently: each failure injected, from the thread up to the client.

Engine level (a tiny model, the real :class:`EngineThread`): a failing or slow attach, a failing or slow
reset, a failing command, a tick that raises something else than ``EngineStepError``, and a loop that
dies. Server level (the real app under uvicorn on loopback, the kame clients): what the client sees
(1011 after the wire's error message, the slot released, the end counted), and once the thread is dead
``/health`` and ``/ready`` answering 503 ``failed``, new sessions refused, live ones ended with 1011.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kame.client.moshi_client import MoshiClient
from kame.client.realtime_client import RealtimeClient
from kame.frontend.config import FrontendConfig
from kame.frontend.engine import EngineCore, SlotOutput
from kame.frontend.engine_thread import AsyncSlot, EngineFailed, EngineThread
from kame.frontend.models import load_frontend
from tests.support.moshi_client import free_port

SILENCE = np.zeros(1920, np.float32)


@pytest.fixture(scope="module")
def core(tiny_kame_ckpt: Path) -> EngineCore:
    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2)
    return EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)


@pytest.fixture
def engine(core: EngineCore) -> Iterator[EngineThread]:
    deaths: list[str] = []
    eng = EngineThread(core, on_death=deaths.append)
    eng.deaths = deaths  # type: ignore[attr-defined]
    eng.start()
    yield eng
    eng.stop()


def failing_once(original: Callable[..., Any], *, error: BaseException | None = None, sleep_s: float = 0.0) -> Callable[..., Any]:
    calls = {"n": 0}

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            if sleep_s:
                time.sleep(sleep_s)
            if error is not None:
                raise error
        return original(*args, **kwargs)

    return wrapped


async def a_frame_comes_out(slot: AsyncSlot) -> SlotOutput:
    slot.feed(np.zeros(1920 * 2, np.float32))
    item = await asyncio.wait_for(slot.outputs.get(), 5)
    assert isinstance(item, SlotOutput), item
    return item


async def wait_free(eng: EngineThread, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while eng.free_slots != n:
        assert time.monotonic() < deadline, f"free slots {eng.free_slots}, expected {n}"
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- the engine thread


def test_a_failing_attach_fails_that_session_and_frees_the_slot(engine: EngineThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.core, "attach", failing_once(engine.core.attach, error=RuntimeError("cuda oom")))

    async def main() -> None:
        with pytest.raises(EngineFailed, match="attach failed"):
            await AsyncSlot(engine).attach()
        await wait_free(engine, 2)  # nothing stays reserved
        ok = AsyncSlot(engine)
        await ok.attach()
        await a_frame_comes_out(ok)
        ok.detach()

    asyncio.run(main())
    assert engine.alive and engine.deaths == []  # type: ignore[attr-defined]


def test_an_attach_beyond_its_bound_fails_the_session(engine: EngineThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.core, "attach", failing_once(engine.core.attach, sleep_s=1.0))

    async def main() -> float:
        t0 = time.monotonic()
        with pytest.raises(EngineFailed, match="did not attach the slot within 0.3 s"):
            await AsyncSlot(engine, timeout_s=0.3).attach()
        waited = time.monotonic() - t0
        await wait_free(engine, 2)  # released (the engine resets it before anyone steps it again)
        ok = AsyncSlot(engine)
        await ok.attach()
        await a_frame_comes_out(ok)
        ok.detach()
        return waited

    waited = asyncio.run(main())
    assert 0.3 <= waited < 0.9  # the bound, not the slow attach
    assert engine.alive


def test_a_failing_or_slow_reset_fails_the_session(engine: EngineThread, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        slot = AsyncSlot(engine, timeout_s=0.3)
        await slot.attach()
        monkeypatch.setattr(engine.core, "detach", failing_once(engine.core.detach, error=ValueError("bad state")))
        with pytest.raises(EngineFailed, match="reset failed"):
            await slot.reset()
        await wait_free(engine, 2)
        slot = AsyncSlot(engine, timeout_s=0.3)
        await slot.attach()
        monkeypatch.setattr(engine.core, "detach", failing_once(engine.core.detach, sleep_s=1.0))
        with pytest.raises(EngineFailed, match="did not reset the slot"):
            await slot.reset()
        await wait_free(engine, 2)

    asyncio.run(main())
    assert engine.alive


def test_a_failing_command_fails_its_slot_only(engine: EngineThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.core, "oracle_reset", failing_once(engine.core.oracle_reset, error=IndexError("fifo")))

    async def main() -> None:
        bad, good = AsyncSlot(engine), AsyncSlot(engine)
        await bad.attach()
        await good.attach()
        bad.oracle_reset([5, 6])
        item = await asyncio.wait_for(bad.outputs.get(), 5)
        assert isinstance(item, EngineFailed) and "oracle reset failed (IndexError)" in str(item)
        await wait_free(engine, 1)  # the failed slot is released
        await a_frame_comes_out(good)  # the other session never noticed
        good.detach()

    asyncio.run(main())
    assert engine.alive


def test_a_tick_that_raises_fails_its_slots_not_the_thread(engine: EngineThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.core, "tick", failing_once(engine.core.tick, error=ValueError("frame of 17 samples")))

    async def main() -> None:
        slot = AsyncSlot(engine)
        await slot.attach()
        slot.feed(SILENCE)
        item = await asyncio.wait_for(slot.outputs.get(), 5)
        assert isinstance(item, EngineFailed) and "ValueError" in str(item)
        await wait_free(engine, 2)
        again = AsyncSlot(engine)
        await again.attach()
        await a_frame_comes_out(again)
        again.detach()

    asyncio.run(main())
    assert engine.alive and engine.error is None


def test_a_dead_thread_says_so(engine: EngineThread, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        live = AsyncSlot(engine)
        await live.attach()
        monkeypatch.setattr(engine, "_take_frames", failing_once(engine._take_frames, error=RuntimeError("a bug")))
        live.feed(SILENCE)
        item = await asyncio.wait_for(live.outputs.get(), 5)
        assert isinstance(item, EngineFailed) and "the engine stopped" in str(item)  # the live session is told
        with pytest.raises(EngineFailed, match="engine thread is dead"):
            await AsyncSlot(engine).attach()

    asyncio.run(main())
    assert not engine.alive and engine.free_slots == 0
    assert engine.error == "RuntimeError: a bug"
    assert engine.deaths == ["RuntimeError: a bug"]  # type: ignore[attr-defined]


def test_a_hung_tick_shows_as_stuck_and_can_be_declared_dead(engine: EngineThread, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    original = engine.core.tick

    def hang(frames: Any) -> Any:
        release.wait(30)
        return original(frames)

    async def main() -> None:
        live = AsyncSlot(engine)
        await live.attach()
        await a_frame_comes_out(live)
        assert engine.stuck_for() < 1.0  # waiting for work is not being stuck
        monkeypatch.setattr(engine.core, "tick", hang)
        live.feed(np.zeros(1920 * 2, np.float32))
        deadline = time.monotonic() + 5
        while engine.stuck_for() < 0.3:
            assert time.monotonic() < deadline, "the hung tick does not show"
            await asyncio.sleep(0.02)
        assert engine.alive  # hung, not dead: nothing but stuck_for() tells
        engine.declare_dead("hung")
        item = await asyncio.wait_for(live.outputs.get(), 5)
        while isinstance(item, SlotOutput):  # frames from before the hang
            item = await asyncio.wait_for(live.outputs.get(), 5)
        assert isinstance(item, EngineFailed) and "the engine stopped" in str(item)  # the live session is told
        with pytest.raises(EngineFailed, match="engine thread is dead"):
            await AsyncSlot(engine).attach()

    try:
        asyncio.run(main())
    finally:
        release.set()
    assert not engine.alive and engine.deaths == ["hung"]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the server


class InProcessServer:
    """The real app under uvicorn in a thread on loopback: its model host can be reached for injection."""

    def __init__(self, ckpt: Path, cache_dir: Path, engine_stall_s: float = 30.0) -> None:
        import uvicorn

        from kame.server.app.factory import create_app
        from kame.server.config import AppConfig

        cfg = AppConfig.model_validate({
            "cache_dir": str(cache_dir),
            "device": "cpu",
            "frontend": {"checkpoint": str(ckpt), "batch_size": 2},
            "asr": {"kind": "none"},
            "server": {"engine_command_timeout_s": 0.5, "warmup_steps": 1, "gc_interval_s": 0, "engine_stall_s": engine_stall_s},
        })
        self.app = create_app(cfg, device="cpu", environ={})
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def host(self) -> Any:
        return self.app.state.kame.host

    def start(self) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while self.get("/health")[1].get("status") != "ok":
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except (urllib.error.URLError, ConnectionError):
            return 0, {}

    def metric(self, name: str, labels: str) -> float:
        text = self.app.state.kame.metrics.render().decode()
        for line in text.splitlines():
            if line.startswith(f"{name}{{{labels}}}"):
                return float(line.split()[-1])
        return 0.0

    def ws(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"


@pytest.fixture
def server(tiny_kame_ckpt: Path, kame_cache_dir: Path) -> Iterator[InProcessServer]:
    srv = InProcessServer(tiny_kame_ckpt, kame_cache_dir).start()
    yield srv
    srv.stop()


async def wait_ready(server: InProcessServer, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (await asyncio.to_thread(server.get, "/ready"))[0] != 200:
        assert time.monotonic() < deadline, "the slot was not released"
        await asyncio.sleep(0.05)


def test_a_failing_or_slow_attach_ends_that_session_with_1011(server: InProcessServer, monkeypatch: pytest.MonkeyPatch) -> None:
    core = server.host.core

    async def main() -> None:
        monkeypatch.setattr(core, "attach", failing_once(core.attach, error=RuntimeError("device lost")))
        chat = await MoshiClient.connect(server.ws("/api/chat"))
        assert not await chat.wait_handshake(5)
        assert (await chat.wait_closed(5))[0] == 1011
        assert chat.errors == ["engine error, please reconnect"]  # the 0x05 message before the close
        await wait_ready(server)
        monkeypatch.setattr(core, "attach", failing_once(core.attach, sleep_s=1.5))  # beyond the 0.5 s bound
        rt = await RealtimeClient.connect(server.ws("/v1/realtime"))
        code, _ = await rt.wait_closed(5)
        assert code == 1011
        errors = rt.of_type("error")
        assert errors and errors[-1]["error"]["code"] == "engine_error"
        await wait_ready(server)
        await asyncio.sleep(1.2)  # the engine thread finishes the slow attach (commands run in order)
        again = await MoshiClient.connect(server.ws("/api/chat"))  # the server goes on serving
        assert await again.wait_handshake(5)
        await again.send_silence(0.4)
        await again.close()

    asyncio.run(main())
    assert server.metric("kame_sessions_ended_total", 'reason="engine_error"') == 2
    assert server.get("/health")[0] == 200


def test_a_failing_reset_ends_the_session_with_1011(server: InProcessServer, monkeypatch: pytest.MonkeyPatch) -> None:
    core = server.host.core

    async def main() -> None:
        rt = await RealtimeClient.connect(server.ws("/v1/realtime"))
        assert await rt.wait_for_type("session.created", 10)
        monkeypatch.setattr(core, "detach", failing_once(core.detach, error=RuntimeError("bad state")))
        await rt.send_event({"type": "kame.session.reset"})
        code, reason = await rt.wait_closed(5)
        assert (code, reason) == (1011, "engine error")
        assert rt.of_type("error")[-1]["error"]["code"] == "engine_error"
        await wait_ready(server)

    asyncio.run(main())
    assert server.metric("kame_sessions_ended_total", 'reason="engine_error"') == 1


def test_a_dead_engine_thread_fails_the_server_loudly(server: InProcessServer, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = server.host.engine

    async def main() -> None:
        chat = await MoshiClient.connect(server.ws("/api/chat"))
        rt = await RealtimeClient.connect(server.ws("/v1/realtime"))
        assert await chat.wait_handshake(5) and await rt.wait_for_type("session.created", 10)
        await chat.send_silence(0.3)
        monkeypatch.setattr(engine, "_take_frames", failing_once(engine._take_frames, error=RuntimeError("a bug")))
        await asyncio.gather(chat.send_silence(0.3), rt.send_silence(0.3))
        assert (await chat.wait_closed(5))[0] == 1011  # live sessions end
        assert (await rt.wait_closed(5))[0] == 1011
        refused = await MoshiClient.connect(server.ws("/api/chat"))  # new ones are refused
        assert not await refused.wait_handshake(5)
        assert await refused.wait_closed(5) == (1013, "server failed, retry later")

    asyncio.run(main())
    status, health = server.get("/health")
    assert status == 503 and health["status"] == "failed"
    assert "engine thread died: RuntimeError: a bug" in health["models"]["error"]
    assert server.get("/ready") == (503, {"ready": False, "reason": "failed"})
    assert server.metric("kame_sessions_ended_total", 'reason="engine_error"') == 2
    assert server.metric("kame_sessions_rejected_total", 'reason="failed"') == 1
    assert "kame_ready 0.0" in server.app.state.kame.metrics.render().decode()


def test_a_hung_engine_thread_fails_the_server_loudly(
    tiny_kame_ckpt: Path, kame_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model step that never returns (a wedged GPU): the thread does not die, yet the server must say it
    is failed (liveness restarts the process), refuse new sessions and end the live ones."""
    srv = InProcessServer(tiny_kame_ckpt, kame_cache_dir, engine_stall_s=1.5).start()
    release = threading.Event()
    core = srv.host.core
    original = core.tick

    def hang(frames: Any) -> Any:
        release.wait(60)
        return original(frames)

    async def main() -> None:
        chat = await MoshiClient.connect(srv.ws("/api/chat"))
        assert await chat.wait_handshake(5)
        await chat.send_silence(0.3)
        monkeypatch.setattr(core, "tick", hang)
        await chat.send_silence(0.3)
        deadline = time.monotonic() + 15
        while (await asyncio.to_thread(srv.get, "/health"))[0] != 503:  # the liveness probe
            assert time.monotonic() < deadline, "a hung engine thread still looks healthy"
            await asyncio.sleep(0.2)
        assert (await chat.wait_closed(5))[0] == 1011  # the live session ends
        refused = await MoshiClient.connect(srv.ws("/api/chat"))  # new ones are refused
        assert not await refused.wait_handshake(5)
        assert await refused.wait_closed(5) == (1013, "server failed, retry later")

    try:
        asyncio.run(main())
        status, health = srv.get("/health")
        assert status == 503 and health["status"] == "failed"
        assert "hung" in health["models"]["error"]
        assert srv.get("/ready") == (503, {"ready": False, "reason": "failed"})
        assert srv.metric("kame_sessions_ended_total", 'reason="engine_error"') == 1
    finally:
        release.set()
        srv.stop()
