"""The echo guard end to end in a session's pipeline: a scripted front-end says a known sentence (espeak),
the client echoes what it receives back into its microphone (delayed, quieter, low-passed, as a laptop
with its speakers on does), and the real Whisper stream transcribes the echo: no user turn starts for it
and nothing is interrupted, while the user, repeating the assistant with a word of their own right after
it, and later asking something else, gets a turn each time."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from kame.asr.config import AsrConfig
from kame.asr.factory import create_recognizer
from kame.audio.media import FRAME_SIZE
from kame.session.events import (
    AnswerCancelled,
    AssistantFrame,
    EchoJudged,
    PipelineEvent,
    SpeechStarted,
    UserFinal,
    UserPartial,
)
from kame.session.settings import SessionSettings
from tests.support.scripted_frontend import EchoPath, Script, ScriptedPipeline, Utterance
from tests.support.speech import content_recall, synthesize

ASSISTANT = "It is a beautiful old city, and the capital of France is Paris."
REPEAT = "Yes, Paris."
QUESTION = "What is the weather like in Tokyo today?"
REPEAT_AT_S = 5.6  # just after the echo ended: the assistant's "Paris" is still within the guard's window
QUESTION_AT_S = 10.5  # long after: nothing to hold
LENGTH_S = 14.5


def _mic(length_s: float) -> np.ndarray:
    """What the user says into the microphone (the echo is added as the session runs)."""
    mic = np.zeros(int(length_s * 24000), np.float32)
    rng = np.random.default_rng(7)
    mic += (rng.standard_normal(mic.size) * 10 ** (-62 / 20)).astype(np.float32)  # a quiet room
    for text, at in ((REPEAT, REPEAT_AT_S), (QUESTION, QUESTION_AT_S)):
        pcm = synthesize(text, voice="en-gb", speed=150)
        start = int(at * 24000)
        mic[start : start + pcm.size] += pcm[: mic.size - start]
    return mic


async def _session(interrupt: bool) -> tuple[list[PipelineEvent], EchoPath]:
    script = Script.speak([Utterance(ASSISTANT, start_s=0.4)], LENGTH_S)
    recognizer = create_recognizer(AsrConfig(kind="whisper"))
    echo = EchoPath(delay_s=0.3, gain_db=-12.0)
    mic = _mic(LENGTH_S)
    events: list[PipelineEvent] = []
    pipeline = ScriptedPipeline(script, recognizer=recognizer, settings=SessionSettings(interrupt_response=interrupt, echo_guard=True))

    async def client() -> None:  # plays what it receives: the echo path hears it
        async for ev in pipeline.events():
            if isinstance(ev, AssistantFrame):
                echo.receive(ev.pcm)
            else:
                events.append(ev)

    async with pipeline:
        reader = asyncio.get_running_loop().create_task(client())
        for k in range(mic.size // FRAME_SIZE):
            start = k * FRAME_SIZE
            pipeline.feed(mic[start : start + FRAME_SIZE] + echo.heard(start, FRAME_SIZE))
            await asyncio.sleep(0.03)  # ~2.7x real time: the stream's clock is the audio's, not the wall's
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(isinstance(e, UserFinal) for e in events) < 2:
            await asyncio.sleep(0.1)
    for ev in pipeline.drain_events():
        if not isinstance(ev, AssistantFrame):
            events.append(ev)
    reader.cancel()
    return events, echo


@pytest.mark.timeout(90)
def test_the_assistants_echo_starts_no_turn_while_the_user_gets_theirs() -> None:
    t0 = time.monotonic()
    events, echo = asyncio.run(_session(interrupt=True))
    assert echo.missing == 0  # the client had every frame to echo when the microphone needed it
    verdicts = [e for e in events if isinstance(e, EchoJudged)]
    finals = [e for e in events if isinstance(e, UserFinal)]
    echoes = [v for v in verdicts if v.echo]
    # the ASR heard the echo as speech (it transcribed the assistant's sentence) and the guard dropped it
    assert len(echoes) >= 1, (verdicts, finals)
    assert content_recall(ASSISTANT, " ".join(v.text for v in echoes)) >= 0.5, echoes
    echo_utterances = {v.utterance for v in echoes}
    for ev in events:  # no turn for it: no speech_started, no partial, no final, no barge-in
        if isinstance(ev, (SpeechStarted, UserPartial, UserFinal)):
            assert ev.utterance not in echo_utterances, ev
    # the user's two turns: the repeat with a word of their own was held and released, the question passed
    assert [content_recall(ref, f.text) >= 0.5 for ref, f in zip((REPEAT, QUESTION), finals)] == [True, True], finals
    assert len(finals) == 2, finals
    repeat, question = finals
    started = {e.utterance for e in events if isinstance(e, SpeechStarted)}
    assert repeat.utterance in started and question.utterance in started
    released = [v for v in verdicts if not v.echo]
    assert [v.utterance for v in released] == [repeat.utterance], verdicts
    assert released[0].matched >= 1 and released[0].extra >= 1  # "Paris" is the assistant's, "yes" the user's
    # interrupt_response: only the user's speech cancelled the answer, once per user turn
    cancels = [e for e in events if isinstance(e, AnswerCancelled)]
    assert len(cancels) == 2, cancels
    first_echo_t = min(v.t for v in echoes)
    assert all(c.t > first_echo_t for c in cancels)
    print(f"\necho guard session: {time.monotonic() - t0:.1f} s; verdicts "
          f"{[(v.echo, v.text, v.matched, v.words, v.delay_s) for v in verdicts]}; finals {[f.text for f in finals]}")
