"""A stream whose transcriber runs in a worker process.

For decoders that hold the GIL while decoding (pocketsphinx): in a thread
they would stall the event loop and every other session. The child is
started with ``spawn`` (the parent has threads and native libraries loaded,
so forking it is unsafe). Two pump threads in the parent move audio in and
events out; the only unbounded thing between them is the OS pipe, and the
session-side :class:`~kame.asr.stream.Inbox` bounds what can queue up.
A child that dies (crash, OOM killer, ``kill -9``) closes its end of the
pipe: the receiving pump sees EOF and ends the stream with an ``error``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Literal

import numpy as np

from kame.asr.events import Emission, EventType
from kame.asr.stream import AsrStream, EventCallback, drive
from kame.asr.transcriber import Transcriber

log = logging.getLogger(__name__)

#: Messages drained from the pipe per loop turn in the child (bounds one turn's work).
_MAX_BATCH = 256


def _child_main(conn: Connection, factory: Callable[[], Transcriber]) -> None:
    """Entry point of the worker process."""
    try:
        transcriber = factory()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        conn.send(("event", Emission(EventType.ERROR, f"worker start failed: {type(exc).__name__}: {exc}")))
        conn.send(("done",))
        return
    conn.send(("ready",))

    def take(wait: bool) -> tuple[list[np.ndarray], bool | None]:
        chunks: list[np.ndarray] = []
        if wait and not conn.poll(0.1):
            return chunks, None
        for _ in range(_MAX_BATCH):
            if not conn.poll(0):
                break
            msg = conn.recv()  # EOFError when the parent is gone: the process just ends
            if msg[0] == "audio":
                chunks.append(msg[1])
            else:
                return chunks, bool(msg[1])
        return chunks, None

    def emit(em: Emission) -> None:
        conn.send(("event", em))

    try:
        drive(transcriber, take, emit)
    except EOFError:
        return
    except Exception as exc:  # noqa: BLE001
        emit(Emission(EventType.ERROR, f"{type(exc).__name__}: {exc}"))
    finally:
        transcriber.close()
    conn.send(("done",))


class ProcessStream(AsrStream):
    """Runs ``factory()`` (a picklable callable building a Transcriber) in a child process."""

    def __init__(self, factory: Callable[[], Transcriber], name: str, *, max_queued_s: float, max_events: int,
                 on_event: EventCallback | None = None, start_method: Literal["spawn", "fork", "forkserver"] = "spawn") -> None:
        super().__init__(name, max_queued_s=max_queued_s, max_events=max_events, on_event=on_event)
        ctx = mp.get_context(start_method)
        self._conn, child_conn = ctx.Pipe(duplex=True)
        # typeshed's BaseContext has no Process; every context get_context returns does
        self._proc = ctx.Process(  # type: ignore[attr-defined]
            target=_child_main, args=(child_conn, factory), name=name, daemon=True
        )
        self._proc.start()
        child_conn.close()  # so the child's death reads as EOF here
        self.ready = threading.Event()
        self._sender = threading.Thread(target=self._send_loop, name=f"{name}-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive_loop, name=f"{name}-recv", daemon=True)
        self._sender.start()
        self._receiver.start()

    @property
    def worker_pid(self) -> int | None:
        return self._proc.pid

    def abort(self, reason: str = "aborted") -> None:
        """End the stream and kill the worker (a hung worker cannot hold a session)."""
        super().abort(reason)
        # Only signal here: the receiver thread alone reaps the child (two threads waiting on one
        # child race each other in multiprocessing).
        with contextlib.suppress(ValueError, OSError):
            self._proc.kill()

    def _send(self, msg: tuple[Any, ...]) -> bool:
        try:
            self._conn.send(msg)
            return True
        except (OSError, ValueError):  # child gone or pipe closed: the receiver reports it
            return False

    def _send_loop(self) -> None:
        while not self.done:
            chunks, end = self.inbox.take(wait=True)
            if chunks and not self._send(("audio", np.concatenate(chunks))):
                return
            if end is not None:
                self._send(("end", end))
                return

    def _receive_loop(self) -> None:
        clean = False
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] == "event":
                    self.emit(msg[1])
                elif msg[0] == "ready":
                    self.ready.set()
                elif msg[0] == "done":
                    clean = True
                    return
        except (EOFError, OSError):
            pass
        except Exception as exc:  # noqa: BLE001 - a garbled message ends the stream, loudly
            log.exception("%s: bad message from worker", self.name)
            self.fail(f"{self.name}: {type(exc).__name__}: {exc}")
        finally:
            self._proc.join(timeout=2.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout=2.0)
            if not clean and self.error is None:
                self.fail(f"{self.name}: worker process died (exit code {self._proc.exitcode})")
            self.mark_done()
            self._conn.close()
