"""Streaming speech recognition of the user's turn (partials while they speak, a final at the end).

Usage from a session (asyncio)::

    recognizer = create_recognizer(cfg.asr)      # once per process; None for kind: none
    stream = recognizer.open_stream()            # once per session
    stream.feed(pcm_24k_float32)                 # from the loop, never blocks
    async for event in stream.events():          # partial / final / speech_started / ...
        ...
    await stream.aclose()                        # flushes: a turn cut mid-word still gets its final

Offline (CLI, benches): ``transcribe_offline(recognizer.new_transcriber(), pcm)``.
See docs/asr.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Lazy: kame.config imports kame.asr.config, and every CLI command imports
# kame.config, so this package must not pull numpy, soxr or webrtcvad on import.
_EXPORTS = {
    "AsrConfig": "kame.asr.config",
    "TurnConfig": "kame.asr.config",
    "WhisperConfig": "kame.asr.config",
    "AsrEvent": "kame.asr.events",
    "Emission": "kame.asr.events",
    "EventType": "kame.asr.events",
    "create_recognizer": "kame.asr.factory",
    "transcribe_offline": "kame.asr.offline",
    "AsrUnavailableError": "kame.asr.recognizer",
    "Recognizer": "kame.asr.recognizer",
    "AsrStream": "kame.asr.stream",
    "StreamStats": "kame.asr.stream",
}
__all__ = [
    "AsrConfig", "AsrEvent", "AsrStream", "AsrUnavailableError", "Emission", "EventType", "Recognizer",
    "StreamStats", "TurnConfig", "WhisperConfig", "create_recognizer", "transcribe_offline",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from kame.asr.config import AsrConfig, TurnConfig, WhisperConfig
    from kame.asr.events import AsrEvent, Emission, EventType
    from kame.asr.factory import create_recognizer
    from kame.asr.offline import transcribe_offline
    from kame.asr.recognizer import AsrUnavailableError, Recognizer
    from kame.asr.stream import AsrStream, StreamStats


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kame.asr' has no attribute {name!r}")
