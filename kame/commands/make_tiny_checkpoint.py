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


def run(args: argparse.Namespace) -> int:
    from kame.frontend.tiny import make_tiny_checkpoint

    out = make_tiny_checkpoint(args.directory, args.seed, stt=args.stt, with_oracle=not args.plain_moshi)
    print(out)
    return 0
