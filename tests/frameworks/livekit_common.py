"""What the LiveKit drivers (RealtimeModel, its barge-in turns, NVIDIA's PersonaPlex plugin) share: the
weather tool, the server-event and error recorders, and the microphone's sink into a realtime session.
Imported only in LiveKit's virtualenv (drive_common is the one every framework imports)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from drive_common import RATE, Report
from livekit import rtc
from livekit.agents import llm


def weather_tool(report: Report) -> Any:
    """The ``get_weather`` function tool the scenarios call; each run is recorded in ``report``."""

    @llm.function_tool
    async def get_weather(city: str) -> str:
        """The current weather in a city."""
        report.tool_runs.append({"name": "get_weather", "city": city})
        return f"sunny and 21 degrees in {city}"

    return get_weather


def record_server_event(report: Report, event: dict[str, Any]) -> str:
    """Record one OpenAI server event (its type, the transcripts, an error); returns its type."""
    etype = str(event.get("type"))
    report.event(etype)
    if etype == "conversation.item.input_audio_transcription.completed":
        report.user_transcripts.append(event.get("transcript", ""))
    elif etype == "response.output_audio_transcript.done":
        report.assistant_transcripts.append(event.get("transcript", ""))
    elif etype == "error":
        report.errors.append(str(event.get("error"))[:500])
    return etype


def error_recorder(report: Report) -> Callable[[llm.RealtimeModelError], None]:
    """A session ``error`` listener that records the plugin's errors in ``report``."""

    def on_error(error: llm.RealtimeModelError) -> None:
        report.errors.append(f"{error.label}: {error.error!r}"[:500])

    return on_error


def audio_sink(session: Any) -> Callable[[bytes], Awaitable[None]]:
    """The microphone's sink: PCM16 chunks pushed into the session as ``rtc.AudioFrame``s."""

    async def push(chunk: bytes) -> None:
        n = len(chunk) // 2
        session.push_audio(rtc.AudioFrame(chunk, sample_rate=RATE, num_channels=1, samples_per_channel=n))

    return push
