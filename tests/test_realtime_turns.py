"""Client-driven turns on /v1/realtime with the official OpenAI SDK against the CPU demo (Whisper ASR, a real
local LLM server): ``turn_detection: null`` then ``input_audio_buffer.commit`` ends a turn (committed, the
ASR's transcript), the back-end is asked only on ``response.create``; ``input_audio_buffer.clear`` drops a
turn; ``session.updated`` echoes the turn settings; switching back to server VAD mid-session works."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.support.llm_server import LlmServer, RecordedRequest, Reply
from tests.support.moshi_client import ServerProcess
from tests.support.servers import OPENAI_TOKEN, LlmStandins, responding
from tests.support.speech import silence, synthesize


def answer(rec: RecordedRequest) -> Reply:
    return Reply(text="Paris is sunny today, twenty one degrees.", first_token_delay_s=0.05)


@pytest.fixture(scope="module")
def llm_backend(llm_standins: LlmStandins) -> Iterator[LlmServer]:
    """The shared ``openai`` server's default back-end (``llm``)."""
    with responding(llm_standins.llm):
        yield llm_standins.llm


@pytest.fixture(scope="module")
def server(openai_server: ServerProcess) -> ServerProcess:
    """tests/support/servers.py ``OPENAI``: the ``llm`` back-end by default; a token."""
    return openai_server


def _b64(pcm: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class Mic:
    """Sends audio at real time, 40 ms at a time: what was queued, silence otherwise (as a microphone does)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.queue: list[np.ndarray] = []
        self.idle = asyncio.Event()

    async def say(self, pcm: np.ndarray) -> None:
        n = int(24000 * 0.04)
        self.idle.clear()
        self.queue += [pcm[i:i + n] for i in range(0, len(pcm), n)]
        await self.idle.wait()

    async def run(self) -> None:
        n, start, i = int(24000 * 0.04), time.monotonic(), 0
        while True:
            chunk = self.queue.pop(0) if self.queue else np.zeros(n, np.float32)
            if not self.queue:
                self.idle.set()
            await self.conn.input_audio_buffer.append(audio=_b64(chunk))
            i += 1
            await asyncio.sleep(max(0.0, start + i * 0.04 - time.monotonic()))


async def _until(pred: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def test_client_turns_commit_clear_and_back_to_server_vad(server: ServerProcess, llm_backend: LlmServer) -> None:
    from openai import AsyncOpenAI

    llm_backend.reset()
    llm_backend.responder = answer
    events: list[tuple[float, Any]] = []
    audio: list[tuple[float, int]] = []

    async def main() -> dict[str, Any]:
        client = AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key=OPENAI_TOKEN)
        async with client.realtime.connect(model="kame") as conn:
            stop = asyncio.Event()

            async def reader() -> None:
                while not stop.is_set():
                    try:
                        e = await asyncio.wait_for(conn.recv(), 0.3)
                    except asyncio.TimeoutError:
                        continue
                    if e.type == "response.output_audio.delta":
                        audio.append((time.monotonic(), len(base64.b64decode(e.delta)) // 2))
                    else:
                        events.append((time.monotonic(), e))

            task = asyncio.create_task(reader())
            mic = Mic(conn)
            sender = asyncio.create_task(mic.run())

            def have(kind: str, n: int = 1) -> bool:
                return sum(1 for _, e in events if e.type == kind) >= n

            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await mic.say(np.concatenate([silence(0.5), synthesize("What is the weather like in Paris today?"),
                                          silence(0.2)]))
            asked_before_commit = len(llm_backend.chat_requests())
            await conn.input_audio_buffer.commit()
            await conn.response.create()  # asked once the commit's words are in
            await _until(lambda: have("conversation.item.input_audio_transcription.completed"), 20)
            asked_after_commit = len([r for r in llm_backend.chat_requests() if "weather" not in str(r.body)])
            await _until(lambda: have("response.done"), 15)
            await asyncio.sleep(2.0)
            # a turn the client drops: its words never reach the back-end
            await mic.say(synthesize("Forget about the zebra please."))
            await conn.input_audio_buffer.clear()
            await _until(lambda: have("input_audio_buffer.cleared"), 5)
            await asyncio.sleep(3.0)
            # back to the server's turns, mid-session
            await conn.session.update(session={"type": "realtime", "audio": {"input": {
                "turn_detection": {"type": "server_vad", "create_response": True}}}})
            await mic.say(synthesize("And tomorrow, will it rain?"))
            await _until(lambda: have("conversation.item.input_audio_transcription.completed", 2), 20)
            await asyncio.sleep(1.0)
            stop.set()
            sender.cancel()
            await task
        return {"before": asked_before_commit, "after": asked_after_commit}

    counts = asyncio.run(main())
    types = [e.type for _, e in events]
    errors = [e for _, e in events if e.type == "error"]
    assert errors == [], [e.error for e in errors]
    assert not [t for t in types if t.startswith("kame.")], types
    updated = [e for _, e in events if e.type == "session.updated"]
    assert updated[0].session.audio.input.turn_detection is None
    assert updated[-1].session.audio.input.turn_detection.type == "server_vad"
    # client turns: no VAD events until the switch back; the commit, then the ASR's transcript
    switch_at = next(t for t, e in events if e.type == "session.updated" and e is updated[-1])
    assert not [e for t, e in events if e.type.startswith("input_audio_buffer.speech") and t < switch_at]
    committed = [e for _, e in events if e.type == "input_audio_buffer.committed"]
    completed = [e for _, e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    assert committed and completed and completed[0].item_id == committed[0].item_id
    assert "weather" in completed[0].transcript.lower(), [(e.type, getattr(e, "transcript", None)) for _, e in events
                                                          if "transcription" in e.type or "input_audio" in e.type]
    assert "input_audio_buffer.cleared" in types
    # the back-end: asked only on response.create, with the committed words; the cleared words never
    assert counts["before"] == 0 and counts["after"] == 0, counts
    chat = llm_backend.chat_requests()
    assert chat and "weather" in str(chat[0].body["messages"]).lower()
    assert not any("zebra" in str(r.body["messages"]).lower() for r in chat), [r.last_user_message for r in chat]
    # back to server VAD: speech events and a transcript again, and KAME asks on transcripts again
    assert any(e.type == "input_audio_buffer.speech_started" and t > switch_at for t, e in events)
    after = [e.type for t, e in events if t > switch_at and not e.type.startswith("response.")]
    assert any("rain" in e.transcript.lower() for e in completed[1:]), ([e.transcript for e in completed], after)
    assert any("rain" in str(r.body["messages"]).lower() for r in chat[1:])
    # the requested response carried reply audio, at real time
    assert "response.created" in types and audio
    samples = sum(n for _, n in audio)
    span = audio[-1][0] - audio[0][0] + 0.08
    print(f"client turns: reply audio {samples / 24000:.1f} s over {span:.1f} s")
