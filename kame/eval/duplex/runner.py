"""A folder of samples end to end: stream each (several sessions at once), transcribe, score, report.

Per variant (a set of session settings: the oracle on or off, an
answer-switch policy), every usable sample is streamed at real time
(:mod:`.client`), its output aligned to the input's clock (:mod:`.align`)
and written as ``output.wav`` (24 kHz, as long as the input) and
``output.json`` (word times from :mod:`.asr`); then every sample is scored
from those two files (:mod:`.scoring`), exactly as the benchmark's scripts
read them. ``score_only`` skips the streaming and scores the files already
there (outputs recorded by any client).

Outputs go into each sample's own folder (as the benchmark's clients
write them) when there is one variant and no ``out_dir``; with an
``out_dir`` they go into ``OUT/VARIANT/SAMPLE/`` together with a copy of
the sample's input and label, so the benchmark's own scoring runs on each
variant's folder unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.eval.duplex.align import align_output
from kame.eval.duplex.client import SampleSessionError, Target, stream_sample, to_wire_rate
from kame.eval.duplex.report import write_report
from kame.eval.duplex.samples import LABEL_FILE, Sample, SampleProblem, load_samples, read_wav, write_wav
from kame.eval.duplex.scoring import SampleScore, Span, aggregate, score_backchannel, score_sample
from kame.eval.duplex.words import read_words, write_words
from kame.eval.vad import VadConfig, speech_segments

log = logging.getLogger(__name__)
OUTPUT_RATE = SAMPLE_RATE


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a name and the ``kame`` session settings it sends."""

    name: str
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class DuplexConfig:
    task: str
    data_dir: Path
    variants: Sequence[Variant]
    dataset: str
    alignment: str = "arrival"
    concurrency: int = 1
    target: Target | None = None
    out_dir: Path | None = None
    score_only: bool = False
    asr: Any = None  # WordAsr (needed unless score_only)
    asr_name: str = "faster-whisper tiny.en (bundled)"
    relevance: Any = None  # RelevanceJudge or None
    human: Mapping[str, Sequence[float]] | None = None
    vad: VadConfig = field(default_factory=lambda: VadConfig(kind="webrtc"))
    retries: int = 8
    say: Callable[[str], None] = print


def variant_dir(cfg: DuplexConfig, variant: Variant, sample: Sample) -> Path:
    if cfg.out_dir is None:
        return sample.directory
    d = cfg.out_dir / variant.name / sample.name
    d.mkdir(parents=True, exist_ok=True)
    for name in ("input.wav", LABEL_FILE[cfg.task]):
        if name and (sample.directory / name).is_file() and not (d / name).exists():
            shutil.copyfile(sample.directory / name, d / name)
    return d


async def record_sample(cfg: DuplexConfig, variant: Variant, sample: Sample, where: Path) -> dict[str, Any]:
    """Stream one sample, write ``output.wav`` and ``output.json``; facts about the session."""
    assert cfg.target is not None and cfg.asr is not None
    pcm16, rate = read_wav(sample.input_path)
    pcm = to_wire_rate(pcm16, rate)
    got = await _stream_with_retries(cfg, variant, sample, pcm)
    out = align_output(got.chunks, round(sample.input_s * OUTPUT_RATE), cfg.alignment)
    write_wav(where / "output.wav", out, OUTPUT_RATE)
    words = await cfg.asr.words_async(out, OUTPUT_RATE)
    write_words(where / "output.json", words)
    if got.events:  # /v1/realtime: every non-audio event (kame.oracle.*, transcripts), on the session's clock
        with open(where / "events.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(e) + "\n" for e in got.events)
    return {"handshake_s": None if got.handshake_s is None else round(got.handshake_s, 3),
            "wall_s": round(got.wall_s, 2), "received_s": round(sum(c.size for c in got.chunks) / OUTPUT_RATE, 2)}


async def _stream_with_retries(cfg: DuplexConfig, variant: Variant, sample: Sample, pcm: np.ndarray) -> Any:
    """A refused or drained session (1013, 1001, HTTP 503) is tried again from the sample's start,
    with back-off and jitter, up to ``cfg.retries`` times in a row."""
    from kame.client.reconnect import Backoff, Retrier

    assert cfg.target is not None
    retrier = Retrier(Backoff(attempts=cfg.retries), say=lambda m: cfg.say(f"  {variant.name} {sample.name}: {m}"))
    while True:
        try:
            return await stream_sample(cfg.target, pcm, variant.settings)
        except SampleSessionError as exc:
            if exc.retry_reason is None or not await retrier.wait(f"{exc.retry_reason}: {exc}"):
                raise


def score_folder(cfg: DuplexConfig, sample: Sample, where: Path) -> SampleScore:
    """Score the output files in ``where``; :class:`SampleProblem` (one sentence) when they are unusable."""
    wav, js = where / "output.wav", where / "output.json"
    if not js.is_file():
        raise SampleProblem(f"sample {sample.name}: no output.json, skipped")
    if not wav.is_file():
        raise SampleProblem(f"sample {sample.name}: no output.wav, skipped")
    try:
        words = read_words(js)
    except (OSError, ValueError) as exc:
        raise SampleProblem(f"sample {sample.name}: output.json is unusable ({exc}), skipped") from None
    try:
        pcm, rate = read_wav(wav)
    except Exception as exc:  # noqa: BLE001 - wave.Error, EOFError, ValueError
        raise SampleProblem(f"sample {sample.name}: output.wav is not a readable WAV ({exc}), skipped") from None
    if pcm.size == 0:
        raise SampleProblem(f"sample {sample.name}: output.wav is empty (no audio came back), skipped")
    if cfg.task == "backchannel":
        segs = [Span(s.start_s, s.end_s) for s in speech_segments(_to_24k(pcm, rate), cfg.vad)]
        return score_backchannel(sample.name, words, segs, pcm.size / rate, cfg.human)
    return score_sample(cfg.task, sample.name, words, sample.labels)


def _to_24k(pcm: np.ndarray, rate: int) -> np.ndarray:
    if rate == SAMPLE_RATE:
        return pcm
    import soxr

    return np.asarray(soxr.resample(pcm, rate, SAMPLE_RATE, quality="HQ"), np.float32)


async def run_variant(cfg: DuplexConfig, variant: Variant, samples: Sequence[Sample],
                      skipped: list[str]) -> dict[str, Any]:
    """One variant over every sample: the row of the table (with its per-sample scores)."""
    t0 = time.monotonic()
    gate = asyncio.Semaphore(max(1, cfg.concurrency))
    facts: dict[str, dict[str, Any]] = {}
    failed: list[str] = []

    async def one(sample: Sample) -> None:
        where = variant_dir(cfg, variant, sample)
        if cfg.score_only:
            return
        async with gate:
            try:
                facts[sample.name] = await record_sample(cfg, variant, sample, where)
            except SampleSessionError as exc:
                failed.append(sample.name)
                skipped.append(f"{variant.name}: sample {sample.name}: {exc}, skipped")

    await asyncio.gather(*[one(s) for s in samples])
    scores: list[SampleScore] = []
    for s in samples:
        if s.name in failed:
            continue
        try:
            sc = score_folder(cfg, s, variant_dir(cfg, variant, s))
        except SampleProblem as exc:
            skipped.append(f"{variant.name}: {exc}")
            continue
        if cfg.task == "user_interruption" and cfg.relevance is not None and sc.take_over:
            sc.extra.update(await cfg.relevance.rate(s.labels.context, s.labels.interrupt, sc.text))
        sc.extra.update(facts.get(s.name, {}))
        scores.append(sc)
    row = {"variant": variant.name, "settings": dict(variant.settings), "task": cfg.task, "dataset": cfg.dataset,
           "asr": cfg.asr_name, "alignment": cfg.alignment,
           "wire": "recorded" if cfg.score_only or cfg.target is None else cfg.target.wire,
           **aggregate(cfg.task, scores), "per_sample": [s.as_dict() for s in scores],
           "wall_s": round(time.monotonic() - t0, 2)}
    cfg.say(f"kame eval duplex: {variant.name}: {cfg.task} on {row['samples']} sample(s): TOR {row['tor']}, "
            f"latency {row['latency_mean_s']}")
    return row


async def run_duplex(cfg: DuplexConfig, results_dir: Path) -> dict[str, Any]:
    """Every variant over the folder's usable samples; ``results.json``, ``.md`` and ``.png`` in ``results_dir``."""
    samples, skipped = load_samples(cfg.data_dir, cfg.task)
    for s in skipped:
        cfg.say(f"kame eval duplex: {s}")
    rows = []
    for v in cfg.variants:
        before = len(skipped)
        rows.append(await run_variant(cfg, v, samples, skipped))
        for s in skipped[before:]:
            cfg.say(f"kame eval duplex: {s}")
    judge = getattr(cfg.relevance, "model", None)
    doc = {"task": cfg.task, "data_dir": str(cfg.data_dir), "dataset": cfg.dataset, "judge": judge,
           "concurrency": cfg.concurrency, "rows": rows, "skipped": skipped}
    write_report(results_dir, doc)
    return doc
