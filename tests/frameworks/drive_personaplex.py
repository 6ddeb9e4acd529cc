"""LiveKit's NVIDIA PersonaPlex realtime model (``livekit.plugins.nvidia.realtime.RealtimeModel``) against kame.

The plugin speaks Moshi's binary protocol to ``/api/chat?voice_prompt=NATF2.pt&text_prompt=...&seed=...``
(Opus both ways, 80 ms frames pushed as they come). The driver pushes audio at real time, asks a
question, changes the persona (``update_instructions``: the plugin reconnects with the new
``text_prompt``), asks again, and reports the reply audio, the plugin's errors and every warning its
logger wrote (an unknown message kind is one). Runs in LiveKit's virtualenv (tests/frameworks/venvs.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from drive_common import Microphone, Report, arguments, question
from livekit.agents import llm
from livekit.plugins.nvidia.experimental.realtime import RealtimeModel
from livekit_common import audio_sink, error_recorder

REPORT = Report()
PERSONA = "You are Captain Nemo, a terse submarine captain."
PERSONA_2 = "You are Ada, a cheerful librarian who loves puzzles."


class Warnings(logging.Handler):
    """The plugin's own warnings and errors (it logs an unknown message kind as a warning)."""

    def emit(self, record: logging.LogRecord) -> None:
        REPORT.errors.append(f"log {record.levelname}: {record.getMessage()}"[:500])


async def main() -> None:
    args = arguments()
    deadline = time.monotonic() + args.seconds
    logging.getLogger("livekit.plugins.nvidia").addHandler(Warnings(logging.WARNING))
    host = args.url.split("://", 1)[-1]
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(base_url=f"ws://{host}", voice="NATF2", text_prompt=PERSONA, seed=42, http_session=http)
        session = model.session()
        tasks: list[asyncio.Task[Any]] = []
        reconnected = asyncio.Event()

        async def read_generation(ev: llm.GenerationCreatedEvent) -> None:
            REPORT.event("generation_created")
            async for msg in ev.message_stream:
                async def audio(m: llm.MessageGeneration = msg) -> None:
                    async for frame in m.audio_stream:
                        REPORT.audio_chunk(len(bytes(frame.data)))

                async def text(m: llm.MessageGeneration = msg) -> None:
                    pieces = [t async for t in m.text_stream]
                    REPORT.assistant_transcripts.append("".join(pieces))

                tasks.extend([asyncio.create_task(audio()), asyncio.create_task(text())])

        session.on("error", error_recorder(REPORT))
        session.on("generation_created", lambda ev: tasks.append(asyncio.create_task(read_generation(ev))))
        session.on("session_reconnected", lambda _ev: (REPORT.event("session_reconnected"), reconnected.set()))

        mic = Microphone(audio_sink(session))
        sender = asyncio.create_task(mic.run())
        try:
            await asyncio.sleep(1.5)
            mic.say(question(args.audio, "hello"))
            await asyncio.sleep(8.0)
            await session.update_instructions(PERSONA_2)
            await asyncio.wait_for(reconnected.wait(), max(1.0, deadline - time.monotonic()))
            REPORT.notes["reconnected_at"] = time.monotonic()
            await asyncio.sleep(1.5)
            mic.say(question(args.audio, "hello"))
            await asyncio.sleep(8.0)
        except asyncio.TimeoutError:
            REPORT.notes["timeout"] = "a step did not happen in time"
        finally:
            sender.cancel()
            await session.aclose()
            for t in tasks:
                t.cancel()
            await model.aclose()
    REPORT.write(args.out)


if __name__ == "__main__":
    asyncio.run(main())
