"""The engine thread seen from asyncio: slots, batching, failures."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kame.frontend.config import FrontendConfig
from kame.frontend.engine import EngineCore, SlotOutput
from kame.frontend.engine_thread import AsyncSlot, EngineFull, EngineThread, TickStats
from kame.frontend.models import load_frontend


def make_engine(ckpt: Path, batch: int, ticks: list[TickStats] | None = None) -> EngineThread:
    cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=batch)
    core = EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
    eng = EngineThread(core, on_tick=ticks.append if ticks is not None else None)
    eng.start()
    return eng


async def _session(eng: EngineThread, n_frames: int, chunk: int) -> list[SlotOutput]:
    s = AsyncSlot(eng)
    await s.attach()
    pcm = (0.05 * np.random.default_rng(s.slot).standard_normal(1920 * n_frames)).astype(np.float32)
    outs: list[SlotOutput] = []

    async def reader() -> None:
        while len(outs) < n_frames:
            item = await asyncio.wait_for(s.outputs.get(), 10)
            assert not isinstance(item, Exception)
            outs.append(item)

    task = asyncio.create_task(reader())
    for i in range(0, pcm.size, chunk):  # odd-sized chunks, faster than real time
        s.feed(pcm[i : i + chunk])
        await asyncio.sleep(0.005)
    await task
    s.detach()
    return outs


def test_sessions_share_ticks_and_get_every_frame(tiny_kame_ckpt: Path) -> None:
    ticks: list[TickStats] = []
    eng = make_engine(tiny_kame_ckpt, 4, ticks)
    try:

        async def main() -> list[list[SlotOutput]]:
            return await asyncio.gather(*[_session(eng, 12, c) for c in (1920, 1000, 3000, 777)])

        results = asyncio.run(main())
    finally:
        eng.stop()
    for outs in results:
        assert [o.step for o in outs] == list(range(12))
        assert all(o.pcm.shape == (1920,) for o in outs)
    assert max(t.slots for t in ticks) >= 2  # batched, not one slot per tick
    assert eng.free_slots == 4


def test_full_engine_refuses_and_slots_are_reused(tiny_kame_ckpt: Path) -> None:
    eng = make_engine(tiny_kame_ckpt, 1)
    try:

        async def main() -> None:
            a = AsyncSlot(eng)
            await a.attach()
            with pytest.raises(EngineFull):
                await AsyncSlot(eng).attach()
            a.detach()
            for _ in range(50):
                if eng.free_slots:
                    break
                await asyncio.sleep(0.01)
            b = AsyncSlot(eng)
            assert await b.attach() == 0
            b.detach()

        asyncio.run(main())
    finally:
        eng.stop()


def test_reset_keeps_the_slot_and_starts_the_state_afresh(tiny_kame_ckpt: Path) -> None:
    eng = make_engine(tiny_kame_ckpt, 1)
    try:

        async def main() -> tuple[list[int], list[int], int]:
            a = AsyncSlot(eng)
            await a.attach()
            frame = np.zeros(1920, np.float32)
            before = []
            for _ in range(3):
                a.feed(frame)
                before.append((await asyncio.wait_for(a.outputs.get(), 10)).step)
            a.feed(np.zeros(5000, np.float32))  # buffered input of the old state: dropped by the reset
            stale = a.outputs
            resetting = asyncio.create_task(a.reset())
            await asyncio.sleep(0)
            with pytest.raises(EngineFull):  # the slot is never free while it resets
                await AsyncSlot(eng).attach()
            await resetting
            assert a.outputs is not stale and a.outputs.empty()
            after = []
            for _ in range(2):
                a.feed(frame)
                after.append((await asyncio.wait_for(a.outputs.get(), 10)).step)
            await asyncio.sleep(0.2)
            extra = a.outputs.qsize()  # the 5000 dropped samples would have made two more frames
            a.detach()
            return before, after, extra

        before, after, extra = asyncio.run(main())
    finally:
        eng.stop()
    assert before == [0, 1, 2]
    assert after == [0, 1]  # fresh streaming state: steps count from 0 again
    assert extra == 0


def test_reset_of_a_slot_the_engine_failed_raises_engine_full(tiny_kame_ckpt: Path) -> None:
    eng = make_engine(tiny_kame_ckpt, 1)
    try:

        async def main() -> None:
            a = AsyncSlot(eng)
            await a.attach()
            eng.detach(a.slot)  # what the engine does to a slot whose step failed
            with pytest.raises(EngineFull):
                await a.reset()
            assert a.slot is None

        asyncio.run(main())
    finally:
        eng.stop()


def test_step_failure_ends_the_slots_not_the_engine(tiny_kame_ckpt: Path) -> None:
    eng = make_engine(tiny_kame_ckpt, 2)
    core = eng.core
    original = core._model_step
    calls = {"n": 0}

    def flaky() -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated device error")
        return original()

    core._model_step = flaky  # type: ignore[method-assign]
    try:

        async def main() -> None:
            s = AsyncSlot(eng)
            await s.attach()
            got_error = False
            for _ in range(6):
                s.feed(np.zeros(1920, np.float32))
                item = await asyncio.wait_for(s.outputs.get(), 5)
                if isinstance(item, Exception):
                    got_error = True
                    assert "engine step failed" in str(item)
                    break
            assert got_error
            t = AsyncSlot(eng)  # the engine still serves new sessions
            await t.attach()
            t.feed(np.zeros(1920 * 2, np.float32))
            out = await asyncio.wait_for(t.outputs.get(), 5)
            assert isinstance(out, SlotOutput)
            t.detach()

        asyncio.run(main())
    finally:
        eng.stop()


def test_an_engine_that_falls_behind_drops_only_what_is_beyond_its_buffer(tiny_kame_ckpt: Path) -> None:
    """Input waiting beyond ``max_buffer_s`` (2 s, 25 frames) costs the oldest frames over it, not the whole
    remainder that a tick left as one piece: 30 frames waiting keep their last 25."""
    eng = make_engine(tiny_kame_ckpt, 1)
    gate = threading.Semaphore(0)
    tick = eng.core.tick

    def gated(frames: dict[int, np.ndarray]) -> dict[int, SlotOutput]:
        gate.acquire()
        return tick(frames)

    eng.core.tick = gated  # type: ignore[method-assign]
    try:

        async def main() -> tuple[int, list[int]]:
            s = AsyncSlot(eng)
            await s.attach()
            assert s.slot is not None
            frames = [np.full(1920, i / 100, np.float32) for i in range(40)]
            for f in frames[:10]:  # the first tick takes frame 0 and waits at the gate; nine wait behind it
                s.feed(f)
            await asyncio.sleep(0.2)
            gate.release()  # tick 0 ends; the next one takes frame 1 and leaves 2-9 as one piece
            await asyncio.wait_for(s.outputs.get(), 5)
            await asyncio.sleep(0.2)
            for f in frames[10:32]:  # 8 + 22 = 30 frames wait: 5 over the buffer
                s.feed(f)
            dropped = eng.dropped_samples(s.slot)
            for _ in range(40):
                gate.release()
            steps: list[int] = []
            with contextlib.suppress(asyncio.TimeoutError):  # fewer than 26: the assertion below says which
                while len(steps) < 26:
                    steps.append((await asyncio.wait_for(s.outputs.get(), 3)).step)
            s.detach()
            return dropped, steps

        dropped, steps = asyncio.run(main())
    finally:
        for _ in range(4):
            gate.release()
        eng.stop()
    assert dropped == 5 * 1920  # frames 2-6, not the 8 frames of the joined remainder
    assert steps == list(range(1, 27))  # frame 1, then the 25 newest: every one of them stepped


def test_feed_never_blocks_on_the_model(tiny_kame_ckpt: Path) -> None:
    eng = make_engine(tiny_kame_ckpt, 1)
    try:

        async def main() -> float:
            s = AsyncSlot(eng)
            await s.attach()
            t0 = time.perf_counter()
            for _ in range(500):  # 40 s of audio at once: buffered (bounded), not stepped inline
                s.feed(np.zeros(1920, np.float32))
            elapsed = time.perf_counter() - t0
            assert eng.dropped_samples(s.slot) > 0  # bounded: the oldest audio is dropped and counted
            s.detach()
            return elapsed

        assert asyncio.run(main()) < 0.5
    finally:
        eng.stop()
