"""Slot for Kyutai STT (``kind: kyutai``), not written yet.

Planned shape (see KAME_NOTES.md section 5): one engine per process owns
the Mimi encoder and an STT ``LMGen`` with a batch of slots; a single engine
thread takes 80 ms from every open stream's :class:`~kame.asr.stream.Inbox`
each step, runs one batched step on the GPU and calls each stream's
:meth:`~kame.asr.stream.AsrStream.emit`. Its streams are plain
:class:`~kame.asr.stream.AsrStream` objects, so sessions see the same API.
"""

from __future__ import annotations

from kame.asr.config import AsrConfig
from kame.asr.recognizer import AsrUnavailableError


def create_kyutai_recognizer(cfg: AsrConfig) -> None:
    raise AsrUnavailableError(
        "asr.kind 'kyutai' (Kyutai STT) is not available yet; use 'whisper' or 'pocketsphinx' instead"
    )
