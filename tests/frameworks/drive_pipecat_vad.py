"""Pipecat 1.14's ``OpenAIRealtimeLLMService`` against kame with Pipecat's own VAD (client-driven turns).

``turn_detection: False`` (sent as ``null``) and Silero VAD in the user aggregator: Pipecat decides the
turns. At the end of the user's speech it sends ``input_audio_buffer.commit`` and ``response.create``; when
the user speaks over the assistant it interrupts: ``input_audio_buffer.clear`` (then replays its pre-roll of
the new speech), ``response.cancel``, ``conversation.item.truncate``. Otherwise as drive_pipecat.py below.

(drive_pipecat.py:)

``source -> user context aggregator -> OpenAIRealtimeLLMService -> sink -> assistant context
aggregator`` under a ``WorkerRunner``: the context (a system prompt, a user message, the
``get_weather`` function) is loaded as ``conversation.item.create`` events followed by one
``response.create``; the user asks about the weather (Pipecat runs the function, its output goes back
as a ``function_call_output`` and the aggregator asks for the answer), then speaks over the assistant
(Pipecat's interruption: ``conversation.item.truncate``). Pipecat treats every server ``error`` as fatal
except ``response_cancel_not_active`` and ``conversation_already_has_active_response``; both are counted
here too. Runs in Pipecat's own virtualenv (tests/frameworks/venvs.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pipecat.services.openai.realtime.events as rt_events
from drive_common import CHUNK_S, RATE, Report, arguments, question
from pipecat.adapters.schemas.function_schema import FunctionSchema
from pipecat.adapters.schemas.tools_schema import ToolsSchema
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMContextFrame,
    OutputAudioRawFrame,
    StartFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

REPORT = Report()
CONTEXT_NOTE = "The user's name is Ann and she lives in Paris."
SESSION_READY = asyncio.Event()

_parse = rt_events.parse_server_event


def _observed_parse(message: str) -> Any:
    """Pipecat's own parser, unchanged; the event's type and errors are noted on the way."""
    raw = json.loads(message)
    etype = str(raw.get("type"))
    REPORT.event(etype)
    if etype == "error":
        REPORT.errors.append(str(raw.get("error"))[:500])
    elif etype == "session.created":
        SESSION_READY.set()
    elif etype == "response.output_audio_transcript.done":
        REPORT.assistant_transcripts.append(raw.get("transcript", ""))
    elif etype == "conversation.item.input_audio_transcription.completed":
        REPORT.user_transcripts.append(raw.get("transcript", ""))
    return _parse(message)


rt_events.parse_server_event = _observed_parse


class Source(FrameProcessor):
    """A microphone: the questions at real time (silence in between), once the session is up."""

    def __init__(self, audio_dir: str) -> None:
        super().__init__()
        self.audio_dir = audio_dir
        self.queue: list[bytes] = []
        self.idle = asyncio.Event()

    def say(self, name: str) -> None:
        pcm = question(self.audio_dir, name)
        step = int(RATE * CHUNK_S) * 2
        self.queue += [pcm[i:i + step] for i in range(0, len(pcm), step)]
        self.idle.clear()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame):
            REPORT.errors.append(str(frame.error)[:500])
        if isinstance(frame, StartFrame):
            self.create_task(self._play())
        await self.push_frame(frame, direction)

    async def _play(self) -> None:
        await SESSION_READY.wait()
        step = int(RATE * CHUNK_S) * 2
        start, n = time.monotonic(), 0
        while True:
            chunk = self.queue.pop(0) if self.queue else bytes(step)
            if not self.queue:
                self.idle.set()
            await self.push_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))
            n += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_S - time.monotonic()))


class Sink(FrameProcessor):
    """The speaker: notes the reply audio and the interruptions."""

    def __init__(self) -> None:
        super().__init__()
        self.replying = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputAudioRawFrame):
            REPORT.audio_chunk(len(frame.audio))
            self.replying.set()
        elif isinstance(frame, InterruptionFrame):
            REPORT.notes["interruptions"] = int(REPORT.notes.get("interruptions", 0)) + 1  # type: ignore[call-overload]
        await self.push_frame(frame, direction)


async def get_weather(params: FunctionCallParams) -> None:
    city = str(params.arguments.get("city", ""))
    REPORT.tool_runs.append({"name": "get_weather", "city": city})
    await params.result_callback(f"sunny and 21 degrees in {city}")


async def main() -> None:
    args = arguments()
    ws = args.url.replace("http", "ws", 1)
    props = rt_events.SessionProperties(audio=rt_events.AudioConfiguration(
        input=rt_events.AudioInput(turn_detection=False)))
    service = OpenAIRealtimeLLMService(api_key=args.token, base_url=f"{ws}/v1/realtime",
                                       settings=OpenAIRealtimeLLMService.Settings(model="kame", session_properties=props))
    sent: list[str] = []
    send = service.send_client_event

    async def observed_send(event: Any) -> None:
        sent.append(str(getattr(event, "type", "?")))
        await send(event)

    service.send_client_event = observed_send  # type: ignore[method-assign]
    service.register_function("get_weather", get_weather)
    tools = ToolsSchema(standard_tools=[FunctionSchema(
        name="get_weather", description="The current weather in a city.",
        properties={"city": {"type": "string"}}, required=["city"])])
    context = LLMContext([{"role": "system", "content": "You are a friendly assistant."},
                          {"role": "user", "content": CONTEXT_NOTE}], tools=tools)
    pair = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer()))
    source, sink = Source(args.audio), Sink()
    worker = PipelineWorker(Pipeline([source, pair.user(), service, sink, pair.assistant()]),
                            idle_timeout_secs=None, enable_rtvi=False)

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker: Any, frame: ErrorFrame) -> None:
        REPORT.errors.append(str(frame.error)[:500])

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await worker.queue_frame(LLMContextFrame(context))  # the context, then one response.create

    async def script() -> None:
        try:
            await asyncio.wait_for(SESSION_READY.wait(), 15)
            await asyncio.sleep(2.0)
            source.say("weather")
            deadline = time.monotonic() + args.seconds - 10
            while not REPORT.tool_runs and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if not REPORT.tool_runs:
                REPORT.notes["timeout"] = "the function was never called"
            sink.replying.clear()
            await asyncio.wait_for(sink.replying.wait(), 10)
            await asyncio.sleep(0.8)
            source.say("interrupt")  # over the assistant's answer
            await source.idle.wait()
            await asyncio.sleep(6.0)
        except asyncio.TimeoutError:
            REPORT.notes["timeout"] = "a step did not happen in time"
        finally:
            REPORT.notes["client_events"] = {t: sent.count(t) for t in sorted(set(sent))}
            await worker.queue_frame(EndFrame())

    ender = asyncio.create_task(script())
    await asyncio.wait_for(runner.run(), args.seconds + 30)
    await ender
    REPORT.write(args.out)


if __name__ == "__main__":
    asyncio.run(main())
