"""OpenAI's Agents SDK (openai-agents 0.24, ``agents.realtime``) against kame, as its documentation shows it.

A ``RealtimeAgent`` with one function tool (``get_weather``) run by ``RealtimeRunner`` pointed at
kame's URL, with the SDK's default model settings (``semantic_vad`` with ``interrupt_response``):
the user asks about the weather, speaks again while the assistant answers (an interruption), then
types a message (``send_message``). Runs inside the SDK's own virtualenv (tests/frameworks/venvs.py).
"""

from __future__ import annotations

import asyncio
import time

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from drive_common import Microphone, Report, arguments, question

TYPED = "Please tell me a short joke about penguins."


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    REPORT.tool_runs.append({"name": "get_weather", "city": city})
    return f"sunny and 21 degrees in {city}"


REPORT = Report()


async def main() -> None:
    args = arguments()
    agent = RealtimeAgent(name="Assistant", instructions="You are a friendly assistant.", tools=[get_weather])
    runner = RealtimeRunner(agent)
    ws = args.url.replace("http", "ws", 1)
    session = await runner.run(model_config={"url": f"{ws}/v1/realtime?model=kame", "api_key": args.token})
    deadline = time.monotonic() + args.seconds
    async with session:
        mic = Microphone(session.send_audio)
        sender = asyncio.create_task(mic.run())
        tool_done = asyncio.Event()
        replied = asyncio.Event()

        async def events() -> None:
            async for event in session:
                if event.type == "raw_model_event":
                    data = event.data
                    if data.type == "raw_server_event":
                        REPORT.event(str(data.data.get("type")))
                        etype = data.data.get("type")
                        if etype == "conversation.item.input_audio_transcription.completed":
                            REPORT.user_transcripts.append(data.data.get("transcript", ""))
                        elif etype == "response.output_audio_transcript.done":
                            REPORT.assistant_transcripts.append(data.data.get("transcript", ""))
                        elif etype == "response.output_audio.delta":
                            replied.set()
                elif event.type == "audio":
                    REPORT.audio_chunk(len(event.audio.data))
                elif event.type == "error":
                    REPORT.errors.append(repr(event.error)[:500])
                elif event.type == "tool_end":
                    tool_done.set()

        reader = asyncio.create_task(events())
        try:
            await asyncio.sleep(1.0)
            mic.say(question(args.audio, "weather"))
            await asyncio.wait_for(tool_done.wait(), max(1.0, deadline - time.monotonic()))
            # the assistant answers on the function's output; the user speaks over it
            replied.clear()
            await asyncio.wait_for(replied.wait(), max(1.0, deadline - time.monotonic()))
            await asyncio.sleep(0.8)
            mic.say(question(args.audio, "interrupt"))
            await mic.done_speaking.wait()
            await asyncio.sleep(4.0)
            await session.send_message(TYPED)
            await asyncio.sleep(6.0)
        except asyncio.TimeoutError:
            REPORT.notes["timeout"] = "a step did not happen in time"
        finally:
            history = [getattr(i, "type", "?") + ":" + getattr(i, "role", "") for i in session._history]
            REPORT.notes["history"] = history[-20:]
            sender.cancel()
            reader.cancel()
    REPORT.write(args.out)


if __name__ == "__main__":
    asyncio.run(main())
