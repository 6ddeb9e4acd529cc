"""Whisper tiny.en (bundled, CPU int8) on real espeak-ng speech, through the live and offline paths."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from speech import content_recall, noise, silence, speech_end, synthesize, words

from kame.asr import AsrConfig, AsrEvent, EventType, create_recognizer, transcribe_offline
from kame.asr.whisper import WhisperRecognizer

FRAME = 1920


@pytest.fixture(scope="module")
def recognizer() -> WhisperRecognizer:
    rec = create_recognizer(AsrConfig(kind="whisper"))
    assert isinstance(rec, WhisperRecognizer)
    return rec


def by_type(events: list[AsrEvent], kind: EventType) -> list[AsrEvent]:
    return [e for e in events if e.type is kind]


async def feed_realtime(stream, pcm: np.ndarray, speed: float = 1.0) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    for k, start in enumerate(range(0, len(pcm), FRAME)):
        stream.feed(pcm[start : start + FRAME])
        delay = t0 + (k + 1) * FRAME / 24000 / speed - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def test_live_stream_partials_come_before_the_speech_ends(recognizer: WhisperRecognizer) -> None:
    """Fed at real time from asyncio: early partials that grow, a final, and a loop that never stalls."""
    text = "Please tell me the weather forecast for tomorrow morning in London."
    speech = synthesize(text, "en-us", 170)
    lead = 0.5
    pcm = np.concatenate([silence(lead), speech, silence(1.0)])
    end_of_speech = lead + speech_end(speech)

    async def main() -> tuple[list[AsrEvent], float]:
        stream = recognizer.open_stream()
        ticks: list[float] = []

        async def ticker() -> None:  # measures how late the loop runs while decodes happen
            while True:
                t = time.monotonic()
                await asyncio.sleep(0.01)
                ticks.append(time.monotonic() - t - 0.01)

        tick_task = asyncio.create_task(ticker())
        feeder = asyncio.create_task(feed_realtime(stream, pcm))
        events: list[AsrEvent] = []

        async def consume() -> None:
            async for e in stream.events():
                events.append(e)

        consumer = asyncio.create_task(consume())
        await feeder
        assert await stream.aclose(timeout=20)
        await asyncio.wait_for(consumer, 5)
        tick_task.cancel()
        return events, max(ticks)

    events, worst_tick = asyncio.run(main())
    types = [e.type for e in events]
    assert types[0] is EventType.SPEECH_STARTED
    assert types[-2:] == [EventType.SPEECH_STOPPED, EventType.FINAL]
    partials = by_type(events, EventType.PARTIAL)
    assert partials, types
    assert partials[0].audio_s < end_of_speech - 1.0, "the first partial must come well before the speech ends"
    # Partials grow: the committed prefix never shrinks and the last partial holds most of the sentence.
    stables = [len(p.stable.split()) for p in partials]
    assert stables == sorted(stables)
    assert len(words(partials[-1].text)) > len(words(partials[0].text))
    assert content_recall(text, partials[-1].text) >= 0.7
    # While speech goes on, the partial is checked at least every 200 ms of audio, so gaps stay short.
    assert max(np.diff([p.audio_s for p in partials])) < 1.0
    final = by_type(events, EventType.FINAL)[0]
    assert content_recall(text, final.text) >= 0.7, final.text
    assert final.audio_s < end_of_speech + 1.0 + 0.1  # end_silence 0.6 s + one decode
    assert worst_tick < 0.2, f"event loop stalled {worst_tick:.3f} s"
    assert all(b.wall_s >= a.wall_s for a, b in zip(events, events[1:]))


SENTENCES = [
    ("David has three sisters. Each of them has one brother. How many brothers does David have?", "en-us", 160),
    ("Remind me to call my mother after the meeting on Thursday.", "en-gb", 175),
    ("What is the capital city of Australia and how many people live there?", "en-us", 200),
    ("Can you explain why the sky looks blue during the day?", "en-gb-x-rp", 140),
    ("Write a short poem about the ocean and the moon.", "en-gb-scotland", 165),
    ("The train to Paris leaves from platform nine in twenty minutes.", "en-us", 185),
]


def test_finals_match_the_spoken_words(recognizer: WhisperRecognizer) -> None:
    """One session, six turns in several voices and speeds; each final has >= 70 % of the content words."""
    parts = [silence(0.5)]
    for text, voice, speed in SENTENCES:
        parts += [synthesize(text, voice, speed), silence(1.2)]
    cfg = recognizer.cfg.model_copy(update={"partial_interval_s": 1.0})  # finals are what is checked here
    tr = WhisperRecognizer(cfg, model=recognizer.model).new_transcriber()
    events = list(transcribe_offline(tr, np.concatenate(parts)))
    finals = by_type(events, EventType.FINAL)
    assert [f.utterance for f in finals] == list(range(len(SENTENCES))), [f.text for f in finals]
    for (text, voice, speed), final in zip(SENTENCES, finals):
        assert content_recall(text, final.text) >= 0.7, (voice, speed, text, final.text)
    assert len(by_type(events, EventType.SPEECH_STARTED)) == len(SENTENCES)


def test_silence_and_low_noise_give_no_words(recognizer: WhisperRecognizer) -> None:
    pcm = np.concatenate([silence(2.0), noise(3.0, -45, seed=3), noise(2.0, -60, seed=4), silence(1.0)])
    events = list(transcribe_offline(recognizer.new_transcriber(), pcm))
    assert all(not e.text for e in events), events


def test_session_closed_mid_word_still_gets_its_final(recognizer: WhisperRecognizer) -> None:
    text = "Could you translate good morning into Spanish for me?"
    speech = synthesize(text)
    cut = speech[: int(0.7 * len(speech))]  # stops inside a word, no trailing silence

    async def main() -> list[AsrEvent]:
        stream = recognizer.open_stream()
        for start in range(0, len(cut), FRAME):
            assert stream.feed(cut[start : start + FRAME])
        stream.close()
        return [e async for e in stream.events()]

    events = asyncio.run(asyncio.wait_for(main(), 30))
    assert [e.type for e in events][-2:] == [EventType.SPEECH_STOPPED, EventType.FINAL]
    final = events[-1].text
    assert content_recall("Could you translate good morning", final) >= 0.6, final


def test_crashing_decoder_ends_the_stream_with_an_error(
    recognizer: WhisperRecognizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> str:
        raise RuntimeError("CTranslate2 fell over")

    async def main() -> tuple[list[AsrEvent], bool]:
        stream = recognizer.open_stream()
        monkeypatch.setattr(recognizer.decoder, "decode", boom)
        await feed_realtime(stream, np.concatenate([silence(0.3), synthesize("Hello, can you hear me?")]), speed=8)
        events = [e async for e in stream.events()]
        return events, stream.feed(np.zeros(FRAME, np.float32))

    events, accepted = asyncio.run(asyncio.wait_for(main(), 20))
    assert events[-1].type is EventType.ERROR and "CTranslate2 fell over" in events[-1].text
    assert not accepted


def test_feed_never_blocks_and_counts_overflow(recognizer: WhisperRecognizer) -> None:
    cfg = recognizer.cfg.model_copy(update={"max_queued_s": 1.0})
    rec = WhisperRecognizer(cfg, model=recognizer.model)  # same model, smaller queue
    stream = rec.open_stream()
    speech = np.concatenate([synthesize("This is a rather long burst of speech to overflow the queue.")] * 2)
    t0 = time.perf_counter()
    results = [stream.feed(speech[i : i + FRAME]) for i in range(0, len(speech), FRAME)]
    elapsed = time.perf_counter() - t0
    stream.close()
    assert stream.join(30)
    assert elapsed < 0.2, f"feeding {len(results)} frames took {elapsed:.3f} s"
    stats = stream.stats()
    assert stats.dropped_chunks == results.count(False) and stats.dropped_chunks > 0
    assert stats.fed_s == pytest.approx(len(speech) / 24000)
    assert by_type(list(stream), EventType.FINAL)


def test_concurrent_sessions_share_one_model(recognizer: WhisperRecognizer) -> None:
    texts = ["Which planet in our solar system has the most moons?", "How long should I boil an egg?"]

    async def session(text: str, voice: str) -> str:
        stream = recognizer.open_stream()
        await feed_realtime(stream, np.concatenate([silence(0.3), synthesize(text, voice), silence(0.8)]), speed=4)
        await stream.aclose()
        finals = [e.text async for e in stream.events() if e.type is EventType.FINAL]
        assert len(finals) == 1 and stream.error is None
        return finals[0]

    async def main() -> list[str]:
        return await asyncio.gather(session(texts[0], "en-us"), session(texts[1], "en-gb"))

    finals = asyncio.run(asyncio.wait_for(main(), 60))
    # Decoding is deterministic, so sharing the model must not change a word of either final.
    for (text, voice), final in zip(zip(texts, ["en-us", "en-gb"]), finals):
        alone = np.concatenate([silence(0.3), synthesize(text, voice), silence(0.8)])
        offline = [e.text for e in transcribe_offline(recognizer.new_transcriber(), alone) if e.type is EventType.FINAL]
        assert offline == [final]
