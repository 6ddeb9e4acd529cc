"""Pieces of kame.asr that need no model: queues, stabiliser, VAD, WAV reading, config, factory."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kame.asr import AsrConfig, AsrEvent, EventType, create_recognizer
from kame.asr.agreement import LocalAgreement, drop_loops
from kame.asr.channel import EventChannel
from kame.asr.config import TurnConfig, WhisperConfig
from kame.asr.events import Emission
from kame.asr.resample import StreamResampler
from kame.asr.stream import AsrStream, Inbox, ThreadedStream
from kame.asr.transcriber import SegmentingTranscriber, Utterance
from kame.asr.vad import TurnAudio, TurnDetector, TurnEnd, TurnStart
from kame.asr.wav import load_wav_24k_mono, read_wav
from kame.audio.files import write_wav
from kame.errors import UserError
from tests.support.speech import noise, silence, synthesize


def ev(kind: EventType, text: str = "") -> AsrEvent:
    return AsrEvent(kind, text, 0.0, 0.0)


# ---------------------------------------------------------------------- channel and inbox


def test_channel_sync_and_end() -> None:
    ch = EventChannel(10)
    ch.put(ev(EventType.SPEECH_STARTED))
    ch.put(ev(EventType.FINAL, "hi"))
    ch.end()
    ch.put(ev(EventType.PARTIAL, "late"))  # after the end: ignored
    assert [e.type for e in ch] == [EventType.SPEECH_STARTED, EventType.FINAL]
    assert ch.ended and ch.get(timeout=0.01) is None


def test_channel_drops_oldest_partial_first() -> None:
    ch = EventChannel(3)
    ch.put(ev(EventType.SPEECH_STARTED))
    ch.put(ev(EventType.PARTIAL, "a"))
    ch.put(ev(EventType.PARTIAL, "a b"))
    ch.put(ev(EventType.FINAL, "a b c"))
    ch.end()
    assert [e.text for e in ch] == ["", "a b", "a b c"]
    assert ch.dropped == 1


def test_channel_wakes_asyncio_reader_from_a_thread() -> None:
    ch = EventChannel(10)

    def produce() -> None:
        for i in range(5):
            time.sleep(0.01)
            ch.put(ev(EventType.PARTIAL, str(i)))
        ch.end()

    async def consume() -> list[str]:
        threading.Thread(target=produce).start()
        return [e.text async for e in ch]

    assert asyncio.run(asyncio.wait_for(consume(), 5)) == ["0", "1", "2", "3", "4"]


def test_inbox_is_bounded_and_never_blocks() -> None:
    box = Inbox(max_samples=4000)
    t0 = time.perf_counter()
    accepted = [box.put(np.zeros(1920, np.float32)) for _ in range(5)]
    assert time.perf_counter() - t0 < 0.05
    assert accepted == [True, True, False, False, False]
    assert box.dropped_chunks == 3 and box.dropped_samples == 3 * 1920
    chunks, end = box.take(wait=False)
    assert len(chunks) == 2 and end is None
    box.end(flush=True)
    assert box.take(wait=True) == ([], True)
    assert not box.put(np.zeros(10, np.float32))


def test_stream_stamps_events_with_audio_fed() -> None:
    s = AsrStream("t", max_queued_s=1.0, max_events=10, on_event=None)
    s.feed(np.zeros(24000, np.float32))
    s.emit(Emission(EventType.PARTIAL, "x", "", 3))
    s.mark_done()
    (e,) = list(s)
    assert e.audio_s == pytest.approx(1.0) and e.utterance == 3 and abs(e.wall_s - time.time()) < 5


# ---------------------------------------------------------------------- stabiliser


def test_local_agreement_commits_words_two_hypotheses_agree_on() -> None:
    la = LocalAgreement(2)
    assert la.update("David has") == ("David has", "")
    assert la.update("David has free") == ("David has free", "David has")
    assert la.update("David has three sisters.") == ("David has three sisters.", "David has")
    assert la.update("David has three sisters, each") == ("David has three sisters, each", "David has three sisters,")
    # Committed words never change, even if a later hypothesis disagrees.
    partial, stable = la.update("Dave has tree sisters each of")
    assert stable.split()[:4] == ["David", "has", "three", "sisters"]
    assert partial.endswith("each of")


def test_drop_loops() -> None:
    assert drop_loops("Please tell me the way. Please tell me") == "Please tell me the way."
    assert drop_loops("for me for me for me") == "for me"
    assert drop_loops("David David David David") == "David David"
    assert drop_loops("I said that that is fine") == "I said that that is fine"
    assert drop_loops("") == ""


# ---------------------------------------------------------------------- resampling and VAD


def test_stream_resampler_is_chunk_size_independent() -> None:
    x = synthesize("Resampling test.")
    whole = StreamResampler()
    a = np.concatenate([whole.push(x), whole.flush()])
    pieces = StreamResampler()
    sizes = [1, 1920, 777, 5000, 13]
    out, pos, i = [], 0, 0
    while pos < len(x):
        n = sizes[i % len(sizes)]
        out.append(pieces.push(x[pos : pos + n]))
        pos, i = pos + n, i + 1
    b = np.concatenate([*out, pieces.flush()])
    assert abs(len(a) - len(x) * 2 / 3) <= 2 and len(a) == len(b)
    assert np.max(np.abs(a - b)) < 1e-4
    # Band-limited: a 9 kHz tone (above 16 kHz Nyquist) must vanish, not alias.
    t = np.arange(24000) / 24000
    tone = StreamResampler().push((0.5 * np.sin(2 * np.pi * 9000 * t)).astype(np.float32))
    assert np.sqrt(np.mean(tone[2000:-2000] ** 2)) < 0.01


def _turns(pcm: np.ndarray, cfg: TurnConfig | None = None) -> list:
    import soxr

    det = TurnDetector(cfg or TurnConfig())
    x16 = soxr.resample(pcm, 24000, 16000).astype(np.float32)
    out = []
    for i in range(0, len(x16), 1280):
        out += det.push(x16[i : i + 1280])
    return out + det.finish()


def test_turn_detector_finds_two_turns_and_their_ends() -> None:
    a = synthesize("First sentence here.")
    b = synthesize("And a second one.", "en-gb")
    pcm = np.concatenate([silence(0.5), a, silence(1.2), b, silence(1.0)])
    sig = _turns(pcm)
    kinds = [type(s) for s in sig if not isinstance(s, TurnAudio)]
    assert kinds == [TurnStart, TurnEnd, TurnStart, TurnEnd]
    assert not any(s.forced for s in sig if isinstance(s, TurnEnd))
    # Silence and quiet noise never open a turn.
    assert _turns(np.concatenate([silence(2.0), noise(2.0, -55)])) == []


def test_turn_detector_cuts_long_turns_and_closes_at_end_of_input() -> None:
    long = np.concatenate([synthesize("one two three four five six seven eight nine ten", speed=120)] * 2)
    sig = _turns(long[: int(4.5 * 24000)], TurnConfig(max_utterance_s=2.0))
    ends = [s for s in sig if isinstance(s, TurnEnd)]
    assert len(ends) >= 2 and all(e.forced for e in ends)  # cut at 2 s, then cut by the end of input


class _EchoTranscriber(SegmentingTranscriber):
    """Decoder stand-in: the hypothesis is the utterance length in 100 ms units."""

    def partial_text(self, utt: Utterance) -> str:
        return " ".join(["w"] * (utt.samples // 1600))

    def final_text(self, utt: Utterance) -> str:
        return f"final {utt.index}"


def test_segmenting_transcriber_event_order() -> None:
    from kame.asr import transcribe_offline

    tr = _EchoTranscriber(AsrConfig(agreement=1))
    pcm = np.concatenate([silence(0.3), synthesize("A short turn."), silence(1.0), synthesize("Another."), silence(0.1)])
    evs = list(transcribe_offline(tr, pcm))
    kinds = [e.type for e in evs if e.type is not EventType.PARTIAL]
    assert kinds == [EventType.SPEECH_STARTED, EventType.SPEECH_STOPPED, EventType.FINAL] * 2
    assert [e.text for e in evs if e.type is EventType.FINAL] == ["final 0", "final 1"]
    first_turn = [e for e in evs if e.type is EventType.PARTIAL and e.utterance == 0]
    gaps = np.diff([e.audio_s for e in first_turn])
    assert len(first_turn) >= 3 and np.all(gaps <= 0.2 + 0.081)  # a check every 200 ms of audio


class _VoicedEchoTranscriber(_EchoTranscriber):
    """The hypothesis is the voiced audio so far in 100 ms units: a pause adds no word."""

    def partial_text(self, utt: Utterance) -> str:
        return " ".join(["w"] * (utt.voiced_upto // 1600))


def test_a_pause_settles_the_last_words_before_the_final() -> None:
    """With two hypotheses to agree, the last words spoken would wait for the final (end_silence_s
    later); one decode in the pause settles them, and a partial reports them although its text is
    the same as the one before (only its stable part grew)."""
    from kame.asr import transcribe_offline

    tr = _VoicedEchoTranscriber(AsrConfig(agreement=2))
    pcm = np.concatenate([silence(0.3), synthesize("A somewhat longer turn to transcribe."), silence(1.5)])
    evs = list(transcribe_offline(tr, pcm))
    stopped = next(e for e in evs if e.type is EventType.SPEECH_STOPPED)
    partials = [e for e in evs if e.type is EventType.PARTIAL and e.audio_s <= stopped.audio_s]
    assert partials, evs
    last = partials[-1]
    assert last.text and last.stable == last.text, [(e.audio_s, e.text, e.stable) for e in partials]


class _UnsettledTranscriber(_VoicedEchoTranscriber):
    """Its last word never agrees with the previous hypothesis's; records ``voiced_upto`` per decode."""

    def __init__(self, cfg: AsrConfig) -> None:
        super().__init__(cfg)
        self.voiced_at_decode: list[int] = []

    def partial_text(self, utt: Utterance) -> str:
        self.voiced_at_decode.append(utt.voiced_upto)
        return super().partial_text(utt) + f" x{len(self.voiced_at_decode)}"


def test_a_pause_is_decoded_once_even_when_the_words_do_not_settle() -> None:
    from kame.asr import transcribe_offline

    tr = _UnsettledTranscriber(AsrConfig(agreement=2, turn=TurnConfig(end_silence_s=1.0)))
    list(transcribe_offline(tr, np.concatenate([silence(0.3), synthesize("A short turn."), silence(1.5)])))
    seen = tr.voiced_at_decode
    pause_decodes = [b for a, b in zip(seen, seen[1:]) if a == b]
    assert len(seen) >= 3 and len(pause_decodes) == 1, seen


def test_threaded_stream_reports_a_crash_and_stops() -> None:
    class Boom(_EchoTranscriber):
        def partial_text(self, utt: Utterance) -> str:
            raise RuntimeError("decoder exploded")

    stream = ThreadedStream(Boom(AsrConfig()), "boom", max_queued_s=5, max_events=50)
    stream.feed(np.concatenate([silence(0.2), synthesize("Hello there.")]))
    assert stream.join(10)
    evs = list(stream)
    assert evs[-1].type is EventType.ERROR and "decoder exploded" in evs[-1].text
    assert stream.error and not stream.feed(np.zeros(1920, np.float32))


# ---------------------------------------------------------------------- WAV files


def test_read_wav_formats(tmp_path: Path) -> None:
    import subprocess

    src = tmp_path / "mono16k.wav"
    write_wav(src, synthesize("Wave formats.")[::3] * 0.5, 8000)
    ref = load_wav_24k_mono(src)
    for opts, name in [
        (["-e", "floating-point", "-b", "32", "-c", "2", "-r", "44100"], "f32_stereo.wav"),
        (["-e", "signed-integer", "-b", "24", "-c", "1", "-r", "48000"], "s24.wav"),
        (["-e", "unsigned-integer", "-b", "8", "-c", "1", "-r", "8000"], "u8.wav"),
        (["-e", "signed-integer", "-b", "32", "-c", "2", "-r", "22050"], "s32.wav"),
    ]:
        out = tmp_path / name
        subprocess.run(["sox", str(src), *opts, str(out)], check=True)
        x = load_wav_24k_mono(out)
        assert x.dtype == np.float32 and x.ndim == 1
        assert abs(len(x) - len(ref)) < 24000 * 0.01, name
        n = min(len(x), len(ref))
        assert np.corrcoef(x[:n], ref[:n])[0, 1] > 0.9, name
    assert read_wav(tmp_path / "f32_stereo.wav")[0].shape[1] == 2


def test_bad_wav_files_are_one_line_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_wav(tmp_path / "missing.wav")
    (tmp_path / "text.wav").write_text("hello")
    with pytest.raises(UserError, match="not a WAV file"):
        read_wav(tmp_path / "text.wav")
    (tmp_path / "nodata.wav").write_bytes(b"RIFF\x04\x00\x00\x00WAVE")
    with pytest.raises(UserError, match="without fmt chunk"):
        read_wav(tmp_path / "nodata.wav")


# ---------------------------------------------------------------------- config and factory


def test_config_fields_are_documented_and_strict() -> None:
    from pydantic import ValidationError

    for model in (AsrConfig, TurnConfig, WhisperConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} lacks a description"
    with pytest.raises(ValidationError):
        AsrConfig(partial_intervall_s=0.3)
    with pytest.raises(ValidationError):
        AsrConfig(turn={"vad_aggressiveness": 4})


def test_factory_none_and_errors() -> None:
    assert create_recognizer(AsrConfig(kind="none")) is None
    with pytest.raises(UserError, match="does not exist"):
        create_recognizer(AsrConfig(kind="whisper", model="/no/such/model"))
    with pytest.raises(UserError, match="pocketsphinx model directory"):
        create_recognizer(AsrConfig(kind="pocketsphinx", model="/no/such/model"))


def test_whisper_hub_failure_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        create_recognizer(AsrConfig(kind="whisper", model="small.en"))
    msg = str(err.value)
    assert "HF_HUB_OFFLINE" in msg and "\n" not in msg


class _HangingTranscriber(_EchoTranscriber):
    """A decoder that does not return (a deadlock in native code, say) until ``release`` is set."""

    def __init__(self, cfg: AsrConfig, release: threading.Event | None = None) -> None:
        super().__init__(cfg)
        self.release = release or threading.Event()

    def partial_text(self, utt: Utterance) -> str:
        self.release.wait(3600)
        return ""


def _hanging_transcriber() -> _HangingTranscriber:
    return _HangingTranscriber(AsrConfig())


def test_aclose_aborts_a_hung_thread_recogniser() -> None:
    release = threading.Event()
    stream = ThreadedStream(_HangingTranscriber(AsrConfig(), release), "hung", max_queued_s=5, max_events=50)
    stream.feed(np.concatenate([silence(0.2), synthesize("Hello there.")]))

    async def main() -> tuple[bool, list[AsrEvent]]:
        await asyncio.sleep(0.5)  # the worker is now stuck in a decode
        ok = await stream.aclose(timeout=1.0)
        return ok, [e async for e in stream.events()]

    ok, events = asyncio.run(asyncio.wait_for(main(), 10))
    release.set()  # let the worker thread end (its late events go nowhere)
    assert not ok and events[-1].type is EventType.ERROR and "did not finish" in events[-1].text
    assert stream.done and not stream.feed(np.zeros(1920, np.float32))
    stream._thread.join(5)
    assert list(stream) == [] and not stream._thread.is_alive()


def test_aclose_kills_a_hung_worker_process() -> None:
    from kame.asr.process import ProcessStream

    stream = ProcessStream(_hanging_transcriber, "hung-proc", max_queued_s=5, max_events=50)
    assert stream.ready.wait(30)
    stream.feed(np.concatenate([silence(0.2), synthesize("Hello there.")]))

    async def main() -> tuple[bool, list[AsrEvent]]:
        await asyncio.sleep(0.5)  # the worker is now stuck in a decode
        ok = await stream.aclose(timeout=1.0)
        return ok, [e async for e in stream.events()]

    ok, events = asyncio.run(asyncio.wait_for(main(), 20))
    assert not ok and events[-1].type is EventType.ERROR
    stream._receiver.join(5)  # the pump thread reaps the child
    assert stream._proc.exitcode is not None


def test_feed_copies_and_rejects_multichannel_arrays() -> None:
    s = AsrStream("t", max_queued_s=1.0, max_events=10, on_event=None)
    buf = np.ones(1920, np.float32)
    assert s.feed(buf)
    buf[:] = 0  # the caller reuses its buffer
    chunks, _ = s.inbox.take(wait=False)
    assert chunks[0].min() == 1.0
    assert s.feed(np.zeros((1, 1920), np.float32))
    assert s.feed(np.zeros(1920, np.int16))
    with pytest.raises(ValueError, match="mono"):
        s.feed(np.zeros((1920, 2), np.float32))
