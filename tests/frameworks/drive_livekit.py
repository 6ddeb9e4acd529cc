"""LiveKit Agents 1.8 (``livekit.plugins.openai.realtime.RealtimeModel``) against kame, without a room.

``RealtimeModel(base_url=...)``, driven through ``RealtimeModel.session()`` the way an AgentSession
drives it: audio by ``push_audio`` (``rtc.AudioFrame``, at real time), a function tool
(``update_tools``; the call is run here, its output goes back by ``update_chat_ctx`` and the reply by
``generate_reply``, as AgentSession does), then ``generate_reply(instructions=...)`` on its own, which
LiveKit matches to its ``response.created`` by the ``metadata.client_event_id`` it sent. Runs in
LiveKit's own virtualenv (tests/frameworks/venvs.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from drive_common import Microphone, Report, arguments, question
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel
from livekit_common import audio_sink, error_recorder, record_server_event, weather_tool

REPORT = Report()
GENERATE = "Tell the user a short joke about penguins."

get_weather = weather_tool(REPORT)


async def main() -> None:
    args = arguments()
    deadline = time.monotonic() + args.seconds
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(model="kame", base_url=f"{args.url}/v1", api_key=args.token, http_session=http)
        session = model.session()
        await session.update_instructions("You are a friendly assistant.")
        await session.update_tools([get_weather])
        called = asyncio.Event()
        answered_tool = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []

        def on_server_event(event: dict[str, Any]) -> None:
            record_server_event(REPORT, event)

        async def read_generation(ev: llm.GenerationCreatedEvent) -> None:
            async def messages() -> None:
                async for msg in ev.message_stream:
                    async def audio(m: llm.MessageGeneration = msg) -> None:
                        async for frame in m.audio_stream:
                            REPORT.audio_chunk(len(bytes(frame.data)))
                    tasks.append(asyncio.create_task(audio()))

            async def functions() -> None:
                async for call in ev.function_stream:
                    called.set()
                    output = await get_weather(**__import__("json").loads(call.arguments))
                    ctx = session.chat_ctx.copy()
                    ctx.items.append(llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output=output,
                                                            is_error=False))
                    await session.update_chat_ctx(ctx)
                    session.generate_reply()
                    answered_tool.set()

            await asyncio.gather(messages(), functions())

        session.on("openai_server_event_received", on_server_event)
        session.on("error", error_recorder(REPORT))
        session.on("generation_created", lambda ev: tasks.append(asyncio.create_task(read_generation(ev))))

        mic = Microphone(audio_sink(session))
        sender = asyncio.create_task(mic.run())
        try:
            await asyncio.sleep(1.0)
            mic.say(question(args.audio, "weather"))
            await asyncio.wait_for(answered_tool.wait(), max(1.0, deadline - time.monotonic()))
            await asyncio.sleep(5.0)
            started = time.monotonic()
            generation = await asyncio.wait_for(session.generate_reply(instructions=GENERATE), 12.0)
            REPORT.notes["generate_reply_s"] = round(time.monotonic() - started, 3)
            REPORT.notes["generate_reply_user_initiated"] = generation.user_initiated
            await asyncio.sleep(6.0)
        except asyncio.TimeoutError:
            REPORT.notes["timeout"] = "a step did not happen in time"
        except llm.RealtimeError as exc:
            REPORT.errors.append(f"RealtimeError: {exc}")
        finally:
            sender.cancel()
            for t in tasks:
                t.cancel()
            await session.aclose()
            await model.aclose()
    REPORT.write(args.out)


if __name__ == "__main__":
    asyncio.run(main())
