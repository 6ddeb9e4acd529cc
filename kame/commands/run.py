"""``kame run``: stream a wav file through the front-end offline, optionally with oracle texts."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

NAME = "run"
HELP = "Run a wav through the front-end (at real time, or --fast) and write the reply audio and text."

log = logging.getLogger("kame.run")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="Hub repo id or local checkpoint directory (default: from config).")
    p.add_argument("--input", required=True, type=Path, help="Input audio (any format; converted to 24 kHz mono).")
    p.add_argument("--output", required=True, type=Path, help="Reply wav (24 kHz mono, same length as the input).")
    p.add_argument(
        "--oracle",
        action="append",
        default=[],
        metavar="TEXT@SECONDS",
        help="Inject TEXT into the oracle stream at SECONDS (split on the last @). Repeatable.",
    )
    p.add_argument("--seed", type=int, default=None, help="Sampling seed (reproducible output).")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: config, auto).")
    p.add_argument("--text-out", type=Path, default=None, help="JSON lines, one per text token: step, t_s, id, piece.")
    p.add_argument("--fast", action="store_true", help="Run as fast as possible instead of at real time.")


def run(args: argparse.Namespace) -> int:
    from kame.audio import read_audio, write_wav
    from kame.config import load_config
    from kame.errors import UserError
    from kame.frontend.engine import EngineCore
    from kame.frontend.loading import resolve_device
    from kame.frontend.models import load_frontend
    from kame.frontend.runner import OracleInjection, run_offline, write_text_file
    from kame.versions import versions_line

    cfg = load_config(
        args.config,
        overrides={"frontend.checkpoint": args.checkpoint, "device": args.device, "frontend.seed": args.seed},
    )
    try:
        injections = [OracleInjection.parse(spec) for spec in args.oracle]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    pcm = read_audio(args.input)
    device = resolve_device(cfg.device)
    log.info("loading %s on %s (%s)", cfg.frontend.checkpoint, device, versions_line())
    models = load_frontend(cfg.frontend, device)
    core = EngineCore(models, cfg.frontend, batch_size=1)

    from kame.oracle.answer_text import encode_answer_text

    t0 = time.monotonic()
    result = run_offline(
        core,
        pcm,
        injections=injections,
        encode_answer=lambda text: encode_answer_text(text, models.encode_text),
        seed=cfg.frontend.seed,
        fast=args.fast,
    )
    wall = time.monotonic() - t0
    write_wav(args.output, result.pcm, models.sample_rate)
    if args.text_out is not None:
        write_text_file(args.text_out, result.outputs, models.tokenizer)
    steps = len(result.step_times_s)
    mean_ms = 1000 * sum(result.step_times_s) / max(1, steps)
    print(f"kame run: {steps} steps, {pcm.size / models.sample_rate:.2f} s of audio in {wall:.2f} s, mean step {mean_ms:.1f} ms")
    print(f"kame run: wrote {args.output}" + (f" and {args.text_out}" if args.text_out else ""))
    return 0
