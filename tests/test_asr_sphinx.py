"""pocketsphinx in a worker process: streams events like Whisper, and a killed worker is an error, not a hang."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

from kame.asr import AsrConfig, AsrEvent, EventType, create_recognizer
from kame.asr.process import ProcessStream
from kame.asr.sphinx import PocketsphinxRecognizer
from kame.audio.media import FRAME_SIZE
from tests.support.speech import content_words, silence, synthesize, words

FRAME = FRAME_SIZE


@pytest.fixture(scope="module")
def recognizer() -> PocketsphinxRecognizer:
    rec = create_recognizer(AsrConfig(kind="pocketsphinx"))
    assert isinstance(rec, PocketsphinxRecognizer)
    return rec


def test_transcribes_a_clear_sentence_in_a_worker_process(recognizer: PocketsphinxRecognizer) -> None:
    text = "What is the capital city of Australia and how many people live there?"
    pcm = np.concatenate([silence(0.3), synthesize(text, "en-us", 150), silence(1.0)])

    async def main() -> list[AsrEvent]:
        stream = recognizer.open_stream()
        assert isinstance(stream, ProcessStream) and stream.worker_pid != os.getpid()
        assert await asyncio.to_thread(stream.ready.wait, 30), "worker never started"
        for start in range(0, len(pcm), FRAME):
            assert stream.feed(pcm[start : start + FRAME])
            await asyncio.sleep(0.02)  # 4x real time, still streaming
        await stream.aclose()
        return [e async for e in stream.events()]

    events = asyncio.run(asyncio.wait_for(main(), 60))
    types = [e.type for e in events]
    assert types[0] is EventType.SPEECH_STARTED and types[-2:] == [EventType.SPEECH_STOPPED, EventType.FINAL]
    assert EventType.PARTIAL in types
    final = events[-1].text
    spoken = set(content_words(text))
    assert spoken & set(words(final)), f"nothing of {sorted(spoken)} in {final!r}"


def test_killed_worker_gives_an_error_event_not_a_hang(recognizer: PocketsphinxRecognizer) -> None:
    stream = recognizer.open_stream()
    assert isinstance(stream, ProcessStream)
    assert stream.ready.wait(30), "worker never started"
    speech = synthesize("Please keep talking while the worker is killed.")
    for start in range(0, len(speech) // 2, FRAME):
        stream.feed(speech[start : start + FRAME])
    os.kill(stream.worker_pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert stream.join(10), "stream did not end after its worker died"
    assert time.monotonic() - t0 < 5
    events = list(stream)
    assert events[-1].type is EventType.ERROR and "died" in events[-1].text
    assert not stream.feed(np.zeros(FRAME, np.float32))
    stream.close()  # harmless after the end


def test_offline_path_runs_in_process(recognizer: PocketsphinxRecognizer) -> None:
    from kame.asr import transcribe_offline

    pcm = np.concatenate([silence(0.3), synthesize("Hello world, this is a test."), silence(1.0)])
    events = list(transcribe_offline(recognizer.new_transcriber(), pcm))
    assert [e.type for e in events if e.type is not EventType.PARTIAL] == [
        EventType.SPEECH_STARTED,
        EventType.SPEECH_STOPPED,
        EventType.FINAL,
    ]
