"""A session's handle on a recogniser: non-blocking ``feed``, events out.

The session side (usually the asyncio loop) only ever touches the bounded
:class:`Inbox` and the :class:`~kame.asr.channel.EventChannel`; whatever
drives recognition (a worker thread, a worker process behind pump threads,
or later a batched GPU engine serving many streams) takes audio from the
inbox and hands :class:`~kame.asr.events.Emission` objects to :meth:`AsrStream.emit`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kame.asr.channel import EventChannel
from kame.asr.events import AsrEvent, Emission, EventType
from kame.asr.resample import INPUT_RATE, as_mono_float32
from kame.asr.transcriber import Transcriber

log = logging.getLogger(__name__)

#: Called with each event on the thread that produced it (keep it short; thread-safe).
EventCallback = Callable[[AsrEvent], None]
#: The marker :meth:`Inbox.cut` queues between audio chunks: the turn in progress ends there.
CUT = np.zeros(0, np.float32)


class EngineTap(Protocol):
    """What a stream may use of its session's engine slot (:class:`~kame.frontend.engine_thread.AsyncSlot`)."""

    def stt_attach(self, sink: Callable[[Any], None]) -> None: ...

    async def stt_flush(self, frames: int, timeout: float) -> None: ...


class Inbox:
    """Bounded audio queue between the session and the recogniser.

    Bounded in samples, not chunks, since chunks may have any size. ``put``
    never blocks: audio beyond the bound is dropped and counted.
    """

    def __init__(self, max_samples: int) -> None:
        self._max = max(1, max_samples)
        self._cond = threading.Condition()
        self._chunks: deque[np.ndarray] = deque()
        self._queued = 0
        self._end: bool | None = None  # None: open; True: end, flush; False: abort
        self.dropped_chunks = 0
        self.dropped_samples = 0

    def put(self, x: np.ndarray) -> bool:
        with self._cond:
            if self._end is not None:
                return False
            if self._queued + len(x) > self._max:
                self.dropped_chunks += 1
                self.dropped_samples += len(x)
                return False
            self._chunks.append(x)
            self._queued += len(x)
            self._cond.notify()
            return True

    def cut(self) -> None:
        """End the turn in progress after the audio queued so far (:data:`CUT`)."""
        with self._cond:
            if self._end is None:
                self._chunks.append(CUT)
                self._cond.notify()

    def end(self, flush: bool) -> None:
        with self._cond:
            if self._end is None:
                self._end = flush
            self._cond.notify()

    def take(self, wait: bool, timeout: float = 0.1) -> tuple[list[np.ndarray], bool | None]:
        """Everything queued so far, and the end marker (None while open).

        With ``wait``, sleeps up to ``timeout`` for audio or the end first.
        """
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: self._chunks or self._end is not None, timeout)
            chunks = list(self._chunks)
            self._chunks.clear()
            self._queued = 0
            return chunks, self._end


@dataclass(frozen=True)
class StreamStats:
    """Snapshot of a stream's counters."""

    fed_s: float
    dropped_chunks: int
    dropped_s: float
    dropped_events: int


class AsrStream:
    """One session's recogniser stream. Thread-safe; nothing here blocks except ``join``.

    Feed 24 kHz mono float32 (or int16) frames of any size with :meth:`feed`;
    read events with ``async for ev in stream.events()`` (or plain iteration
    from a thread, or an ``on_event`` callback). :meth:`close`
    ends the input: the open turn is flushed (its ``speech_stopped`` and
    ``final`` still come), then the event iterator ends. A recogniser that
    fails emits one ``error`` event and ends the same way; the session can
    carry on without it.
    """

    def __init__(self, name: str, *, max_queued_s: float, max_events: int, on_event: EventCallback | None) -> None:
        self.name = name
        self.inbox = Inbox(int(max_queued_s * INPUT_RATE))
        self._events = EventChannel(max_events)
        self._on_event = on_event
        self._fed = 0
        self._done = threading.Event()
        self._error: str | None = None

    # ------------------------------------------------------------------ session side

    def bind_engine(self, slot: EngineTap) -> None:
        """Called by the pipeline with its engine slot once the stream is open. Recognisers that listen to
        audio ignore it; one that runs inside the front-end's engine (the shared Kyutai STT) subscribes
        to its steps there."""

    async def release_engine(self, flush: bool = True) -> None:
        """Called by the pipeline at the end of a session, before it releases the engine slot: whatever the
        stream still needs the slot for (the shared Kyutai STT steps its delay in silence to flush its last
        words). Recognisers that listen to audio need nothing: their flush runs after the slot is free."""

    def feed(self, pcm: np.ndarray) -> bool:
        """Queue audio; False if it was dropped (queue full, stream closed or failed).

        The samples are copied: the caller may reuse its buffer.
        """
        x = np.array(as_mono_float32(pcm), dtype=np.float32, copy=True)
        if self._done.is_set():
            return False
        self._fed += len(x)
        return self.inbox.put(x)

    #: The recogniser answers :meth:`cut` with a ``CUT`` event after the finals before it (those that find
    #: turns by themselves do not: the pipeline then takes the last partial at once).
    cuts = False

    def cut(self) -> None:
        """The client ended the user's turn: the turn in progress ends after the audio fed so far (recognisers
        that find turns by themselves ignore it)."""
        self.inbox.cut()

    def close(self, flush: bool = True) -> None:
        """End of input. ``flush=False`` abandons the open turn instead. Returns at once."""
        self.inbox.end(flush)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the recogniser is done with this stream; False on timeout."""
        return self._done.wait(timeout)

    async def aclose(self, flush: bool = True, timeout: float | None = 30.0) -> bool:
        """:meth:`close`, then wait without blocking the event loop.

        A recogniser still busy after ``timeout`` is aborted (an ``error``
        event ends the stream) and False is returned: closing never hangs.
        """
        self.close(flush)
        if self._done.is_set():
            return True
        if await asyncio.to_thread(self._done.wait, timeout):
            return True
        self.abort(f"did not finish within {timeout} s of close")
        return False

    def abort(self, reason: str = "aborted") -> None:
        """End the stream now with an ``error`` event; whatever the recogniser still says is dropped."""
        self.fail(f"{self.name}: {reason}")

    def events(self) -> AsyncIterator[AsrEvent]:
        """Async iterator over events; ends after the last one (final or error)."""
        return self._events.__aiter__()

    def __iter__(self) -> Iterator[AsrEvent]:
        return iter(self._events)

    @property
    def audio_s(self) -> float:
        """Seconds of audio fed so far (the clock events are stamped with)."""
        return self._fed / INPUT_RATE

    @property
    def done(self) -> bool:
        """The recogniser has stopped (closed or failed); events may still be unread."""
        return self._done.is_set()

    @property
    def finished(self) -> bool:
        """Stopped and every event has been read."""
        return self._done.is_set() and self._events.ended

    @property
    def error(self) -> str | None:
        """The error message if the recogniser failed."""
        return self._error

    def stats(self) -> StreamStats:
        return StreamStats(
            fed_s=self.audio_s,
            dropped_chunks=self.inbox.dropped_chunks,
            dropped_s=self.inbox.dropped_samples / INPUT_RATE,
            dropped_events=self._events.dropped,
        )

    # ------------------------------------------------------------------ driver side

    def emit(self, em: Emission) -> None:
        """Stamp an emission with the audio fed so far and the wall clock, and deliver it."""
        if self._done.is_set():
            return  # aborted: late events have nowhere to go
        if em.type is EventType.ERROR:
            self._error = em.text
        ev = AsrEvent.stamp(em, self.audio_s, time.time())
        self._events.put(ev)
        if self._on_event is not None:
            try:
                self._on_event(ev)
            except Exception:  # a consumer's bug must not kill recognition
                log.exception("%s: on_event callback failed", self.name)

    def fail(self, message: str) -> None:
        """Report a failure (once) and stop."""
        if not self._done.is_set() and self._error is None:
            self.emit(Emission(EventType.ERROR, message))
        self.mark_done()

    def mark_done(self) -> None:
        self.inbox.end(False)
        self._events.end()
        self._done.set()


def drive(
    transcriber: Transcriber,
    take: Callable[[bool], tuple[list[np.ndarray], bool | None]],
    emit: Callable[[Emission], None],
) -> None:
    """The recognition loop shared by worker threads and worker processes.

    Take all audio that has arrived, push it, then do one expensive step;
    repeat. Because every pending chunk is pushed before each decode, a
    decoder slower than the partial interval decodes the newest audio
    rather than building a backlog.
    """
    while True:
        chunks, end = take(not transcriber.pending())
        if end is False:
            return
        for chunk in chunks:
            for em in transcriber.cut() if chunk is CUT else transcriber.push(chunk):
                emit(em)
        if end:
            for em in transcriber.finish():
                emit(em)
            return
        if transcriber.pending():
            for em in transcriber.work():
                emit(em)


class ThreadedStream(AsrStream):
    """A stream whose transcriber runs on its own daemon thread.

    For decoders that release the GIL while they compute (CTranslate2), so
    the event loop keeps running while they decode.
    """

    def __init__(self, transcriber: Transcriber, name: str, *, max_queued_s: float, max_events: int,
                 on_event: EventCallback | None = None) -> None:
        super().__init__(name, max_queued_s=max_queued_s, max_events=max_events, on_event=on_event)
        self.transcriber = transcriber
        self.cuts = type(transcriber).cut is not Transcriber.cut
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            drive(self.transcriber, self.inbox.take, self.emit)
        except Exception as exc:
            log.exception("%s: recogniser failed", self.name)
            self.fail(f"{self.name}: {type(exc).__name__}: {exc}")
        finally:
            try:
                self.transcriber.close()
            finally:
                self.mark_done()
