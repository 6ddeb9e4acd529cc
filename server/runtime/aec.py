"""EXPERIMENTAL: a per-session acoustic echo canceller on the server (``asr.echo_canceller``).

For clients that send raw microphone audio from speakers (no echo cancellation of their own): the
assistant's voice comes back in the user's audio, Moshi hears itself and the ASR transcribes it.
:class:`SessionEchoCanceller` runs :class:`kame.echo.EchoCanceller` (the same canceller as
``kame mic``: the linear pre-canceller and WebRTC AEC3) on the session's input, before the pipeline
feeds Moshi and the ASR, with the PCM of the output frames the runtime actually handed to the
send queue as its reference (a frame dropped for a lagging client was never played, so it is no
reference either). AEC3's delay estimator follows the unknown, varying network plus playback delay.

Why a worker thread: the canceller costs 0.08-0.15 x real time on the CPU demo's cores (6-12 ms per
80 ms frame); on the event loop that is up to ~100 ms of every 80 ms with 8 sessions, which would
delay every session's sends. Each session has one worker thread, so its reference and microphone
blocks keep their order (the canceller is not thread-safe and pairs them in order); the cleaned
frame comes back to the loop with ``call_soon_threadsafe``. The livekit module runs outside the GIL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kame.echo import EchoCanceller


class SessionEchoCanceller:
    """One session's canceller and its worker thread: ``far`` for what was sent, ``near`` for what came in."""

    def __init__(self, sample_rate: int, observe_s: Callable[[float], None] | None = None) -> None:
        self._canceller = EchoCanceller(sample_rate)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kame-aec")
        self._observe = observe_s
        self.frames = 0
        self.cpu_s = 0.0  #: the canceller's thread CPU time (far and near), for the per-frame cost

    def _timed(self, work: Callable[[], np.ndarray | None]) -> np.ndarray | None:
        t0 = time.thread_time()
        out = work()
        took = time.thread_time() - t0
        self.cpu_s += took
        if self._observe is not None:
            self._observe(took)
        return out

    def far(self, pcm: np.ndarray) -> None:
        """An output frame just queued for the client: the reference its echo will be made of."""
        block = np.array(pcm, np.float32, copy=True).reshape(-1)
        self._pool.submit(self._timed, lambda: self._canceller.far(block))

    def near(self, pcm: np.ndarray, done: Callable[[np.ndarray], None]) -> None:
        """A frame of the client's audio; ``done`` gets it with the echo removed, on the event loop, in order."""
        loop = asyncio.get_running_loop()
        block = np.asarray(pcm, np.float32).reshape(-1)

        def work() -> None:
            out = self._timed(lambda: self._canceller.near(block))
            self.frames += 1
            if out is not None and not loop.is_closed():
                loop.call_soon_threadsafe(done, out)

        self._pool.submit(work)

    def close(self) -> None:
        """Stop the worker; frames still waiting are dropped (the session is over)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
