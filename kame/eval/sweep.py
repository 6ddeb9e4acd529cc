"""``--sweep KEY=V1,V2,...``: one run of the set per value, and the latency-vs-score curve.

Each value is applied through the ``kame`` object of ``session.update``
(``docs/protocol.md`` 3.2), so the same server serves every point. Values
are checked here against the same ranges the server enforces, so a typo
fails before any audio is spent. Each point is a complete run directory
(``DIR/KEY=VALUE/``, resumable on its own); ``sweep.json``, ``sweep.md``
and ``sweep.png`` gather them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kame.errors import UserError
from kame.eval.published import PUBLISHED
from kame.session.settings import ORACLE_POLICIES

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
SWEEP_PNG = "sweep.png"

POLICIES = ORACLE_POLICIES


def _float_in(lo: float, hi: float) -> Callable[[str], float]:
    def conv(text: str) -> float:
        value = float(text)
        if not lo <= value <= hi:
            raise ValueError(f"must be within {lo:g}-{hi:g}")
        return value

    return conv


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def conv(text: str) -> int:
        value = int(text)
        if not lo <= value <= hi:
            raise ValueError(f"must be within {lo}-{hi}")
        return value

    return conv


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def conv(text: str) -> str:
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return text

    return conv


def _name(text: str) -> str:
    if not text or any(c in text for c in "/\\ "):
        raise ValueError("expected a back-end name")
    return text


def converters() -> dict[str, Callable[[str], Any]]:
    """The ``kame`` session settings a sweep may vary, with their value checks."""
    return {
        "oracle_delay_s": _float_in(0.0, 10.0),
        "oracle_policy": _choice(POLICIES),
        "backend": _name,
        "barge_in": _choice(("keep", "clear")),
        "text_temperature": _float_in(0.0, 10.0),
        "text_topk": _int_in(1, 100000),
    }


@dataclass(frozen=True)
class SweepPoint:
    key: str
    text: str  # the value as written on the command line (names the directory)
    value: Any

    @property
    def dirname(self) -> str:
        return f"{self.key}={self.text}"


@dataclass(frozen=True)
class Sweep:
    key: str
    points: tuple[SweepPoint, ...]


def parse_sweep(spec: str) -> Sweep:
    """``oracle_delay_s=0,0.5,1`` -> a :class:`Sweep`; a UserError names what is wrong."""
    key, sep, values = spec.partition("=")
    key = key.strip()
    conv = converters()
    if not sep or not key:
        raise UserError(f"--sweep {spec!r}: expected KEY=V1,V2,...")
    if key not in conv:
        raise UserError(f"--sweep {spec!r}: unknown key {key!r} (known: {', '.join(sorted(conv))})")
    texts = [v.strip() for v in values.split(",")]
    if not texts or any(not t for t in texts):
        raise UserError(f"--sweep {spec!r}: empty value")
    if len(set(texts)) != len(texts):
        raise UserError(f"--sweep {spec!r}: a value is repeated")
    points = []
    for t in texts:
        try:
            points.append(SweepPoint(key, t, conv[key](t)))
        except ValueError as exc:
            raise UserError(f"--sweep {key}={t}: {exc}") from None
    return Sweep(key, tuple(points))


def sweep_rows(sweep: Sweep, summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per point (in sweep order) from each point's summary, keyed by directory name."""
    rows = []
    for p in sweep.points:
        s = summaries.get(p.dirname)
        if s is None:
            continue
        rows.append(
            {
                "key": p.key,
                "value": p.value,
                "dir": p.dirname,
                "score": s["scores"]["overall"],
                "scores": s["scores"]["by_category"],
                "latency_median_s": s["latency"]["median_s"],
                "latency_p90_s": s["latency"]["p90_s"],
                "turns": s["turns"],
                "unscored": s["scores"]["unscored"],
            }
        )
    return rows


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def render_sweep_md(sweep: Sweep, rows: Sequence[Mapping[str, Any]]) -> str:
    cats: list[str] = []
    for r in rows:
        cats += [c for c in r["scores"] if c not in cats]
    head = [sweep.key, "score (avg)", *cats, "median latency (s)", "p90 latency (s)", "turns", "unscored"]
    lines = [
        f"# Sweep over `{sweep.key}`",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |",
    ]
    for r in rows:
        vals = [f"`{r['dir'].split('=', 1)[1]}`", _fmt(r["score"]), *[_fmt(r["scores"].get(c)) for c in cats],
                _fmt(r["latency_median_s"]), _fmt(r["latency_p90_s"]), str(r["turns"]), str(r["unscored"])]
        lines.append("| " + " | ".join(vals) + " |")
    lines += ["", f"Each point is a full run in `{sweep.key}=VALUE/` (its own summary.md). Plot: `{SWEEP_PNG}`.", ""]
    return "\n".join(lines)


def plot_sweep(path: Path, sweep: Sweep, rows: Sequence[Mapping[str, Any]]) -> None:
    """Median latency (x, p90 as the error bar's right end) against the overall score (y); paper points in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        for p, marker in zip(PUBLISHED, "sDv^<>"):
            ax.scatter([p.median_latency_s], [p.average], color="0.55", marker=marker, zorder=2,
                       label=f"{p.system} (paper)")
        pts = [r for r in rows if r["latency_median_s"] is not None]
        scored = [r for r in pts if r["score"] is not None]
        if scored:
            xs = [r["latency_median_s"] for r in scored]
            ys = [r["score"] for r in scored]
            err = [[0.0] * len(scored), [max(0.0, (r["latency_p90_s"] or x) - x) for r, x in zip(scored, xs)]]
            ax.errorbar(xs, ys, xerr=err, fmt="o-", color="C0", capsize=3, zorder=3, label=f"this run: {sweep.key}")
            for r, x, y in zip(scored, xs, ys):
                ax.annotate(r["dir"].split("=", 1)[1], (x, y), textcoords="offset points",
                            xytext=(4, 6), fontsize=8, color="C0")
        else:
            for r in pts:
                ax.axvline(r["latency_median_s"], color="C0", alpha=0.5)
                ax.annotate(r["dir"], (r["latency_median_s"], 0.5), rotation=90, fontsize=7, color="C0")
            ax.text(0.5, 0.95, "no scores (no judge configured): median latencies only", transform=ax.transAxes,
                    ha="center", va="top", fontsize=9, color="C3")
        xs_all = [p.median_latency_s for p in PUBLISHED] + [float(r["latency_median_s"]) for r in pts]
        xs_all += [float(r["latency_p90_s"]) for r in pts if r["latency_p90_s"] is not None]
        ax.set_xlim(min(xs_all) - 0.3, max(xs_all) + 0.5)
        ax.legend(loc="lower right", fontsize=7)
        ax.set_xlabel("median response latency (s; bar to p90); < 0: starts before the user ends")
        ax.set_ylabel("MT-Bench score (avg of categories)")
        ax.set_ylim(0, 10)
        ax.set_title(f"latency vs score over {sweep.key}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def write_sweep(directory: Path, sweep: Sweep, summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = sweep_rows(sweep, summaries)
    directory = Path(directory)
    payload = {"key": sweep.key, "values": [p.value for p in sweep.points], "points": rows}
    (directory / SWEEP_JSON).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (directory / SWEEP_MD).write_text(render_sweep_md(sweep, rows), encoding="utf-8")
    plot_sweep(directory / SWEEP_PNG, sweep, rows)
    return rows
