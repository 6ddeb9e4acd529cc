"""Optional per-session recording (``server.record_dir``): audio both ways and the event log.

Off by default: transcripts and voices are personal data. When enabled, each
session gets ``<record_dir>/<start time>-<session id>/`` with ``user.wav``
and ``assistant.wav`` (24 kHz, 16-bit) and ``events.jsonl`` (transcripts,
assistant text, LLM/oracle events). Files are written by a thread of the
recorder; the event loop only enqueues (bounded; overflow is counted, not
waited for).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np

from kame.audio.pcm import float_to_pcm16_bytes

log = logging.getLogger(__name__)

_STOP = object()


class SessionRecorder:
    """Writes one session to disk from its own thread."""

    def __init__(
        self, root: Path, session_id: str, sample_rate: int, meta: dict[str, Any], max_queued: int = 4000
    ) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.directory = Path(root) / f"{stamp}-{session_id}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sample_rate = sample_rate
        self.t0 = time.monotonic()
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(max_queued)
        self._thread = threading.Thread(target=self._run, name=f"kame-rec-{session_id}", daemon=True)
        self._thread.start()
        self._put(("event", {"t": 0.0, "type": "session.start", **meta}))

    # ------------------------------------------------------------------ event loop side
    def _put(self, item: Any) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def user_audio(self, pcm: np.ndarray) -> None:
        self._put(("user", np.asarray(pcm, np.float32).copy()))

    def assistant_audio(self, pcm: np.ndarray) -> None:
        self._put(("assistant", np.asarray(pcm, np.float32).copy()))

    def event(self, type_: str, data: dict[str, Any]) -> None:
        self._put(("event", {"t": round(time.monotonic() - self.t0, 3), "type": type_, **data}))

    def close(self, info: dict[str, Any] | None = None) -> None:
        """Finish in the background (never blocks the caller)."""
        self.event("session.end", dict(info or {}, dropped_records=self.dropped))
        try:
            self._queue.put(_STOP, timeout=1.0)
        except queue.Full:
            log.warning("recording %s: queue full at close, files may be incomplete", self.directory)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # ------------------------------------------------------------------ writer thread
    def _open_wav(self, stack: contextlib.ExitStack, name: str) -> wave.Wave_write:
        w = stack.enter_context(wave.open(str(self.directory / name), "wb"))  # noqa: SIM115
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(self.sample_rate)
        return w

    def _run(self) -> None:
        try:
            with contextlib.ExitStack() as stack:
                user = self._open_wav(stack, "user.wav")
                assistant = self._open_wav(stack, "assistant.wav")
                events = stack.enter_context(open(self.directory / "events.jsonl", "w", encoding="utf-8"))
                while True:
                    item = self._queue.get()
                    if item is _STOP:
                        return
                    what, payload = item
                    if what == "event":
                        events.write(json.dumps(payload, ensure_ascii=False, default=str) + "\n")
                    else:
                        (user if what == "user" else assistant).writeframes(float_to_pcm16_bytes(payload))
        except Exception:  # a full disk must not take the session down
            log.exception("recording %s failed", self.directory)
