"""``summary.json`` and ``summary.md``: scores by category, latency percentiles, config and versions.

Scores are MT-Bench's: the mean of the judge's 1-10 ratings. Per category
both turns count; ``overall`` is the mean of the category means (the
paper's "avg" column; with equal category sizes and nothing unscored it
equals the mean of all ratings, also given as ``overall_all_turns``).
Unscored turns (no judge, or a judge that never gave a rating) are left
out of the means and counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kame.eval.published import CATEGORIES, CATEGORY_TITLES, PUBLISHED, SOURCE
from kame.stats import percentile

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


def _mean(xs: Sequence[float]) -> float | None:
    return round(sum(xs) / len(xs), 3) if xs else None


def _categories(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = [str(r.get("category")) for r in rows]
    return [c for c in CATEGORIES if c in seen] + sorted({c for c in seen if c not in CATEGORIES})


def score_summary(rows: Sequence[Mapping[str, Any]], judge: str | None) -> dict[str, Any]:
    """Means by category (and by category and turn), overall, and what was left unscored."""
    by_cat: dict[str, float | None] = {}
    by_cat_turn: dict[str, dict[str, float | None]] = {}
    counts: dict[str, int] = {}
    for cat in _categories(rows):
        mine = [r for r in rows if r.get("category") == cat]
        scored = [float(r["score"]) for r in mine if r.get("score") is not None]
        by_cat[cat] = _mean(scored)
        counts[cat] = len(scored)
        turns = sorted({int(r.get("turn", 0)) for r in mine})
        by_cat_turn[cat] = {
            f"turn{t}": _mean([float(r["score"]) for r in mine if r.get("turn") == t and r.get("score") is not None])
            for t in turns
        }
    means = [v for v in by_cat.values() if v is not None]
    all_scores = [float(r["score"]) for r in rows if r.get("score") is not None]
    unscored = sum(1 for r in rows if r.get("score") is None)
    if judge is None and not all_scores:
        note = "no judge configured: scores were not computed (give --judge-model)"
    elif unscored:
        note = f"{unscored} turn(s) unscored (see judge_error in results.jsonl)"
    else:
        note = ""
    return {
        "by_category": by_cat,
        "overall": _mean(means),
        "overall_all_turns": _mean(all_scores),
        "by_category_turn": by_cat_turn,
        "judged": len(all_scores),
        "judged_by_category": counts,
        "unscored": unscored,
        "judge": judge,
        "note": note,
    }


def latency_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and p90 of the per-turn latencies measured on the recordings (None where not measurable)."""
    vals = [float(r["latency_s"]) for r in rows if r.get("latency_s") is not None]
    by_turn: dict[str, Any] = {}
    for t in sorted({int(r.get("turn", 0)) for r in rows}):
        tv = [float(r["latency_s"]) for r in rows if r.get("turn") == t and r.get("latency_s") is not None]
        by_turn[f"turn{t}"] = {"median_s": _round(percentile(tv, 50)), "p90_s": _round(percentile(tv, 90)), "n": len(tv)}
    return {
        "median_s": _round(percentile(vals, 50)),
        "p90_s": _round(percentile(vals, 90)),
        "mean_s": _mean(vals),
        "negative_share": round(sum(1 for v in vals if v < 0) / len(vals), 3) if vals else None,
        "n": len(vals),
        "missing": len(rows) - len(vals),
        "by_turn": by_turn,
        "method": "VAD on the recorded audio: assistant speech start minus user speech end (see docs/evaluation.md)",
    }


def _round(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 3)


def build_summary(
    rows: Sequence[Mapping[str, Any]],
    *,
    config: Mapping[str, Any],
    versions: Mapping[str, Any],
    judge: str | None,
    wall: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "questions": len({str(r.get("question_id")) for r in rows}),
        "turns": len(rows),
        "scores": score_summary(rows, judge),
        "latency": latency_summary(rows),
        "config": dict(config),
        "versions": dict(versions),
        "wall": dict(wall or {}),
        "published": {"source": SOURCE, "rows": [p.__dict__ for p in PUBLISHED]},
    }


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render_markdown(summary: Mapping[str, Any], label: str = "this run") -> str:
    """The paper's table (published rows) with this run's row under it, then the details."""
    scores = summary["scores"]
    lat = summary["latency"]
    cats = list(CATEGORIES) + [c for c in scores["by_category"] if c not in CATEGORIES]
    head: list[str] = ["system", *[str(CATEGORY_TITLES.get(c, c)) for c in cats], "avg", "median latency"]
    lines = [
        "# MT-Bench in speech",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |",
    ]
    for p in PUBLISHED:
        vals = [_fmt(getattr(p, c, None)) for c in cats]
        lines.append(f"| {p.system} (published) | " + " | ".join(vals) + f" | {_fmt(p.average)} | {p.median_latency} |")
    ours: list[str] = [_fmt(scores["by_category"].get(c)) for c in cats]
    median = "–" if lat["median_s"] is None else f"{lat['median_s']:.2f} s"
    lines.append(f"| **{label}** | " + " | ".join(ours) + f" | {_fmt(scores['overall'])} | {median} |")
    lines += ["", f"Published rows: {SOURCE}.", ""]
    if scores.get("note"):
        lines += [f"**Note:** {scores['note']}.", ""]
    cfg = summary.get("config", {})
    lines += [
        "## This run",
        "",
        (f"- questions: {summary['questions']} ({summary['turns']} turns), judged turns: {scores['judged']}, "
         f"unscored: {scores['unscored']}"),
        f"- judge: {scores['judge'] or 'none'}; answer judged: {cfg.get('score_from', 'text')}",
        (f"- latency (VAD on the recordings): median {_fmt(lat['median_s'])} s, p90 {_fmt(lat['p90_s'])} s, "
         f"n = {lat['n']} (not measurable: {lat['missing']}); negative = the assistant started before the user ended"),
    ]
    wall = summary.get("wall") or {}
    if wall:
        lines.append(
            f"- wall time: {_fmt(wall.get('wall_s'), 1)} s for {_fmt(wall.get('audio_s'), 1)} s of session audio at "
            f"concurrency {wall.get('concurrency')} (ideal {_fmt(wall.get('ideal_s'), 1)} s, overhead "
            f"{_fmt(wall.get('overhead_pct'), 1)} %)"
        )
    settings = cfg.get("settings") or {}
    if settings:
        lines.append("- session settings: " + ", ".join(f"`{k}={v}`" for k, v in sorted(settings.items())))
    lines.append(f"- server: {cfg.get('server', '?')}")
    versions = summary.get("versions", {})
    for side in ("server", "local"):
        v = versions.get(side)
        if isinstance(v, Mapping) and v:
            lines.append(f"- {side} versions: " + ", ".join(f"{k} {val}" for k, val in sorted(v.items())))
    lines += [
        "",
        ("Scores come from an LLM judge and are only meaningful with the real weights and a GPT-4-class judge; "
         "a tiny random model (the CPU demo) babbles."),
        "",
    ]
    return "\n".join(lines)


def write_summary(directory: Path, summary: Mapping[str, Any], label: str = "this run") -> None:
    directory = Path(directory)
    (directory / SUMMARY_JSON).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (directory / SUMMARY_MD).write_text(render_markdown(summary, label), encoding="utf-8")
