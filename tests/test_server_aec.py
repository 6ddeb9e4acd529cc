"""The server's experimental per-session echo canceller (server/runtime/aec.py): it removes the echo of
what was sent, in a worker process, and hands every frame back."""

from __future__ import annotations

import asyncio

import numpy as np

from kame.echo import EchoPath
from kame.server.runtime.aec import SessionEchoCanceller

FRAME = 1920


def test_the_echo_of_the_sent_audio_is_removed_in_the_worker_process_and_every_frame_comes_back() -> None:
    rng = np.random.default_rng(3)
    far = (0.1 * rng.standard_normal(FRAME * 60)).astype(np.float32)  # 4.8 s of what the client is sent
    ir = np.zeros(2400 + 64, np.float32)  # 100 ms away, a short room
    ir[2400], ir[2430], ir[2460] = 0.4, 0.15, -0.05
    path = EchoPath(ir, FRAME)
    observed: list[float] = []
    out: list[tuple[int, np.ndarray]] = []

    async def main() -> None:
        aec = SessionEchoCanceller(24000, observed.append)
        got = asyncio.Event()

        def done(pcm: np.ndarray) -> None:
            out.append((len(out), pcm))
            if len(out) == far.size // FRAME:
                got.set()

        aec.start(done)
        for i in range(0, far.size, FRAME):
            aec.far(far[i : i + FRAME])
            aec.near(path.play(far[i : i + FRAME]))
        await asyncio.wait_for(got.wait(), 10)
        aec.close()

    asyncio.run(main())
    sent = np.concatenate([p for _, p in out])
    mic_all = np.convolve(far, ir)[: far.size]
    tail = slice(2 * 24000, far.size)  # after 2 s
    erle = 10 * np.log10(np.mean(mic_all[tail] ** 2) / (np.mean(sent[tail] ** 2) + 1e-20))
    assert erle > 20, erle
    assert len(observed) == 2 * (far.size // FRAME)  # one cost sample per far and per near call
