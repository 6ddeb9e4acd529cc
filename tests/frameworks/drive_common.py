"""What every framework driver shares (runs inside the framework's own virtualenv: standard library only).

A driver is started by its test with ``--url``, ``--token``, ``--audio DIR`` (the questions as 24 kHz
mono PCM16 ``.raw`` files, synthesized by the test) and ``--out FILE``; it connects the framework to
kame as a new user would, plays the audio at real time (silence in between, as a microphone does),
and writes a JSON report: the framework's errors, every server event type it saw, the reply audio
chunks with their arrival times, the transcripts, the functions it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

RATE = 24000
CHUNK_S = 0.04
CHUNK_BYTES = int(RATE * CHUNK_S) * 2


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    server_events: dict[str, int] = field(default_factory=dict)
    audio: list[tuple[float, float]] = field(default_factory=list)  #: (arrival, seconds of audio) per chunk
    user_transcripts: list[str] = field(default_factory=list)
    assistant_transcripts: list[str] = field(default_factory=list)
    tool_runs: list[dict[str, str]] = field(default_factory=list)
    notes: dict[str, object] = field(default_factory=dict)

    def event(self, etype: str) -> None:
        self.server_events[etype] = self.server_events.get(etype, 0) + 1

    def audio_chunk(self, nbytes: int) -> None:
        self.audio.append((time.monotonic(), nbytes / 2 / RATE))

    def write(self, path: str) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="http://HOST:PORT of kame")
    p.add_argument("--token", default="none")
    p.add_argument("--audio", required=True, help="directory of .raw PCM16 24 kHz questions")
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=40.0, help="longest the run may take")
    return p.parse_args()


def question(audio_dir: str, name: str) -> bytes:
    return (Path(audio_dir) / f"{name}.raw").read_bytes()


class Microphone:
    """Sends audio at real time in 40 ms chunks: what is queued, silence otherwise (never stops)."""

    def __init__(self, send: Callable[[bytes], Awaitable[None]]) -> None:
        self.send = send
        self.queue: list[bytes] = []
        self.done_speaking = asyncio.Event()
        self.spoke_at: list[tuple[float, float]] = []

    def say(self, pcm: bytes) -> None:
        self.queue += [pcm[i:i + CHUNK_BYTES] for i in range(0, len(pcm), CHUNK_BYTES)]
        self.done_speaking.clear()

    async def run(self) -> None:
        start = time.monotonic()
        n = 0
        silence = bytes(CHUNK_BYTES)
        while True:
            chunk = self.queue.pop(0) if self.queue else silence
            if not self.queue:
                self.done_speaking.set()
            await self.send(chunk)
            n += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_S - time.monotonic()))
