"""``kame eval``: MT-Bench in speech against a running server (see docs/evaluation.md).

Each question is spoken into its own ``/v1/realtime`` session at real time
(turn 2 in the same session once turn 1's reply is over), both sides are
recorded, latency is measured on the recordings, and an OpenAI-compatible
judge grades the answers as MT-Bench does. ``--sweep`` repeats the set per
value of one session setting and plots latency against score. Runs resume:
finished questions are never redone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from kame.errors import UserError

NAME = "eval"
HELP = "Evaluate a running server on MT-Bench in speech: record, time, judge; optional sweeps."

DEFAULT_KEY_ENV = "OPENAI_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kame.commands import eval_duplex

    sub = p.add_subparsers(dest="eval_kind", metavar="{duplex}")
    d = sub.add_parser("duplex", help=eval_duplex.HELP, description=eval_duplex.HELP)
    eval_duplex.add_arguments(d)
    d.set_defaults(_run=eval_duplex.run)
    p.add_argument("--server", default=None, metavar="URL",
                   help="The server: http://HOST:PORT (or ws://HOST:PORT/v1/realtime). Required.")
    p.add_argument("--out", default=None, metavar="DIR", help="Output directory (resumed if it exists). Required.")
    p.add_argument("--questions", metavar="FILE", default=None,
                   help="Questions in MT-Bench's JSONL layout (default: the bundled 30 of the KAME paper).")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="Only the first N questions.")
    p.add_argument("--judge-model", default=None, metavar="M",
                   help="Judge model (GPT-4 class, as MT-Bench). Without it, everything but scores is produced.")
    p.add_argument("--judge-base-url", default=None, metavar="U",
                   help="OpenAI-compatible base URL of the judge (default: OpenAI's).")
    p.add_argument("--judge-api-key-env", default=None, metavar="NAME",
                   help=f"Environment variable holding the judge's API key (default {DEFAULT_KEY_ENV}).")
    p.add_argument("--judge-retries", type=int, default=2, metavar="N",
                   help="Ask again this often when a judgement has no [[rating]] (default 2).")
    p.add_argument("--tts", default="espeak", metavar="ENGINE",
                   help="Speech for the questions: espeak[:VOICE[:WPM]] or command:PROGRAM ARGS (text on stdin, "
                        "WAV on stdout). Default espeak.")
    p.add_argument("--retries", type=int, default=8, metavar="N",
                   help="Ask a question again in a new session when its session is refused (1013, HTTP 503) or "
                        "drained (1001), up to N times in a row, with back-off and jitter (default 8; recorded as "
                        "`reconnects` in results.jsonl).")
    p.add_argument("--concurrency", type=int, default=1, metavar="N",
                   help="Questions at once, each its own session (default 1).")
    p.add_argument("--max-reply-s", type=float, default=30.0, metavar="S",
                   help="A reply ends at the latest this long after the question (default 30).")
    p.add_argument("--reply-silence-s", type=float, default=1.5, metavar="S",
                   help="A reply ends after this much assistant silence (default 1.5).")
    p.add_argument("--lead-in-s", type=float, default=0.5, metavar="S",
                   help="Silence streamed before turn 1 (default 0.5).")
    p.add_argument("--vad", choices=["webrtc", "energy"], default="webrtc",
                   help="Voice activity detector for reply ends and latency (default webrtc).")
    p.add_argument("--score-from", choices=["text", "asr"], default="text",
                   help="Judge the assistant's text stream (default) or a Whisper transcript of its audio.")
    p.add_argument("--asr-model", default=None, metavar="M",
                   help="Whisper model for --score-from asr (default: the bundled tiny.en).")
    p.add_argument("--sweep", default=None, metavar="KEY=V1,V2,...",
                   help="Run the set once per value of a kame session setting, e.g. oracle_delay_s=0,0.5,1,2 or "
                        "oracle_policy=reset,keep_if_same_start,freeze_when_speaking.")
    p.add_argument("--backend", default=None, metavar="NAME", help="LLM back-end of the sessions (server default).")
    p.add_argument("--server-token-env", default="KAME_AUTH_TOKEN", metavar="NAME",
                   help="Environment variable with the server's token, used when set (default KAME_AUTH_TOKEN).")


def _check_numbers(args: argparse.Namespace) -> None:
    if args.concurrency < 1:
        raise UserError("--concurrency must be at least 1")
    if args.retries < 0:
        raise UserError("--retries must be 0 or more")
    if not args.max_reply_s > 0:
        raise UserError("--max-reply-s must be positive")
    if not 0 < args.reply_silence_s <= args.max_reply_s:
        raise UserError("--reply-silence-s must be positive and at most --max-reply-s")
    if args.lead_in_s < 0:
        raise UserError("--lead-in-s must not be negative")
    if args.judge_retries < 0:
        raise UserError("--judge-retries must not be negative")


def _judge_key(args: argparse.Namespace) -> str | None:
    name = args.judge_api_key_env or DEFAULT_KEY_ENV
    key = os.environ.get(name) or None
    if key is None and (args.judge_api_key_env is not None or args.judge_base_url is None):
        raise UserError(f"--judge-model {args.judge_model}: no API key in ${name} (set it, or --judge-api-key-env)")
    return key


def run(args: argparse.Namespace) -> int:
    from kame.eval.judge import Judge, JudgeConfig
    from kame.eval.questions import load_judge_prompts, load_questions
    from kame.eval.runner import (
        EvalConfig,
        LocalVersions,
        ServerTarget,
        Services,
        fetch_health,
        synthesize_all,
    )
    from kame.eval.session import DriveConfig
    from kame.eval.sweep import parse_sweep
    from kame.eval.tts import make_tts
    from kame.eval.vad import VadConfig

    if not args.server or not args.out:
        raise UserError("--server and --out are required (or: kame eval duplex DATA_DIR --task TASK --server URL)")
    _check_numbers(args)
    if args.judge_base_url and not args.judge_model:
        raise UserError("--judge-base-url needs --judge-model")
    sweep = parse_sweep(args.sweep) if args.sweep else None
    questions = load_questions(args.questions, args.limit)
    tts = make_tts(args.tts)
    key = _judge_key(args) if args.judge_model else None
    target = ServerTarget.parse(args.server, os.environ.get(args.server_token_env) or None)
    health = fetch_health(target)
    names = list((health.get("backends") or {}).get("names") or [])
    wanted = [args.backend] if args.backend else []
    if sweep is not None and sweep.key == "backend":
        wanted += [str(p.value) for p in sweep.points]
    for b in wanted:
        if names and b not in names:
            raise UserError(f"back-end {b!r} is not configured on the server (it has: {', '.join(names)})")
    if sweep is not None and sweep.key == "backend" and args.backend:
        raise UserError("--backend and --sweep backend=... exclude each other")

    cfg = EvalConfig(
        target=target,
        questions=tuple(questions),
        questions_source=str(Path(args.questions).resolve()) if args.questions else "bundled:mt_bench_kame_subset",
        tts=tts,
        drive=DriveConfig(args.reply_silence_s, args.max_reply_s, args.lead_in_s, VadConfig(kind=args.vad),
                          token=target.token, retries=args.retries),
        score_from=args.score_from,
        concurrency=args.concurrency,
        judge_model=args.judge_model,
        judge_base_url=args.judge_base_url,
    )
    out = Path(args.out)
    base: dict[str, Any] = {"backend": args.backend} if args.backend else {}
    t0 = time.monotonic()
    print(f"kame eval: {len(questions)} question(s) against {target.ws_url}; speaking them with {tts.name}", flush=True)
    local_versions = LocalVersions()  # in a child process, meanwhile
    speech = synthesize_all(tts, questions)
    transcriber = None
    if args.score_from == "asr":
        from kame.eval.transcribe import ReplyTranscriber

        transcriber = ReplyTranscriber(args.asr_model)
    if not args.judge_model:
        print("kame eval: no judge configured (--judge-model): scores will not be computed", flush=True)

    async def main() -> list[Any]:
        from kame.eval.runner import run_set

        judge = None
        if args.judge_model:
            judge = Judge(JudgeConfig(args.judge_model, args.judge_base_url, key, args.judge_retries),
                          load_judge_prompts())
        services = Services(judge, transcriber, speech, dict(health.get("versions") or {}), local_versions.get,
                            say=lambda s: print(s, flush=True))
        try:
            if sweep is None:
                return [await run_set(cfg, out, base, services)]
            outcomes = []
            for point in sweep.points:
                print(f"kame eval: {point.dirname}", flush=True)
                outcomes.append(await run_set(cfg, out / point.dirname, {**base, point.key: point.value}, services,
                                              label=f"this run ({point.dirname})"))
            return outcomes
        finally:
            if judge is not None:
                await judge.aclose()

    outcomes = asyncio.run(main())
    wall = time.monotonic() - t0
    if sweep is not None:
        from kame.eval.sweep import write_sweep

        write_sweep(out, sweep, {o.directory.name: o.summary for o in outcomes})
        print(f"kame eval: sweep table {out / 'sweep.md'}, plot {out / 'sweep.png'}", flush=True)
    for o in outcomes:
        s = o.summary
        sc, lat = s["scores"], s["latency"]
        score = "–" if sc["overall"] is None else f"{sc['overall']:.2f}"
        med = "–" if lat["median_s"] is None else f"{lat['median_s']:+.2f} s"
        p90 = "–" if lat["p90_s"] is None else f"{lat['p90_s']:+.2f} s"
        print(f"kame eval: {o.directory}: score {score} ({sc['judged']} judged, {sc['unscored']} unscored); "
              f"latency median {med}, p90 {p90}; summary {o.directory / 'summary.md'}", flush=True)
    audio = sum(o.audio_s for o in outcomes)
    sessions = sum(o.sessions for o in outcomes)
    if sessions:
        ideal = audio / args.concurrency
        print(f"kame eval: wall time {wall:.1f} s; session audio {audio:.1f} s / concurrency {args.concurrency} = "
              f"{ideal:.1f} s ideal; overhead {100 * (wall / ideal - 1):+.1f} %", flush=True)
    else:
        print(f"kame eval: nothing to record (every question already finished); wall time {wall:.1f} s", flush=True)
    failures = [f for o in outcomes for f in o.failures]
    for f in failures:
        print(f"kame eval: failed: {f}", file=sys.stderr)
    if failures:
        print(f"kame eval: {len(failures)} failure(s); run the same command again to retry them", file=sys.stderr)
        return 1
    return 0
