"""``kame make-tiny-checkpoint DIR``: a tiny random KAME-format checkpoint for tests and demos."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "make-tiny-checkpoint"
HELP = "Write a tiny random checkpoint in the real on-disk format (deterministic for a seed)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", type=Path, help="Directory to create (left alone if it already holds one).")
    p.add_argument("--seed", type=int, default=0, help="Random seed (same seed, same files).")
    p.add_argument("--stt", action="store_true", help="A Kyutai-STT-shaped checkpoint (32 codebooks in, text out).")
    p.add_argument("--plain-moshi", action="store_true", help="No oracle_emb table (a plain Moshi checkpoint).")
    p.add_argument(
        "--layout",
        choices=("release", "split"),
        default="release",
        help="release (default): fused self_attn.in_proj_weight/out_proj.weight as Kyutai's published files; "
        "split: moshi's state_dict() names (in_projs.{i}.weight).",
    )
    p.add_argument(
        "--silence-prefix",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="With --stt: stt_config.audio_silence_prefix_seconds (1.0 like kyutai/stt-2.6b-en).",
    )


def run(args: argparse.Namespace) -> int:
    from kame.frontend.tiny import make_tiny_checkpoint

    out = make_tiny_checkpoint(
        args.directory,
        args.seed,
        stt=args.stt,
        with_oracle=not args.plain_moshi,
        layout=args.layout,
        silence_prefix_s=args.silence_prefix,
    )
    print(out)
    return 0
