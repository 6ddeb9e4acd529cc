"""One thread for every call's Opus coding: the event loop never runs a codec, and wakes no thread per packet.

Opus is coded off the event loop, which serves every session's sockets and
clocks, and without a thread wake-up per packet, since GIL hand-offs, not
Opus itself, are what cost (:mod:`~kame.server.webrtc.opus`).

So one :class:`CodecWorker` per process codes for all calls, in batches: a
job queued on an idle worker wakes it; it waits ``batch_s`` (5 ms) for more,
then runs everything queued, in order. The loop appends to a deque and sets
an event at most once per batch, the worker holds the GIL only around each
ctypes call (libopus itself runs without it), and the results go back in one
``call_soon_threadsafe`` per batch and event loop. At 8 calls that is at most
200 wake-ups a second each way, whatever the packet rate.

Ownership: a call's decoder and encoder are used only by the worker thread
(one thread: a stream's packets stay in order); what a decode yields is
appended to the call's own deque, which the call's clock drains on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kame.server.webrtc")

#: How long an idle worker, once woken, waits for more jobs before it runs the batch.
BATCH_S = 0.005


class CodecWorker:
    """A daemon thread that runs queued codec jobs in batches (see the module docstring)."""

    def __init__(self, batch_s: float = BATCH_S) -> None:
        self.batch_s = batch_s
        self._jobs: deque[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any] | None]] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batches = 0  #: batches run (a measure of wake-ups)
        self.jobs_run = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the worker; its result is dropped (it hands results over itself)."""
        self._jobs.append((fn, args, None))
        self._kick()

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the worker; the returned future (of the running loop) gets its result."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.append((fn, args, future))
        self._kick()
        return future

    def _kick(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="kame-opus", daemon=True)
                    self._thread.start()
        if not self._wake.is_set():
            self._wake.set()

    def _serve(self) -> None:
        while True:
            self._wake.wait()
            if self.batch_s > 0:
                time.sleep(self.batch_s)
            self._wake.clear()  # a job queued from here on sets it again: nothing waits past this batch
            self._batch()

    def _batch(self) -> None:
        done: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        jobs = self._jobs
        while jobs:
            fn, args, future = jobs.popleft()
            try:
                result, error = fn(*args), None
            except Exception as exc:  # a job's failure is its caller's (the future), never the worker's
                result, error = None, exc
                if future is None:
                    log.warning("codec job %s failed: %s", getattr(fn, "__name__", fn), exc)
            self.jobs_run += 1
            if future is not None:
                done.setdefault(future.get_loop(), []).append((future, result, error))
        self.batches += 1
        for loop, settled in done.items():
            try:
                loop.call_soon_threadsafe(_settle, settled)
            except RuntimeError:  # that loop is closed: nobody waits for these any more
                pass


def _settle(settled: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in settled:
        if future.done():  # cancelled meanwhile (the call ended)
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


_worker: CodecWorker | None = None
_worker_lock = threading.Lock()


def codec_worker() -> CodecWorker:
    """The process's worker (created on first use)."""
    global _worker
    if _worker is None:
        with _worker_lock:
            if _worker is None:
                _worker = CodecWorker()
    return _worker
