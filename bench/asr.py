"""Streaming ASR bench: accuracy, partial lag and CPU cost per recogniser kind.

    python bench/asr.py [--quick] [--kinds whisper,pocketsphinx] [--config FILE] [--json OUT]

Speech: a fixed set of espeak-ng sentences (several voices and speeds),
each as its own session: 0.5 s of silence, the sentence, 1.5 s of silence.

* WER (jiwer) of the finals against the text spoken, after lower-casing and
  dropping punctuation.
* Partial lag: for each spoken word, the time from its end in the audio to
  the first partial (or final) that contains it, aligned to the reference
  (difflib), so a word counts only where it belongs. Word ends come from
  synthesizing every prefix of the sentence (tests/support/speech.py). Whisper
  sometimes guesses a word before its end, so lags can be negative. Words
  never recognised are counted apart, not in the lag. Also reported: the
  lag until a word is *committed* (in a partial's ``stable`` prefix, or the
  final).
* CPU real-time factor per session: process CPU time (all threads) / audio
  duration fed, also over the speech only (without the silences).

Sessions run at *simulated* real time (kame.asr.offline, pace "simulated"):
audio arrives at real-time rate on a virtual clock and every decode takes
the wall time it really took, during which more audio arrives; so lags are
what a live session on this machine would see, but the bench does not
sleep. One session at a time: on a busy server lags grow.
"""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support

from kame.stats import percentile
from tests.support.speech import RATE, silence, synthesize, word_end_times, words  # noqa: E402

#: (text, espeak voice, words a minute)
SENTENCES: list[tuple[str, str, int]] = [
    ("David has three sisters. Each of them has one brother. How many brothers does David have?", "en-us", 160),
    ("Please tell me the weather forecast for tomorrow morning in London.", "en-gb", 175),
    ("I would like to book a table for four people at seven tonight.", "en-us", 150),
    ("Can you explain why the sky looks blue during the day?", "en-gb-x-rp", 165),
    ("What is the capital city of Australia and how many people live there?", "en-us", 180),
    ("Remind me to call my mother after the meeting on Thursday.", "en-gb", 160),
    ("The train to Paris leaves from platform nine in twenty minutes.", "en-us", 170),
    ("How long should I boil an egg if I want the yolk to stay soft?", "en-gb-scotland", 160),
]
LEAD_S = 0.5
TRAIL_S = 1.5


@dataclass
class SentenceResult:
    reference: str
    hypothesis: str
    audio_s: float
    speech_s: float
    cpu_s: float
    lags_s: list[float] = field(default_factory=list)
    stable_lags_s: list[float] = field(default_factory=list)
    missed_words: int = 0
    partials: int = 0
    decodes: int = 0
    decode_s: float = 0.0


def first_appearance(reference: list[str], events: list[tuple[float, list[str]]]) -> list[float | None]:
    """Audio time at which each reference word first appears, aligned, in an event's words."""
    seen: list[float | None] = [None] * len(reference)
    for t, hyp in events:
        sm = difflib.SequenceMatcher(a=reference, b=hyp, autojunk=False)
        for block in sm.get_matching_blocks():
            for k in range(block.a, block.a + block.size):
                if seen[k] is None:
                    seen[k] = t
    return seen


def run_sentence(recognizer, text: str, voice: str, speed: int) -> SentenceResult:
    from kame.asr import EventType, transcribe_offline

    speech = synthesize(text, voice, speed)
    ends = [LEAD_S + e for e in word_end_times(text, voice, speed)]
    pcm = np.concatenate([silence(LEAD_S), speech, silence(TRAIL_S)])
    transcriber = recognizer.new_transcriber()
    c0 = time.process_time()
    events = list(transcribe_offline(transcriber, pcm, pace="simulated"))
    cpu = time.process_time() - c0
    transcriber.close()
    stats = transcriber.stats
    finals = [e.text for e in events if e.type is EventType.FINAL]
    timeline = [(e.audio_s, words(e.text)) for e in events if e.type in (EventType.PARTIAL, EventType.FINAL)]
    ref_words = words(text)
    # Punctuation-only tokens vanish in words(); ends[] follows text.split(), so map back.
    split_ends = [end for tok, end in zip(text.split(), ends) if words(tok)]
    seen = first_appearance(ref_words, timeline)
    committed = first_appearance(
        ref_words,
        [(e.audio_s, words(e.stable if e.type is EventType.PARTIAL else e.text)) for e in events
         if e.type in (EventType.PARTIAL, EventType.FINAL)],
    )
    res = SentenceResult(
        reference=" ".join(ref_words),
        hypothesis=" ".join(words(" ".join(finals))),
        audio_s=len(pcm) / RATE,
        speech_s=len(speech) / RATE,
        cpu_s=cpu,
        partials=sum(e.type is EventType.PARTIAL for e in events),
        decodes=stats.partial_decodes + stats.final_decodes,
        decode_s=stats.decode_s,
    )
    for t, t_stable, end in zip(seen, committed, split_ends):
        if t is None:
            res.missed_words += 1
        else:
            res.lags_s.append(t - end)
        if t_stable is not None:
            res.stable_lags_s.append(t_stable - end)
    return res


def bench_kind(kind: str, cfg_asr, sentences: list[tuple[str, str, int]]) -> dict:
    import jiwer

    from kame.asr import create_recognizer

    cfg = cfg_asr.model_copy(update={"kind": kind})
    t0 = time.perf_counter()
    recognizer = create_recognizer(cfg)
    load_s = time.perf_counter() - t0
    results = [run_sentence(recognizer, *s) for s in sentences]
    recognizer.close()
    lags = [lag for r in results for lag in r.lags_s]
    audio = sum(r.audio_s for r in results)
    speech = sum(r.speech_s for r in results)
    cpu = sum(r.cpu_s for r in results)
    return {
        "kind": kind,
        "load_s": round(load_s, 2),
        "sentences": len(results),
        "wer": round(jiwer.wer([r.reference for r in results], [r.hypothesis for r in results]), 4),
        "lag_median_s": round(statistics.median(lags), 3) if lags else None,
        "lag_p90_s": round(percentile(lags, 90), 3) if lags else None,
        "stable_lag_median_s": round(statistics.median(stable), 3) if (stable := [x for r in results for x in r.stable_lags_s]) else None,
        "words_never_seen": sum(r.missed_words for r in results),
        "words": sum(len(r.lags_s) + r.missed_words for r in results),
        "rtf": round(cpu / audio, 3),
        "rtf_speech": round(cpu / speech, 3),
        "partials_per_s_speech": round(sum(r.partials for r in results) / speech, 2),
        "decodes_per_s_speech": round(sum(r.decodes for r in results) / speech, 2),
        "decode_ms_mean": round(1000 * sum(r.decode_s for r in results) / max(1, sum(r.decodes for r in results)), 1),
        "details": [asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 sentences instead of 8")
    p.add_argument("--kinds", default="whisper,pocketsphinx", help="comma-separated kinds to bench")
    p.add_argument("--config", default=None, help="kame config file (its asr section is used)")
    p.add_argument("--json", default=None, help="write the full results here")
    p.add_argument("--verbose", action="store_true", help="print each sentence's final")
    args = p.parse_args(argv)

    from kame.errors import UserError
    from kame.server.config import load_app_config
    from kame.versions import versions_line

    print(versions_line())
    cfg = load_app_config(args.config)
    sentences = SENTENCES[:2] if args.quick else SENTENCES
    out = []
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        try:
            r = bench_kind(kind, cfg.asr, sentences)
        except UserError as exc:
            print(f"{kind}: not available: {exc}")
            continue
        out.append(r)
        print(
            f"{kind}: WER {r['wer'] * 100:.1f}%  partial lag median {r['lag_median_s']} s, p90 {r['lag_p90_s']} s "
            f"({r['words_never_seen']}/{r['words']} words never seen; committed: median {r['stable_lag_median_s']} s)  CPU RTF {r['rtf']} "
            f"(speech only {r['rtf_speech']})  per s of speech: {r['partials_per_s_speech']} partials, "
            f"{r['decodes_per_s_speech']} decodes of {r['decode_ms_mean']} ms  load {r['load_s']} s  "
            f"[{r['sentences']} sentences]"
        )
        if args.verbose:
            for d in r["details"]:
                print(f"    ref: {d['reference']}\n    hyp: {d['hypothesis']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
