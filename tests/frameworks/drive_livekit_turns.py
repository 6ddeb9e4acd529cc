"""LiveKit Agents 1.8 ``RealtimeModel`` with its default session (``semantic_vad``, ``interrupt_response`` and
``create_response`` on: the server detects the turns), a reply after every user turn.

A greeting (``generate_reply``), the user speaking over it (the server cancels it), then two more user
turns, the second one calling a function that is answered as LiveKit's ``AgentSession`` answers it
(``update_chat_ctx`` with the output, ``interrupt()``, then ``generate_reply()``). The report has the
reply audio chunks and, in ``notes.turn_ends``, when each user turn's audio ended. Runs in LiveKit's own
virtualenv (tests/frameworks/venvs.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from drive_common import Microphone, Report, arguments, question
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel
from livekit_common import audio_sink, error_recorder, record_server_event, weather_tool

REPORT = Report()
#: How long the driver listens after each user turn.
LISTEN_S = 7.0

get_weather = weather_tool(REPORT)


async def main() -> None:
    args = arguments()
    deadline = time.monotonic() + args.seconds
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(model="kame", base_url=f"{args.url}/v1", api_key=args.token, http_session=http)
        session = model.session()
        await session.update_instructions("You are a friendly assistant.")
        await session.update_tools([get_weather])
        greeted = asyncio.Event()
        answered_tool = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        turn_ends: list[float] = []
        statuses: list[str] = []  #: every response.done's status

        def on_server_event(event: dict[str, Any]) -> None:
            if record_server_event(REPORT, event) == "response.done":
                statuses.append(str(event["response"].get("status")))

        async def read_generation(ev: llm.GenerationCreatedEvent) -> None:
            async def messages() -> None:
                async for msg in ev.message_stream:
                    async def audio(m: llm.MessageGeneration = msg) -> None:
                        async for frame in m.audio_stream:
                            REPORT.audio_chunk(len(bytes(frame.data)))
                            if sum(s for _, s in REPORT.audio) >= 1.0:
                                greeted.set()
                    tasks.append(asyncio.create_task(audio()))

            async def functions() -> None:
                async for call in ev.function_stream:  # as AgentSession: the output, interrupt(), generate_reply()
                    output = await get_weather(**json.loads(call.arguments))
                    ctx = session.chat_ctx.copy()
                    ctx.items.append(llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output=output,
                                                            is_error=False))
                    await session.update_chat_ctx(ctx)
                    session.interrupt()
                    session.generate_reply()
                    answered_tool.set()

            await asyncio.gather(messages(), functions())

        session.on("openai_server_event_received", on_server_event)
        session.on("error", error_recorder(REPORT))
        session.on("generation_created", lambda ev: tasks.append(asyncio.create_task(read_generation(ev))))

        async def turn(name: str) -> None:
            mic.say(question(args.audio, name))
            await asyncio.sleep(0.2)
            await mic.done_speaking.wait()
            turn_ends.append(time.monotonic())

        mic = Microphone(audio_sink(session))
        sender = asyncio.create_task(mic.run())
        try:
            await asyncio.sleep(1.0)
            await asyncio.wait_for(session.generate_reply(instructions="Greet the user."), 12.0)
            await asyncio.wait_for(greeted.wait(), 10.0)
            await turn("interrupt")  # over the greeting: the server cancels it
            await asyncio.sleep(LISTEN_S)
            await turn("hello")
            await asyncio.sleep(LISTEN_S)
            await turn("weather")
            await asyncio.wait_for(answered_tool.wait(), max(1.0, deadline - time.monotonic()))
            await asyncio.sleep(LISTEN_S)
        except asyncio.TimeoutError:
            REPORT.notes["timeout"] = "a step did not happen in time"
        except llm.RealtimeError as exc:
            REPORT.errors.append(f"RealtimeError: {exc}")
        finally:
            REPORT.notes["turn_ends"] = turn_ends
            REPORT.notes["responses"] = statuses
            REPORT.notes["stopped_at"] = time.monotonic()
            sender.cancel()
            for t in tasks:
                t.cancel()
            await session.aclose()
            await model.aclose()
    REPORT.write(args.out)


if __name__ == "__main__":
    asyncio.run(main())
