"""EXPERIMENTAL: :class:`kame.echo.EchoCanceller` in a worker process, for the server (``asr.echo_canceller``).

Why a process: in the server the canceller shares the interpreter with the event loop and the engine
thread. Measured with 8 sessions of ``bench/server_load.py`` on the CPU demo (2 cores), one worker
*thread* per session: the linear pre-canceller's many small numpy calls hold the GIL, the engine's
step went from 27 ms to 663 ms mean and the sessions' real-time factor fell to 0.10. A child process
has its own GIL. It is started with ``spawn`` (the server has threads and native libraries loaded;
forking it is unsafe) and imports only numpy, livekit and :mod:`kame.echo` (~0.2 s).

The parent never waits on the pipe from the event loop: :meth:`EchoWorker.far` and
:meth:`EchoWorker.near` put messages on a queue that a sender thread writes to the pipe, and a reader
thread hands each cleaned frame back (``done``, on the caller's event loop, in order). Reference and
microphone frames go through one pipe in the order they were given, which is the order the canceller
pairs them in. A child that dies closes its end: the reader sees EOF and calls ``on_exit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np


def _child_main(conn: Connection, sample_rate: int) -> None:
    """The worker: ("far", bytes) and ("near", bytes) in, ("near", bytes, cpu_s) and ("far", cpu_s) out."""
    from kame.echo import EchoCanceller

    canceller = EchoCanceller(sample_rate)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        kind, data = msg
        t0 = time.thread_time()
        if kind == "far":
            canceller.far(np.frombuffer(data, np.float32))
            conn.send(("far", b"", time.thread_time() - t0))
        else:
            out = canceller.near(np.frombuffer(data, np.float32))
            conn.send(("near", out.astype(np.float32).tobytes(), time.thread_time() - t0))


class EchoWorker:
    """One session's canceller in its own process; ``done`` gets each cleaned frame on ``loop``."""

    def __init__(self, sample_rate: int, loop: asyncio.AbstractEventLoop, done: Callable[[np.ndarray], None], *,
                 observe_s: Callable[[float], None] | None = None, on_exit: Callable[[], None] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc: Any = ctx.Process(target=_child_main, args=(child, sample_rate), daemon=True, name="kame-aec")
        self._proc.start()
        child.close()
        self._loop = loop
        self._done = done
        self._observe = observe_s
        self._on_exit = on_exit
        self._out: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
        self.frames = 0
        self.cpu_s = 0.0  #: the child's CPU time in the canceller (far and near)
        self.closed = False
        self._sender = threading.Thread(target=self._send, name="kame-aec-send", daemon=True)
        self._reader = threading.Thread(target=self._read, name="kame-aec-read", daemon=True)
        self._sender.start()
        self._reader.start()

    def far(self, pcm: np.ndarray) -> None:
        """An output frame queued for the client: the reference its echo will be made of."""
        if not self.closed:
            self._out.put(("far", np.asarray(pcm, np.float32).reshape(-1).tobytes()))

    def near(self, pcm: np.ndarray) -> None:
        """A frame of the client's audio; it comes back, the echo removed, through ``done``."""
        if not self.closed:
            self._out.put(("near", np.asarray(pcm, np.float32).reshape(-1).tobytes()))

    def _send(self) -> None:
        while True:
            msg = self._out.get()
            try:
                self._conn.send(msg)
            except (OSError, ValueError):
                return
            if msg is None:
                return

    def _read(self) -> None:
        while True:
            try:
                kind, data, cpu = self._conn.recv()
            except (EOFError, OSError, ValueError):
                break
            self.cpu_s += cpu
            if self._observe is not None:
                self._observe(cpu)
            if kind == "near":
                self.frames += 1
                pcm = np.frombuffer(data, np.float32).copy()
                with contextlib.suppress(RuntimeError):  # the loop closed: the session is gone
                    self._loop.call_soon_threadsafe(self._done, pcm)
        if not self.closed and self._on_exit is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._on_exit)

    def close(self) -> None:
        """Stop the worker without waiting for it (frames still waiting are dropped: the session is over);
        a thread reaps the child, killing it if it has not left within a second."""
        if self.closed:
            return
        self.closed = True
        self._out.put(None)
        threading.Thread(target=self._reap, name="kame-aec-reap", daemon=True).start()

    def _reap(self) -> None:
        self._proc.join(timeout=1.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=1.0)
        self._conn.close()
