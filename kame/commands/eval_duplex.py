"""``kame eval duplex DATA_DIR --task TASK --server URL``: Full-Duplex-Bench v1 and v1.5 on a kame server.

Streams every sample of a task folder (the benchmark's released data, v1
or v1.5, or kame's generated set: ``kame eval duplex --generate DIR``) at
real time, writes into each sample folder what the benchmark's own
inference and ASR steps write there, and scores them into
``results.json``, ``results.md`` (the table) and ``results.png`` (the
plot), in a results folder outside the data (``--results``). ``--compare`` runs the same samples
with the oracle on and off and with each answer-switch policy, side by
side. See docs/evaluation.md, part II.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kame.errors import UserError

HELP = "Full-duplex behaviour (Full-Duplex-Bench v1 tasks and metrics) of a running server."
COMPARE = ("none", "oracle", "policies", "all")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kame.eval.duplex.align import ALIGNMENTS
    from kame.eval.duplex.client import WIRES
    from kame.eval.duplex.samples import TASKS

    p.add_argument("data_dir", metavar="DATA_DIR", help="A task folder of sample folders (input.wav + label); "
                   "with --generate, where to write kame's generated set (one folder per task).")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="The benchmark's task: v1's pause_handling, smooth_turn_taking, user_interruption, backchannel, "
                        "or v1.5's subsets as v1.5/user_interruption, v1.5/user_backchannel, v1.5/talking_to_other, "
                        "v1.5/background_speech.")
    p.add_argument("--server", default=None, metavar="URL", help="The server: http://HOST:PORT.")
    p.add_argument("--wire", choices=WIRES, default="chat",
                   help="chat: /api/chat, as the benchmark's Moshi client (default); realtime: /v1/realtime with "
                        "kame's events on.")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="Write outputs to DIR/VARIANT/SAMPLE/ (with a copy of input and label) and the results to "
                        "DIR; default: into each sample's folder. Needed with --compare.")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="Where results.json/.md/.png, the judges' caches and the event logs go (never inside a data "
                        "folder: the benchmark's scripts read every entry there); default: --out, else a folder "
                        "beside DATA_DIR named DATA_DIR.kame-VARIANT.")
    p.add_argument("--overwrite", action="store_true",
                   help="Run the samples whose output.wav is already there again (default: keep it, as the "
                        "benchmark's clients do; its transcript is written if missing).")
    p.add_argument("--concurrency", type=int, default=1, metavar="N",
                   help="Sessions at once (default 1; at most the server's free sessions).")
    p.add_argument("--alignment", choices=ALIGNMENTS, default="arrival",
                   help="arrival: one 80 ms zero frame then the frames in arrival order, as the benchmark's "
                        "client (default); frame: output frame n at n x 80 ms.")
    p.add_argument("--compare", choices=COMPARE, default="none",
                   help="oracle: the oracle on and off (front-end alone); policies: each answer-switch policy; "
                        "all: both.")
    p.add_argument("--oracle", choices=("on", "off"), default="on",
                   help="One run with the back-end (on, default) or the front-end alone (off).")
    p.add_argument("--oracle-policy", default=None, metavar="P", help="Answer-switch policy (server default).")
    p.add_argument("--backend", default=None, metavar="NAME", help="LLM back-end of the sessions (server default).")
    p.add_argument("--dataset", default=None, metavar="NAME",
                   help="The data set's name in the table (default: from DATA_DIR/../dataset.json, else the "
                        "folder's name). Name it released-... only for the benchmark's released data: the "
                        "published figures are shown beside those runs only.")
    p.add_argument("--asr-model", default=None, metavar="M",
                   help="Whisper model for the word times (default: the bundled tiny.en).")
    p.add_argument("--score-only", action="store_true",
                   help="Do not stream: score the output.wav/output.json already in the sample folders.")
    p.add_argument("--judge-model", default=None, metavar="M",
                   help="Judge: relevance (user_interruption) or behaviour after the overlap (v1.5 tasks).")
    p.add_argument("--judge-base-url", default=None, metavar="U", help="OpenAI-compatible base URL of the judge.")
    p.add_argument("--judge-api-key-env", default=None, metavar="NAME",
                   help="Environment variable with the judge's key (default OPENAI_API_KEY).")
    p.add_argument("--human-timing", default=None, metavar="FILE",
                   help="backchannel: the benchmark's human timing distribution (JSON; not bundled, "
                        "non-commercial licence) for the JSD.")
    p.add_argument("--generate", action="store_true",
                   help="Write kame's generated set into DATA_DIR (no server needed) and stop.")
    p.add_argument("--per-task", type=int, default=4, metavar="N", help="--generate: samples per task (default 4).")
    p.add_argument("--seed", type=int, default=0, help="--generate: the seed (default 0).")
    p.add_argument("--vad", choices=("webrtc", "energy"), default="webrtc",
                   help="backchannel: the VAD that finds the output's speech segments (the benchmark uses Silero; "
                        "kame's own, kame/eval/vad.py; default webrtc).")
    p.add_argument("--server-token-env", default="KAME_AUTH_TOKEN", metavar="NAME",
                   help="Environment variable with the server's token, used when set.")


def variants(args: argparse.Namespace, policies: tuple[str, ...]) -> list[Any]:
    from kame.eval.duplex.runner import Variant

    base: dict[str, Any] = {"backend": args.backend} if args.backend else {}
    if args.compare == "none":
        s = dict(base)
        if args.oracle == "off":
            s["llm"] = False
        if args.oracle_policy:
            s["oracle_policy"] = args.oracle_policy
        name = "oracle-off" if args.oracle == "off" else f"oracle-on{'-' + args.oracle_policy if args.oracle_policy else ''}"
        return [Variant(name, s)]
    out = []
    if args.compare in ("oracle", "all"):
        out.append(Variant("oracle-off", {**base, "llm": False}))
    if args.compare == "oracle":
        out.append(Variant("oracle-on", {**base, "llm": True}))
    if args.compare in ("policies", "all"):
        out += [Variant(f"policy-{p}", {**base, "llm": True, "oracle_policy": p}) for p in policies]
    return out


def _dataset_name(data_dir: Path, given: str | None) -> str:
    if given:
        return given
    for d in (data_dir, data_dir.parent):
        f = d / "dataset.json"
        if f.is_file():
            try:
                info = json.loads(f.read_text(encoding="utf-8"))
                return f"{info['dataset']} (seed {info.get('seed')})"
            except (ValueError, KeyError):
                pass
    return data_dir.name


def _inside(path: Path, folder: Path) -> bool:
    p, f = path.resolve(), folder.resolve()
    return p == f or f in p.parents


def results_folder(data_dir: Path, out: Path | None, given: str | None, variant_names: list[str]) -> Path:
    """Where the run's own files go: ``given``, else ``out``, else ``DATA_DIR.kame-VARIANT(S)`` beside the data.

    Never inside a folder the benchmark's scripts read (the data folder, or a variant's folder under ``out``):
    they take every entry there for a sample."""
    if given:
        results = Path(given)
    elif out is not None:
        results = out
    else:
        results = data_dir.parent / f"{data_dir.resolve().name}.kame-{'+'.join(variant_names)}"
    data_folders = [data_dir] + ([out / v for v in variant_names] if out is not None else [])
    for folder in data_folders:
        if _inside(results, folder):
            raise UserError(f"--results {results}: inside the data folder {folder}, whose every entry the "
                            "benchmark's scripts read as a sample; choose a folder outside it")
    return results


def run(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    if args.generate:
        from kame.eval.duplex.generate import generate

        if args.per_task < 1:
            raise UserError("--per-task must be at least 1")
        info = generate(data_dir, args.per_task, args.seed)
        print(f"kame eval duplex: wrote {args.per_task} sample(s) per task ({', '.join(info['tasks'])}) "
              f"into {data_dir}, seed {args.seed}", flush=True)
        return 0
    if args.task is None:
        raise UserError("--task is required (pause_handling, smooth_turn_taking, user_interruption, backchannel, "
                        "v1.5/user_interruption, v1.5/user_backchannel, v1.5/talking_to_other, v1.5/background_speech)")
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: not a folder")
    if args.concurrency < 1:
        raise UserError("--concurrency must be at least 1")
    if not args.score_only and not args.server:
        raise UserError("--server is required (or --score-only to score outputs already recorded)")
    from kame.eval.duplex.client import Target
    from kame.eval.duplex.runner import DuplexConfig, run_duplex
    from kame.eval.duplex.samples import is_v15
    from kame.eval.duplex.scoring import load_human_timing
    from kame.eval.vad import VadConfig
    from kame.session.settings import ORACLE_POLICIES

    if args.oracle_policy and args.oracle_policy not in ORACLE_POLICIES:
        raise UserError(f"--oracle-policy {args.oracle_policy!r}: expected one of {', '.join(ORACLE_POLICIES)}")
    vs = variants(args, ORACLE_POLICIES)
    if len(vs) > 1 and args.out is None:
        raise UserError("--compare writes one output folder per variant: give --out DIR")
    if args.score_only and len(vs) > 1:
        raise UserError("--score-only scores one set of outputs: no --compare")
    human = None
    if args.human_timing:
        try:
            human = load_human_timing(Path(args.human_timing))
        except (OSError, ValueError) as exc:
            raise UserError(f"--human-timing: {exc}") from None
    target = None
    concurrency = args.concurrency
    if not args.score_only:
        from kame.eval.runner import ServerTarget, fetch_health

        target = Target.parse(args.server, args.wire, os.environ.get(args.server_token_env) or None)
        health = fetch_health(ServerTarget(target.ws_url(), target.health_url(), target.token))
        free = (health.get("sessions") or {}).get("free")
        if isinstance(free, int) and 0 < free < concurrency:
            print(f"kame eval duplex: the server has {free} free session(s): --concurrency {concurrency} -> {free}",
                  flush=True)
            concurrency = free
        names = list((health.get("backends") or {}).get("names") or [])
        if args.backend and names and args.backend not in names:
            raise UserError(f"back-end {args.backend!r} is not configured on the server (it has: {', '.join(names)})")
        if any(v.settings.get("llm") is not False for v in vs) and args.compare != "none" and not names:
            print("kame eval duplex: note: the server has no LLM back-end: 'oracle on' runs the front-end alone too",
                  flush=True)
    asr = None
    asr_name = "recorded output.json"
    if not args.score_only:
        from kame.eval.duplex.asr import WordAsr

        asr = WordAsr(args.asr_model)
        asr_name = asr.name
    out = Path(args.out) if args.out else None
    results_dir = results_folder(data_dir, out, args.results, [v.name for v in vs])
    cfg = DuplexConfig(task=args.task, data_dir=data_dir, variants=vs, dataset=_dataset_name(data_dir, args.dataset),
                       alignment=args.alignment, concurrency=concurrency, target=target, out_dir=out,
                       score_only=args.score_only, asr=asr, asr_name=asr_name, human=human,
                       vad=VadConfig(kind=args.vad), say=lambda s: print(s, flush=True), results_dir=results_dir,
                       overwrite=args.overwrite)

    async def main() -> dict[str, Any]:
        judge = None
        if args.judge_model:
            from kame.eval.duplex.relevance import RelevanceJudge
            from kame.eval.judge import Judge, JudgeConfig

            key_env = args.judge_api_key_env or "OPENAI_API_KEY"
            key = os.environ.get(key_env) or None
            if key is None and args.judge_base_url is None:
                raise UserError(f"--judge-model {args.judge_model}: no API key in ${key_env}")
            judge = Judge(JudgeConfig(args.judge_model, args.judge_base_url, key), {})
            results_dir.mkdir(parents=True, exist_ok=True)
            if is_v15(args.task):
                from kame.eval.duplex.overlap import BehaviourJudge

                cfg.behaviour = BehaviourJudge(judge, results_dir)
            else:
                cfg.relevance = RelevanceJudge(judge, results_dir)
        try:
            return await run_duplex(cfg, results_dir)
        finally:
            if judge is not None:
                await judge.aclose()

    t0 = time.monotonic()
    doc = asyncio.run(main())
    print(f"kame eval duplex: {len(doc['rows'])} row(s), {len(doc['skipped'])} skipped, {time.monotonic() - t0:.1f} s; "
          f"table {results_dir / 'results.md'}, plot {results_dir / 'results.png'}", flush=True)
    if doc["skipped"]:
        print(f"kame eval duplex: {len(doc['skipped'])} sample(s) skipped (see results.md)", file=sys.stderr)
    return 0
