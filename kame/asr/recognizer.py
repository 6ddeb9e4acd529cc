"""The recogniser a server loads once and shares between sessions."""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from typing import ClassVar

from kame.asr.config import AsrConfig
from kame.asr.stream import AsrStream, EventCallback
from kame.asr.transcriber import Transcriber
from kame.errors import UserError


class AsrUnavailableError(UserError):
    """The configured recogniser cannot run here (not written yet, package or model missing)."""


class Recognizer(ABC):
    """A loaded model (or model spec) that opens one :class:`AsrStream` per session.

    Two ways in:

    * :meth:`open_stream` for live sessions: feeding never blocks, recognition
      runs elsewhere (a worker thread per stream for Whisper, a worker process
      per stream for pocketsphinx; a batched GPU recogniser such as Kyutai STT
      would instead keep one engine thread that takes audio from every open
      stream's inbox, steps them as one batch and emits into each stream).
    * :meth:`new_transcriber` for offline use (CLI, benches): a synchronous
      state machine run in the caller's thread, see :mod:`kame.asr.offline`.
    """

    kind: ClassVar[str]

    def __init__(self, cfg: AsrConfig) -> None:
        self.cfg = cfg
        self._ids = itertools.count()

    @abstractmethod
    def new_transcriber(self) -> Transcriber:
        """A fresh per-session state machine, to be driven by one thread."""

    @abstractmethod
    def open_stream(self, *, on_event: EventCallback | None = None) -> AsrStream:
        """Start recognising a new session."""

    def _stream_name(self) -> str:
        return f"asr-{self.kind}-{next(self._ids)}"

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to free by default
        """Free the model; open streams must be closed first."""

    def __enter__(self) -> Recognizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
