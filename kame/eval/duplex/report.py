"""``results.json``, the table (``results.md``) and the plot (``results.png``) of a duplex run.

Every row names what makes it comparable: the data set, the ASR that gave
the word times, the alignment of the output, the wire and the session
settings (the variant). The benchmark's published figures are printed only
when the data set is the benchmark's released data (``--dataset
released...``): on kame's generated set, or on any other folder, they are
not comparable and are left out, saying so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kame.eval.duplex.published import PUBLISHED, SOURCE

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_PNG = "results.png"
TASK_SHORT = {"pause_handling": "pause", "smooth_turn_taking": "turn-taking", "user_interruption": "interruption",
              "backchannel": "backchannel", "v1.5/user_interruption": "v1.5 interruption",
              "v1.5/user_backchannel": "v1.5 user backchannel", "v1.5/talking_to_other": "v1.5 talking to other",
              "v1.5/background_speech": "v1.5 background speech"}


def is_v15_row(row: Mapping[str, Any]) -> bool:
    return str(row["task"]).startswith("v1.5/")


def is_released(dataset: str) -> bool:
    return dataset.startswith("released")


def _f(x: Any, nd: int = 3, unit: str = "") -> str:
    return "–" if x is None else f"{x:.{nd}f}{unit}"


def table_rows(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["| run | task | data set | ASR | alignment | wire | n | TOR | latency | relevance 0-5 | bc freq /s | JSD |",
           "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(
            f"| {r['variant']} | {r['task']} | {r['dataset']} | {r['asr']} | {r['alignment']} | {r['wire']} | "
            f"{r['samples']} | {_f(r.get('tor'))} | {_f(r.get('latency_mean_s'), 3, ' s')} | "
            f"{_f(r.get('relevance_mean'), 2)} | {_f(r.get('frequency_hz_mean'), 3)} | {_f(r.get('jsd_mean'), 3)} |")
    return out


def v15_table_rows(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """v1.5 rows: the behaviour after the overlap (shares of the labelled samples) and the latencies."""
    out = ["| run | task | data set | ASR | alignment | wire | n | labelled | respond | resume | uncertain | unknown | "
           "stop latency | response latency |",
           "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        b = r.get("behaviour") or {}
        out.append(
            f"| {r['variant']} | {r['task']} | {r['dataset']} | {r['asr']} | {r['alignment']} | {r['wire']} | "
            f"{r['samples']} | {r.get('labelled', 0)} | {_f(b.get('C_RESPOND'), 2)} | {_f(b.get('C_RESUME'), 2)} | "
            f"{_f(b.get('C_UNCERTAIN_HANDLING'), 2)} | {_f(b.get('C_UNKNOWN'), 2)} | "
            f"{_f(r.get('stop_latency_mean_s'), 3, ' s')} | {_f(r.get('response_latency_mean_s'), 3, ' s')} |")
    return out


def published_rows() -> list[str]:
    out = ["| system | pause TOR (synthetic / Candor) | turn-taking TOR | turn-taking latency | "
           "interruption TOR | relevance 0-5 | interruption latency |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, p in PUBLISHED.items():
        out.append(f"| {name} | {p['pause_synthetic_tor']:.3f} / {p['pause_candor_tor']:.3f} | {p['turn_tor']:.3f} | "
                   f"{p['turn_latency_s']:.3f} s | {p['interrupt_tor']:.3f} | {p['interrupt_rating']:.3f} | "
                   f"{p['interrupt_latency_s']:.3f} s |")
    return out


def render_md(doc: Mapping[str, Any]) -> str:
    rows = [r for r in doc["rows"] if not is_v15_row(r)]
    v15 = [r for r in doc["rows"] if is_v15_row(r)]
    lines = ["# kame eval duplex", ""]
    if rows:
        lines += ["TOR: take-over rate (pause handling and backchannel: lower is better; turn-taking and interruption: "
                  "higher is better). Latency: mean over take-overs, negative counted as 0. Relevance: the judge's "
                  f"0-5 ({doc.get('judge') or 'no judge'}).", ""]
        lines += table_rows(rows)
        lines.append("")
    if v15:
        lines += ["Full-Duplex-Bench v1.5 (overlap handling). Behaviour after the overlap: shares of the samples the "
                  f"judge labelled ({doc.get('judge') or 'no judge'}): respond to it, resume the earlier answer, "
                  "uncertain (asks to repeat), unknown. Stop latency: how long the model spoke over the user; "
                  "response latency: the user's end to the model's next start (means).", ""]
        lines += v15_table_rows(v15)
        lines.append("")
    if v15 and not rows:
        lines.append("No published figures are shown for v1.5: kame's definitions and ASR differ from the paper's.")
    elif rows and all(is_released(str(r["dataset"])) for r in rows):
        lines += [f"Published (Full-Duplex-Bench v1; {SOURCE}):", ""] + published_rows()
        lines += ["", "Published word times come from a NeMo ASR, kame's from the ASR named in its rows; "
                      "compare with that in mind."]
    else:
        lines.append("The benchmark's published figures are not shown: they were measured on its released data, "
                     "and this run is on another data set.")
    skipped = doc.get("skipped") or []
    if skipped:
        lines += ["", f"Skipped ({len(skipped)}):", ""] + [f"- {s}" for s in skipped]
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """TOR per task and variant (bars) and latency distributions (box per task and variant)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [f"{TASK_SHORT.get(r['task'], r['task'])}\n{r['variant']}" for r in rows]
    key = ["response_latency_s" if is_v15_row(r) else "latency_s" for r in rows]
    # v1: the take-over rate; v1.5: the share of samples whose reply responds to the overlap
    ax1.bar(range(len(rows)), [((r.get("behaviour") or {}).get("C_RESPOND") if is_v15_row(r) else r.get("tor")) or 0.0
                               for r in rows], color=["tab:orange" if is_v15_row(r) else "tab:blue" for r in rows])
    ax1.set_xticks(range(len(rows)), labels, fontsize=7)
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("take-over rate (v1) / responds to the overlap (v1.5)")
    ax1.set_title("TOR per task; v1.5: C_RESPOND share")
    lat = [(lab, [s[k] for s in r["per_sample"] if s.get(k) is not None])
           for lab, k, r in zip(labels, key, rows)
           if r["task"] in ("smooth_turn_taking", "user_interruption") or is_v15_row(r)]
    lat = [(lab, xs) for lab, xs in lat if xs]
    if lat:
        ax2.boxplot([xs for _, xs in lat], showmeans=True)
        ax2.set_xticks(range(1, len(lat) + 1), [lab for lab, _ in lat], fontsize=7)
    else:
        ax2.text(0.5, 0.5, "no take-over: no latency", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_ylabel("latency (s)")
    ax2.set_title("latency after the user's turn / interruption")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(directory: Path, doc: Mapping[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RESULTS_JSON).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (directory / RESULTS_MD).write_text(render_md(doc), encoding="utf-8")
    plot(directory / RESULTS_PNG, doc["rows"])
