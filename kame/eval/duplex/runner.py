"""A folder of samples end to end: stream each (several sessions at once), transcribe, score, report.

Per variant (a set of session settings), each usable sample is streamed at real time (:mod:`.client`),
aligned to the input's clock (:mod:`.align`) and written where the benchmark's own inference and ASR
steps write (``output.wav``, ``output.json``, for v1.5 the clean and input transcripts too; the file
list: docs/evaluation.md), then scored (:mod:`.scoring`, v1.5: :mod:`.overlap`). Nothing else goes
into a sample folder: kame's own results go into the results folder. An ``output.wav`` already there
is kept unless ``overwrite``; ``score_only`` scores the files already there. With an ``out_dir``,
outputs go into ``OUT/VARIANT/SAMPLE/`` with a copy of the sample's inputs and label, so the
benchmark's own scoring runs on each variant's folder unchanged.
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
from kame.eval.duplex.overlap import aggregate_v15, timing
from kame.eval.duplex.report import write_report
from kame.eval.duplex.samples import (
    CLEAN_INPUT,
    LABEL_FILE,
    Sample,
    SampleProblem,
    is_v15,
    load_samples,
    read_wav,
    write_wav,
)
from kame.eval.duplex.scoring import SampleScore, Span, aggregate, score_backchannel, score_sample
from kame.eval.duplex.words import Word, read_words, write_words
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
    behaviour: Any = None  # overlap.BehaviourJudge or None (v1.5)
    results_dir: Path | None = None  # where events/ goes (the results folder)
    overwrite: bool = False
    human: Mapping[str, Sequence[float]] | None = None
    vad: VadConfig = field(default_factory=lambda: VadConfig(kind="webrtc"))
    retries: int = 8
    say: Callable[[str], None] = print


def variant_dir(cfg: DuplexConfig, variant: Variant, sample: Sample) -> Path:
    if cfg.out_dir is None:
        return sample.directory
    d = cfg.out_dir / variant.name / sample.name
    d.mkdir(parents=True, exist_ok=True)
    for name in ("input.wav", CLEAN_INPUT if is_v15(cfg.task) else None, LABEL_FILE[cfg.task]):
        if name and (sample.directory / name).is_file() and not (d / name).exists():
            shutil.copyfile(sample.directory / name, d / name)
    return d


#: (input, output) of each session a sample runs: v1.5 runs its clean input too.
RUNS = (("input.wav", "output.wav"),)
RUNS_V15 = (("input.wav", "output.wav"), (CLEAN_INPUT, "clean_output.wav"))


def runs(task: str) -> tuple[tuple[str, str], ...]:
    return RUNS_V15 if is_v15(task) else RUNS


async def transcribe(asr: Any, pcm: np.ndarray, rate: int, from_s: float = 0.0) -> list[Word]:
    """Word times of ``pcm`` from ``from_s`` on, on its own clock (the part before is not decoded)."""
    start = max(0, round(from_s * rate))
    words = await asr.words_async(pcm[start:], rate)
    return [Word(w.text, w.start_s + start / rate, w.end_s + start / rate) for w in words] if start else words


async def record_run(cfg: DuplexConfig, variant: Variant, sample: Sample, where: Path, src: str, dst: str,
                     gate: asyncio.Semaphore) -> dict[str, Any]:
    """One session on ``src``: ``dst`` (the aligned output) and its transcript; facts about the session.

    An existing ``dst`` is kept unless ``cfg.overwrite`` (its transcript too, if there)."""
    assert cfg.target is not None and cfg.asr is not None
    wav, js = where / dst, where / dst.replace(".wav", ".json")
    pcm_in, rate = read_wav(sample.directory / src)
    facts: dict[str, Any] = {}
    if wav.is_file() and not cfg.overwrite:
        facts["kept"] = True
        if js.is_file():
            return facts
        out, out_rate = read_wav(wav)
    else:
        async with gate:
            got = await _stream_with_retries(cfg, variant, sample, to_wire_rate(pcm_in, rate))
        out, out_rate = align_output(got.chunks, round(pcm_in.size / rate * OUTPUT_RATE), cfg.alignment), OUTPUT_RATE
        write_wav(wav, out, OUTPUT_RATE)
        if got.events and cfg.results_dir is not None:  # /v1/realtime: every non-audio event, session clock
            log_dir = cfg.results_dir / "events" / variant.name
            log_dir.mkdir(parents=True, exist_ok=True)
            name = sample.name + ("" if dst == "output.wav" else "-" + dst.removesuffix(".wav"))
            with open(log_dir / f"{name}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(e) + "\n" for e in got.events)
        facts = {"handshake_s": None if got.handshake_s is None else round(got.handshake_s, 3),
                 "wall_s": round(got.wall_s, 2), "received_s": round(sum(c.size for c in got.chunks) / OUTPUT_RATE, 2)}
    from_s = sample.labels.interrupt_end_s if cfg.task == "user_interruption" else None
    write_words(js, await transcribe(cfg.asr, out, out_rate, from_s or 0.0))
    return facts


async def record_sample(cfg: DuplexConfig, variant: Variant, sample: Sample, where: Path,
                        gate: asyncio.Semaphore | None = None) -> dict[str, Any]:
    """Every session of one sample (at most ``gate``'s sessions at once), then, for v1.5, the inputs'
    transcripts; facts about the (first) session."""
    gate = gate or asyncio.Semaphore(1)
    facts = await asyncio.gather(*[record_run(cfg, variant, sample, where, src, dst, gate)
                                   for src, dst in runs(cfg.task)])
    if is_v15(cfg.task):
        for src in ("input.wav", CLEAN_INPUT):
            js = where / src.replace(".wav", ".json")
            if cfg.overwrite or not js.is_file():
                pcm, rate = read_wav(sample.directory / src)
                write_words(js, await transcribe(cfg.asr, pcm, rate))
    out = dict(facts[0])
    if len(facts) > 1 and "wall_s" in facts[1]:
        out["clean_received_s"] = facts[1]["received_s"]
    return out


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
    if is_v15(cfg.task):
        return score_v15(cfg, sample, where, pcm, rate)
    if cfg.task == "backchannel":
        segs = [Span(s.start_s, s.end_s) for s in speech_segments(_to_24k(pcm, rate), cfg.vad)]
        return score_backchannel(sample.name, words, segs, pcm.size / rate, cfg.human)
    return score_sample(cfg.task, sample.name, words, sample.labels)


V15_TRANSCRIPTS = {"input_clean": "clean_input.json", "input_noisy": "input.json",
                   "output_clean": "clean_output.json", "output_noisy": "output.json"}


def score_v15(cfg: DuplexConfig, sample: Sample, where: Path, out: np.ndarray, out_rate: int) -> SampleScore:
    """Timing from the input's and the output's speech; the four transcripts kept for the behaviour judge."""
    inp, in_rate = read_wav(sample.input_path)
    user = [Span(s.start_s, s.end_s) for s in speech_segments(_to_24k(inp, in_rate), cfg.vad)]
    model = [Span(s.start_s, s.end_s) for s in speech_segments(_to_24k(out, out_rate), cfg.vad)]
    transcripts: dict[str, Any] = {}
    for key, name in V15_TRANSCRIPTS.items():
        try:
            transcripts[key] = json.loads((where / name).read_text(encoding="utf-8"))
            read_words(where / name)  # checks the layout
        except (OSError, ValueError) as exc:
            raise SampleProblem(f"sample {sample.name}: {name} is missing or unusable ({exc}), skipped") from None
    words = read_words(where / "output.json")
    return SampleScore(sample.name, False, None, len(words), " ".join(w.text for w in words),
                       {**timing(user, model), "transcripts": transcripts})


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
        try:
            facts[sample.name] = await record_sample(cfg, variant, sample, where, gate)
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
        if is_v15(cfg.task):
            transcripts = sc.extra.pop("transcripts")
            if cfg.behaviour is not None:
                sc.extra.update(await cfg.behaviour.label(transcripts))
        sc.extra.update(facts.get(s.name, {}))
        scores.append(sc)
    row: dict[str, Any] = {"variant": variant.name, "settings": dict(variant.settings), "task": cfg.task,
                           "dataset": cfg.dataset, "asr": cfg.asr_name, "alignment": cfg.alignment,
                           "wire": "recorded" if cfg.score_only or cfg.target is None else cfg.target.wire}
    if is_v15(cfg.task):
        per = [{"sample": s.name, "words": s.words, "text": s.text, **s.extra} for s in scores]
        row.update(**aggregate_v15(per), per_sample=per, wall_s=round(time.monotonic() - t0, 2))
        cfg.say(f"kame eval duplex: {variant.name}: {cfg.task} on {row['samples']} sample(s): behaviour "
                f"{row['behaviour']}, stop latency {row['stop_latency_mean_s']}, response latency "
                f"{row['response_latency_mean_s']}")
        return row
    row.update(**aggregate(cfg.task, scores), per_sample=[s.as_dict() for s in scores],
               wall_s=round(time.monotonic() - t0, 2))
    cfg.say(f"kame eval duplex: {variant.name}: {cfg.task} on {row['samples']} sample(s): TOR {row['tor']}, "
            f"latency {row['latency_mean_s']}")
    return row


async def run_duplex(cfg: DuplexConfig, results_dir: Path) -> dict[str, Any]:
    """Every variant over the folder's usable samples; ``results.json``, ``.md`` and ``.png`` in ``results_dir``."""
    if cfg.results_dir is None:
        cfg.results_dir = results_dir
    samples, skipped = load_samples(cfg.data_dir, cfg.task)
    for s in skipped:
        cfg.say(f"kame eval duplex: {s}")
    rows = []
    for v in cfg.variants:
        before = len(skipped)
        rows.append(await run_variant(cfg, v, samples, skipped))
        for s in skipped[before:]:
            cfg.say(f"kame eval duplex: {s}")
    judge = getattr(cfg.relevance, "model", None) or getattr(cfg.behaviour, "model", None)
    doc = {"task": cfg.task, "data_dir": str(cfg.data_dir), "dataset": cfg.dataset, "judge": judge,
           "concurrency": cfg.concurrency, "rows": rows, "skipped": skipped}
    write_report(results_dir, doc)
    return doc
