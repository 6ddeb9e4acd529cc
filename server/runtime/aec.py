"""EXPERIMENTAL: a per-session acoustic echo canceller on the server (``asr.echo_canceller``).

For clients that send raw microphone audio from speakers (no echo cancellation of their own): the
assistant's voice comes back in the user's audio, Moshi hears itself and the ASR transcribes it.
:class:`SessionEchoCanceller` runs :class:`kame.echo.EchoCanceller` (the same canceller as
``kame mic``: the linear pre-canceller and WebRTC AEC3) on the session's input, before the pipeline
feeds Moshi and the ASR, with the PCM of the output frames the runtime actually handed to the
send queue as its reference (a frame dropped for a lagging client was never played, so it is no
reference either). AEC3's delay estimator follows the unknown, varying network plus playback delay.

It costs 5.8 ms of CPU per 80 ms frame (reference and microphone) on the CPU demo's cores, and it
runs in a worker process per session (:mod:`kame.echo_worker` says why not a thread, nor the loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from kame.echo_worker import EchoWorker


class SessionEchoCanceller:
    """One session's canceller: ``far`` for what was sent, ``near`` for what came in (back through ``done``)."""

    def __init__(self, sample_rate: int, observe_s: Callable[[float], None] | None = None) -> None:
        self.sample_rate = sample_rate
        self._observe = observe_s
        self._worker: EchoWorker | None = None
        self._done: Callable[[np.ndarray], None] | None = None

    def start(self, done: Callable[[np.ndarray], None], on_exit: Callable[[], None] | None = None) -> None:
        """Start the worker (from the session's event loop); cleaned frames go to ``done`` in order."""
        self._worker = EchoWorker(self.sample_rate, asyncio.get_running_loop(), done, observe_s=self._observe,
                                  on_exit=on_exit)

    @property
    def frames(self) -> int:
        return self._worker.frames if self._worker is not None else 0

    def far(self, pcm: np.ndarray) -> None:
        """An output frame just queued for the client."""
        if self._worker is not None:
            self._worker.far(pcm)

    def near(self, pcm: np.ndarray) -> None:
        """A frame of the client's audio."""
        if self._worker is not None:
            self._worker.near(pcm)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
