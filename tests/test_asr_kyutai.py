"""Kyutai STT path on a tiny random STT-shaped checkpoint in the real on-disk format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kame.asr.config import AsrConfig
from kame.asr.events import EventType
from kame.asr.kyutai_core import SttCore
from kame.asr.kyutai_turns import SttTurns
from kame.frontend.checkpoint import resolve_checkpoint
from kame.frontend.loading import load_mimi


@pytest.fixture(scope="module")
def stt_ckpt(kame_cache_dir: Path) -> Path:
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0, stt=True)


def test_stt_checkpoint_layout(stt_ckpt: Path) -> None:
    cfg = json.loads((stt_ckpt / "config.json").read_text())
    assert cfg["dep_q"] == 0 and cfg["n_q"] == 32 and set(cfg["delays"]) == {0}
    assert "stt_config" in cfg


def test_core_steps_slots_independently(stt_ckpt: Path) -> None:
    core = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 2)
    assert core.delay_frames == round(0.5 * 12.5)
    rng = np.random.default_rng(0)
    frames = [(0.1 * rng.standard_normal(1920)).astype(np.float32) for _ in range(8)]
    core.attach(0)
    core.attach(1)
    both = [core.step_pcm({0: f, 1: f}) for f in frames]
    assert all(set(o) == {0, 1} for o in both)
    assert all(o[0].text_id == o[1].text_id for o in both)  # same input, greedy: same text
    assert all(o[0].end_prob is not None and 0.0 <= o[0].end_prob <= 1.0 for o in both)
    solo = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 2)
    solo.attach(1)
    ref = [solo.step_pcm({1: f})[1].text_id for f in frames]
    assert [o[1].text_id for o in both] == ref


def test_shared_mimi_codes_equal_separate_encodes(stt_ckpt: Path, tiny_kame_ckpt: Path) -> None:
    """One 32-codebook encode serves both: its first 8 codes are the front-end's encode,
    and stepping the STT with them equals stepping it with its own encode."""
    front = load_mimi(resolve_checkpoint(str(tiny_kame_ckpt)), "cpu", 8)
    shared = load_mimi(resolve_checkpoint(str(tiny_kame_ckpt)), "cpu", 32)
    stt_own = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 1)
    stt_fed = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 1, own_mimi=False)
    stt_own.attach(0)
    stt_fed.attach(0)
    rng = np.random.default_rng(1)
    with torch.no_grad():
        front.streaming_forever(1)
        shared.streaming_forever(1)
        for _ in range(6):
            pcm = torch.from_numpy((0.1 * rng.standard_normal(1920)).astype(np.float32))[None, None]
            c32 = shared.encode(pcm)
            c8 = front.encode(pcm)
            assert torch.equal(c32[:, :8], c8)
            a = stt_own.step_pcm({0: pcm[0, 0].numpy()})[0]
            b = stt_fed.step_codes(c32, torch.tensor([True]))[0]
            assert a == b


def test_turns_rebuild_words_and_end_turns() -> None:
    pieces = {10: "▁hel", 11: "lo", 12: "▁there", 13: "▁again"}
    turns = SttTurns(lambda i: pieces.get(i, ""), silence_frames=3, eot_threshold=0.5, eot_frames=2)
    evs = []
    for tok, p in [(3, 0.0), (10, 0.0), (11, 0.0), (3, 0.0), (12, 0.0), (3, 0.9), (3, 0.9), (13, 0.0), (3, 0.0), (3, 0.0), (3, 0.0)]:
        evs += turns.feed(tok, p)
    kinds = [e.type for e in evs]
    assert kinds[0] is EventType.SPEECH_STARTED
    partials = [e.text for e in evs if e.type is EventType.PARTIAL]
    assert partials[:3] == ["hel", "hello", "hello there"]
    finals = [e.text for e in evs if e.type is EventType.FINAL]
    assert finals == ["hello there", "again"]  # end-of-turn head, then silence
    assert [e.utterance for e in evs if e.type is EventType.FINAL] == [0, 1]


def test_recognizer_streams_and_flushes(stt_ckpt: Path) -> None:
    from kame.asr.kyutai_recognizer import KyutaiRecognizer

    cfg = AsrConfig(kind="kyutai", model=str(stt_ckpt), device="cpu")
    rec = KyutaiRecognizer(cfg, batch_size=2)
    try:
        streams = [rec.open_stream(), rec.open_stream()]
        rng = np.random.default_rng(2)
        for s in streams:
            s.feed((0.1 * rng.standard_normal(1920 * 10 + 500)).astype(np.float32))
            s.close()
        for s in streams:
            assert s.join(30)
            events = list(s)
            assert all(e.type is not EventType.ERROR for e in events)
        third = rec.open_stream()  # slots are reused after close
        third.close()
        assert third.join(30) and third.error is None
    finally:
        rec.close()


def test_engine_with_shared_stt_encodes_once(stt_ckpt: Path, tiny_kame_ckpt: Path) -> None:
    """In one engine tick the front-end and the STT share one 32-codebook encode: the
    front-end's output equals an 8-codebook engine, the STT's equals its own-Mimi run."""
    from kame.frontend.config import FrontendConfig, SamplingConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2, sampling=SamplingConfig(use_sampling=False))
    stt = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 2, own_mimi=False)
    shared = EngineCore(load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32), cfg, stt=stt)
    plain = EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
    own = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 2)
    for core in (shared, plain):
        core.attach(1)
    shared.stt_attach(1)
    own.attach(1)
    for _ in range(own.silence_prefix_frames):
        own.step_pcm({1: np.zeros(1920, np.float32)})
    rng = np.random.default_rng(3)
    for i in range(10):
        f = (0.1 * rng.standard_normal(1920)).astype(np.float32)
        a, b = shared.tick({1: f})[1], plain.tick({1: f})[1]
        assert a.text_id == b.text_id and np.array_equal(a.pcm, b.pcm)
        assert a.stt == own.step_pcm({1: f})[1]
        if i == 0:  # the engine's Mimi follows Moshi's first-frame rule: so does the reference here
            assert own.mimi is not None
            own.mimi.reset_streaming(torch.tensor([False, True]))
            own._mimi_mask = None


def test_shared_stt_through_the_pipeline_matches_standalone(stt_ckpt: Path, tiny_kame_ckpt: Path) -> None:
    """A session's pipeline on an engine with a shared STT gets the same ASR events as the
    standalone recogniser on the same audio, and leaving it flushes the last turn (an engine command)."""
    import asyncio

    from kame.asr.kyutai_shared import SharedKyutaiAsr
    from kame.frontend.config import FrontendConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.engine_thread import EngineThread
    from kame.frontend.models import load_frontend
    from kame.oracle.config import OracleConfig
    from kame.session.events import AssistantFrame, PipelineEvent
    from kame.session.root import SessionRoot

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2)
    stt = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 2, own_mimi=False)
    eng = EngineThread(EngineCore(load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32), cfg, stt=stt))
    eng.start()
    asr_cfg = AsrConfig(kind="kyutai", model=str(stt_ckpt), device="cpu")
    shared = SharedKyutaiAsr(asr_cfg, stt.piece_of, delay_frames=stt.delay_frames, vocab=stt.vocab)
    root = SessionRoot(engine=eng, oracle_config=OracleConfig(), registry=None, recognizer=shared,
                       encode=lambda text: [], piece_of=None)
    rng = np.random.default_rng(5)
    audio = (0.2 * rng.standard_normal(1920 * 30)).astype(np.float32)

    async def session() -> list[PipelineEvent]:
        events: list[PipelineEvent] = []
        async with root.pipeline() as pipeline:
            for i in range(30):
                pipeline.feed(audio[i * 1920 : (i + 1) * 1920])
                while True:
                    event = await asyncio.wait_for(pipeline.next_event(), 5)
                    if not isinstance(event, AssistantFrame):
                        events.append(event)
                    elif event.step == i:
                        break
        await asyncio.sleep(0.05)
        while not pipeline._events.empty():  # what the flush at the end produced
            event = pipeline._events.get_nowait()
            if not isinstance(event, AssistantFrame):
                events.append(event)
        return events

    try:
        got = asyncio.run(session())
    finally:
        eng.stop()
    from kame.asr.kyutai_recognizer import KyutaiTranscriber

    ref = KyutaiTranscriber(SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 1), asr_cfg)
    # the shared engine's Mimi follows Moshi's first-frame rule (reset after the first encode): so here
    ems = ref.push(audio[:1920])
    assert ref.core.mimi is not None
    ref.core.mimi.reset_streaming()
    ref.core._mimi_mask = None
    ems += ref.push(audio[1920:]) + ref.finish()
    want = [(e.type.value, e.text) for e in ems]
    have = [(e.name.removeprefix("asr."), getattr(e, "text", "")) for e in got if e.name.startswith("asr.")]
    assert want, "the tiny STT produced no events at all"
    assert have == want


# --- Kyutai STT as Kyutai runs it: silence prefix, end-of-turn heads, slots ----------------


@pytest.fixture(scope="module")
def stt_prefix_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny STT whose stt_config asks for 1.0 s of silence first (like kyutai/stt-2.6b-en)."""
    from kame.frontend.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("stt-prefix") / "ck", seed=0, stt=True, silence_prefix_s=1.0)


def test_silence_prefix_is_rounded_up() -> None:
    from kame.asr.kyutai_core import silence_prefix_frames

    assert [silence_prefix_frames(s) for s in (0.0, 0.08, 0.5, 1.0, 2.5)] == [0, 1, 7, 13, 32]


def test_tiny_stt_with_one_second_prefix(stt_prefix_ckpt: Path) -> None:
    from kame.asr.kyutai_recognizer import KyutaiRecognizer

    core = SttCore.from_spec(str(stt_prefix_ckpt), torch.device("cpu"), 1)
    assert core.silence_prefix_s == 1.0 and core.silence_prefix_frames == 13
    rec = KyutaiRecognizer(AsrConfig(kind="kyutai", model=str(stt_prefix_ckpt), device="cpu"))
    try:
        tr = rec.new_transcriber()
        steps: list[int] = []
        real_step = tr.core.step_pcm

        def counting(frames):  # type: ignore[no-untyped-def]
            steps.append(int(np.abs(next(iter(frames.values()))).max() > 0))
            return real_step(frames)

        tr.core.step_pcm = counting  # type: ignore[method-assign]
        tr.push((0.1 * np.random.default_rng(0).standard_normal(1920 * 3)).astype(np.float32))
        assert steps == [0] * 13 + [1] * 3  # 13 frames of silence, then the audio
    finally:
        rec.close()


def test_stt_without_end_of_turn_heads_warns(stt_ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "no-heads"
    shutil.copytree(stt_ckpt, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("extra_heads_num_heads")
    cfg.pop("extra_heads_dim")
    (d / "config.json").write_text(json.dumps(cfg))
    state = {k: v for k, v in load_file(str(d / "model.safetensors")).items() if not k.startswith("extra_heads.")}
    save_file(state, str(d / "model.safetensors"))
    with caplog.at_level("WARNING", logger="kame.asr.kyutai_core"):
        core = SttCore.from_spec(str(d), torch.device("cpu"), 1)
        SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 1)  # has the heads: no warning
    assert core.eot_head is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "no end-of-turn heads" in line and "fall back to silence" in line


def test_default_kyutai_model_has_end_of_turn_heads() -> None:
    from kame.asr.kyutai_recognizer import DEFAULT_MODEL

    assert DEFAULT_MODEL == "kyutai/stt-1b-en_fr-candle"


def test_own_engine_stt_gets_the_sessions_it_is_asked_for(stt_ckpt: Path) -> None:
    from kame.asr.factory import create_recognizer

    rec = create_recognizer(AsrConfig(kind="kyutai", model=str(stt_ckpt), device="cpu"), sessions=11)
    try:
        assert rec is not None and rec.core.batch_size == 11  # type: ignore[attr-defined]
        streams = [rec.open_stream() for _ in range(12)]
        assert [s.error is None for s in streams] == [True] * 11 + [False]
        for s in streams:
            s.close()
    finally:
        rec.close()


def test_shared_engine_prefix_costs_other_slots_no_frame(stt_prefix_ckpt: Path, tiny_kame_ckpt: Path) -> None:
    """A session joining a shared STT with a 1 s prefix: one STT step per tick, the other slot's
    cadence untouched, and the joining slot's STT sees 13 frames of silence, then its audio."""
    from kame.frontend.config import FrontendConfig, SamplingConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2, sampling=SamplingConfig(use_sampling=False))
    stt = SttCore.from_spec(str(stt_prefix_ckpt), torch.device("cpu"), 2, own_mimi=False)
    core = EngineCore(load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32), cfg, stt=stt)
    assert core.stt_lag_frames == 13
    fed: list[tuple[torch.Tensor, torch.Tensor]] = []
    encoded: list[torch.Tensor] = []
    real_step, real_encode = stt.step_device, core.mimi.encode

    def step_device(codes, mask):  # type: ignore[no-untyped-def]
        fed.append((codes.clone(), mask.clone()))
        return real_step(codes, mask)

    def encode(pcm):  # type: ignore[no-untyped-def]
        out = real_encode(pcm)
        encoded.append(out.clone())
        return out

    stt.step_device = step_device  # type: ignore[method-assign]
    core.mimi.encode = encode
    rng = np.random.default_rng(5)

    def frame() -> np.ndarray:
        return (0.1 * rng.standard_normal(1920)).astype(np.float32)

    core.attach(0)
    core.stt_attach(0)
    for _ in range(4):
        core.tick({0: frame()})
    before = len(fed)
    core.attach(1)
    core.stt_attach(1)
    assert len(fed) == before  # joining stepped nothing
    per_tick: list[int] = []
    for _ in range(20):
        n = len(fed)
        out = core.tick({0: frame(), 1: frame()})
        per_tick.append(len(fed) - n)
        assert out[0].stt is not None and out[1].stt is not None  # slot 0 got its frame in every tick
    assert per_tick == [1] * 20
    joined = fed[before:]
    silence = core._stt_silence
    assert silence is not None
    for i, (codes, mask) in enumerate(joined):
        assert bool(mask[1]) and bool(mask[0])
        want = silence[0, :, i : i + 1] if i < 13 else encoded[4 + i - 13][1]
        assert torch.equal(codes[1], want), i
    # slot 0 joined 4 ticks earlier: its STT input is its own audio, 13 frames late
    assert torch.equal(joined[15][0][0], encoded[4 + 15 - 13][0])

    # wall time: a join costs less than one tick (stepping the 13 prefix frames at once would cost
    # 13 STT steps while every other slot waits); the best of three joins against the median tick
    import statistics
    import time

    ticks, joins = [], []
    for _ in range(3):
        core.detach(1)  # (drops the slot's STT lag too)
        core.attach(1)
        t0 = time.perf_counter()
        core.stt_attach(1)
        joins.append(time.perf_counter() - t0)
        for _ in range(5):
            t0 = time.perf_counter()
            core.tick({0: frame(), 1: frame()})
            ticks.append(time.perf_counter() - t0)
    print(f"shared STT join {min(joins) * 1e3:.2f} ms (best of 3), tick median {statistics.median(ticks) * 1e3:.2f} ms")
    assert min(joins) < statistics.median(ticks)
