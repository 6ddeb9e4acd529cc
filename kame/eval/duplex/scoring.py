"""Full-Duplex-Bench v1's metrics, as its released scoring code computes them. Pure functions.

Take-over, TOR, latency, relevance (:mod:`.relevance`) and the backchannel frequency and JSD follow
the benchmark's scoring code, quirks kept, where it and the paper differ (``user_interruption``
counts only words that start after the interruption ends; the last backchannel segment's verdict
stands). The exact rules: docs/evaluation.md, "The metrics, exactly". Human backchannel timing is
the user's to supply (:func:`load_human_timing`).

Per task: TOR is the mean over samples; latency the mean over take-overs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kame.eval.duplex.samples import Labels
from kame.eval.duplex.words import Word

MIN_TURN_S = 1.0
MAX_BACKCHANNEL_WORDS = 3
BACKCHANNEL_MAX_S = 3.0
JSD_WINDOW_S = 0.2
JSD_EPS = 1e-10


def took_over(words: Sequence[Word]) -> bool:
    """The benchmark's take-over: at least 1 s of words, or more than 3 words."""
    if not words:
        return False
    duration = words[-1].end_s - words[0].start_s
    return duration >= MIN_TURN_S or len(words) > MAX_BACKCHANNEL_WORDS


@dataclass(frozen=True)
class SampleScore:
    """One sample's outcome (``latency_s`` None without a take-over)."""

    name: str
    take_over: bool
    latency_s: float | None = None
    words: int = 0
    text: str = ""  # the words scored (for the interruption: after its end)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"sample": self.name, "take_over": self.take_over, "latency_s": self.latency_s,
                "words": self.words, "text": self.text, **self.extra}


def _latency(first_start_s: float, reference_s: float) -> float:
    return round(max(0.0, first_start_s - reference_s), 3)


def score_pause(name: str, words: Sequence[Word]) -> SampleScore:
    return SampleScore(name, took_over(words), None, len(words), " ".join(w.text for w in words))


def score_turn_taking(name: str, words: Sequence[Word], labels: Labels) -> SampleScore:
    assert labels.turn_end_s is not None
    tor = took_over(words)
    latency = _latency(words[0].start_s, labels.turn_end_s) if tor else None
    return SampleScore(name, tor, latency, len(words), " ".join(w.text for w in words))


def after_interruption(words: Sequence[Word], end_s: float) -> list[Word]:
    """The words the interruption task scores: those starting at or after its end, times offset to it."""
    return [Word(w.text, w.start_s - end_s, w.end_s - end_s) for w in words if w.start_s >= end_s]


def score_interruption(name: str, words: Sequence[Word], labels: Labels) -> SampleScore:
    assert labels.interrupt_end_s is not None
    after = after_interruption(words, labels.interrupt_end_s)
    tor = took_over(after)
    latency = _latency(after[0].start_s, 0.0) if tor else None
    return SampleScore(name, tor, latency, len(after), " ".join(w.text for w in after))


@dataclass(frozen=True)
class Span:
    start_s: float
    end_s: float


def _words_in(words: Sequence[Word], seg: Span) -> list[Word]:
    """Words overlapping the segment (inside it, or across either of its edges)."""
    out = []
    for w in words:
        inside = w.start_s >= seg.start_s and w.end_s <= seg.end_s
        across_end = w.start_s <= seg.end_s < w.end_s
        across_start = w.start_s <= seg.start_s < w.end_s
        if inside or across_end or across_start:
            out.append(w)
    return out


def backchannels(segments: Sequence[Span], words: Sequence[Word]) -> tuple[bool, list[Span]]:
    """(take-over, the segments counted as backchannels), by the scoring code's rules."""
    tor = False
    found: list[Span] = []
    for seg in segments:
        duration = seg.end_s - seg.start_s
        if duration > BACKCHANNEL_MAX_S:
            return True, found
        n = len(_words_in(words, seg))
        tor = n > MAX_BACKCHANNEL_WORDS or not (duration < MIN_TURN_S and n <= 2)
        found.append(seg)
    return tor, found


def timing_histogram(spans: Sequence[Span], duration_s: float) -> np.ndarray:
    """Backchannel counts per 0.2 s window (a span counts in every window it touches), normalised."""
    counts = np.zeros(int(duration_s / JSD_WINDOW_S) + 1)
    for s in spans:
        a, b = int(s.start_s / JSD_WINDOW_S), int(s.end_s / JSD_WINDOW_S)
        counts[a : min(b, len(counts) - 1) + 1] += 1
    smoothed: np.ndarray = counts + JSD_EPS
    return smoothed / smoothed.sum()


def js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon distance (natural log; sqrt of the divergence), both normalised first."""
    p = np.asarray(p, float) / np.sum(p)
    q = np.asarray(q, float) / np.sum(q)
    m = (p + q) / 2

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log(a[nz] / b[nz])))

    return math.sqrt(max(0.0, (kl(p, m) + kl(q, m)) / 2))


def resample_linear(dist: Sequence[float], n: int) -> np.ndarray:
    """The human distribution stretched to ``n`` points (linear interpolation over [0, 1])."""
    x = np.asarray(dist, float)
    if len(x) == 1:
        return np.full(n, x[0])
    return np.interp(np.linspace(0, 1, n), np.linspace(0, 1, len(x)), x)


def load_human_timing(path: Path) -> dict[str, list[float]]:
    """The benchmark's human backchannel timing (a JSON object: sample name -> distribution), read from a
    path the user supplies; kame never bundles it (non-commercial licence)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise ValueError(f"{path}: expected a JSON object of sample name -> list of numbers")
    return {str(k): [float(x) for x in v] for k, v in data.items()}


def human_for(name: str, human: Mapping[str, Sequence[float]]) -> Sequence[float] | None:
    """The human distribution of a sample: by its name, else by its number - 1 (the released folders
    count from 1, the distribution from 0), else the first one, as the scoring code falls back."""
    if name in human:
        return human[name]
    digits = "".join(c for c in name if c.isdigit())
    if digits and str(int(digits) - 1) in human:
        return human[str(int(digits) - 1)]
    return human.get("0")


def score_backchannel(name: str, words: Sequence[Word], segments: Sequence[Span], duration_s: float,
                      human: Mapping[str, Sequence[float]] | None) -> SampleScore:
    tor, found = backchannels(segments, words)
    freq = len(found) / duration_s if duration_s > 0 else 0.0
    jsd: float | None = None
    if human is not None:
        ref = human_for(name, human)
        if not found:
            jsd = 1.0
        elif ref is not None:
            hist = timing_histogram(found, duration_s)
            jsd = round(js_distance(hist, resample_linear(ref, len(hist))), 4)
    extra = {"backchannels": len(found), "frequency_hz": round(freq, 4), "jsd": jsd,
             "segments": [[round(s.start_s, 3), round(s.end_s, 3)] for s in found]}
    return SampleScore(name, tor, None, len(words), " ".join(w.text for w in words), extra)


def score_sample(task: str, name: str, words: Sequence[Word], labels: Labels) -> SampleScore:
    """The timing metrics of one sample of a task other than backchannel."""
    if task == "pause_handling":
        return score_pause(name, words)
    if task == "smooth_turn_taking":
        return score_turn_taking(name, words, labels)
    if task == "user_interruption":
        return score_interruption(name, words, labels)
    raise ValueError(f"score_sample: {task} needs score_backchannel")


def mean(xs: Sequence[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def aggregate(task: str, scores: Sequence[SampleScore]) -> dict[str, Any]:
    """Per task: TOR (mean over samples), latency mean over take-overs, and the task's extras."""
    lat = [s.latency_s for s in scores if s.latency_s is not None]
    out: dict[str, Any] = {
        "samples": len(scores),
        "tor": mean([1.0 if s.take_over else 0.0 for s in scores]),
        "latency_mean_s": mean(lat) if task in ("smooth_turn_taking", "user_interruption") else None,
    }
    if task == "user_interruption":
        ratings = [s.extra["relevance"] for s in scores if s.extra.get("relevance") is not None]
        out["relevance_mean"] = mean(ratings)
        out["rated"] = len(ratings)
    if task == "backchannel":
        out["frequency_hz_mean"] = mean([s.extra["frequency_hz"] for s in scores])
        jsd = [s.extra["jsd"] for s in scores if s.extra.get("jsd") is not None]
        out["jsd_mean"] = mean(jsd)
    return out
