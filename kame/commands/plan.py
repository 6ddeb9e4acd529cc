"""``kame plan``: the configured models' memory before anything is loaded, and how many sessions fit a card."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

NAME = "plan"
HELP = "Print the configured models' parameters, weight and KV-cache bytes, and the largest batch a GPU holds."

#: The card assumed when none is named and none is present (kame.frontend.cards).
DEFAULT_CARD = "h100"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kame.frontend.cards import CARDS

    p.add_argument("--gpu", default=None, metavar="CARD", choices=[*CARDS, "all"],
                   help=f"Plan for this card's usable memory: {', '.join(CARDS)}, or all (default: this machine's "
                        f"GPU, else {DEFAULT_CARD}).")
    p.add_argument("--gpu-memory-gib", type=float, default=None, metavar="G",
                   help="Free memory of the card to plan for, in GiB (instead of --gpu).")
    p.add_argument("--weights", default=None, choices=("bf16", "int8", "both"),
                   help="Linear weights as configured (frontend.weights, or int8 for a q8 checkpoint), bf16, int8, "
                        "or both side by side.")
    p.add_argument("--json", action="store_true", help="One JSON object instead of text.")


def _cards(args: argparse.Namespace) -> list[tuple[str, int, int, str]]:
    """(label, usable bytes, total bytes, where the figure comes from) of each card planned for."""
    from kame.frontend.cards import CARDS, card
    from kame.frontend.memory_plan import GIB

    if args.gpu_memory_gib is not None:
        g = int(args.gpu_memory_gib * GIB)
        return [(f"{args.gpu_memory_gib:g} GiB", g, g, "given (--gpu-memory-gib)")]
    if args.gpu is None:
        import torch

        if torch.cuda.is_available():  # what the server's own check will read
            free, total = torch.cuda.mem_get_info()
            return [(torch.cuda.get_device_name(), free, total, "this machine's GPU: torch.cuda.mem_get_info (free)")]
    keys = list(CARDS) if args.gpu == "all" else [args.gpu or DEFAULT_CARD]
    assumed = "" if args.gpu else " (no GPU here: assumed; --gpu CARD)"
    return [(card(k).key, card(k).usable_bytes, card(k).total_bytes, card(k).source + assumed) for k in keys]


def _count(n: int) -> str:
    return f"{n / 1e9:7.3f} B" if n >= 1e8 else f"{n / 1e6:7.2f} M"


def _size(n: int) -> str:
    return f"{n / 1024**3:7.3f} GiB" if n >= 1024**3 // 10 else f"{n / 1024**2:7.2f} MiB"


def run(args: argparse.Namespace) -> int:
    from kame.errors import UserError
    from kame.frontend.config import MAX_BATCH_SIZE
    from kame.frontend.memory_plan import GIB, largest_batch
    from kame.frontend.plan_models import FRONTEND, build_plan
    from kame.server.config import load_app_config

    environ = dict(os.environ)
    cfg = load_app_config(args.config or (None if environ.get("KAME_CONFIG") else "default"), environ=environ)
    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        raise UserError(f"--gpu-memory-gib {args.gpu_memory_gib}: expected a positive number of GiB")
    if args.gpu_memory_gib is not None and args.gpu is not None:
        raise UserError("--gpu and --gpu-memory-gib: give one of them")
    cards = _cards(args)
    report = build_plan(cfg, weights=None if args.weights in (None, "both") else args.weights)
    plan = report.plan
    others = {}
    if args.weights == "both":
        other = "int8" if plan.weights == "bf16" else "bf16"
        others[other] = build_plan(cfg, weights=other).plan
    plans = {plan.weights: plan, **others}
    card, usable, total_bytes, source = cards[0]
    gib = usable / GIB
    max_batch = largest_batch(plan, usable)
    batch = int(cfg.frontend.batch_size)
    by_card: list[dict[str, Any]] = [
        {"gpu": label, "usable_gib": round(u / GIB, 2), "total_gib": round(t / GIB, 2), "source": src,
         "max_batch": {w: largest_batch(p, u) for w, p in sorted(plans.items())}}
        for label, u, t, src in cards
    ]
    front = plan.model(FRONTEND)
    out = {
        "checkpoint": cfg.frontend.checkpoint,
        "architecture": report.frontend.origin,
        "dtype": plan.dtype,
        "lm_params": front.params,
        "params": plan.params,
        "weight_bytes": plan.weight_bytes,
        "load_bytes": plan.load_bytes,
        "kv_bytes_per_slot": plan.kv_bytes_per_slot,
        "models": [
            {"name": m.name, "params": m.params, "weight_bytes": m.weight_bytes,
             "kv_bytes_per_slot": m.kv_bytes_per_slot, "load_extra_bytes": m.load_extra_bytes}
            for m in plan.models
        ],
        "weights": plan.weights,
        "gpu_memory_gib": round(gib, 2),
        "gpu": card,
        "gpu_source": source,
        "cards": by_card,
        "weight_bytes_by_weights": {w: p.weight_bytes for w, p in sorted(plans.items())},
        "headroom": f"{plan.headroom.describe()} of the counted bytes",
        "needed_bytes": plan.needed_bytes(batch),
        "max_batch": max_batch,
        "batch_size": batch,
        "batch_size_fits": batch <= max_batch,
        "notes": list(report.notes),
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    g = 1024**3
    print(f"checkpoint {cfg.frontend.checkpoint} ({report.frontend.origin}), weights {plan.dtype}"
          + (" with int8 linear layers" if plan.weights == "int8" else ""))
    if cfg.device == "cpu":
        print("  note: this config serves on the CPU; planned as if on a CUDA card")
    for m in plan.models:
        print(f"  {m.name:10s} {_count(m.params)} params  {_size(m.weight_bytes)} weights  "
              f"{_size(m.kv_bytes_per_slot)} KV cache a slot")
    print(f"  {'total':10s} {_count(plan.params)} params  {_size(plan.weight_bytes)} weights  "
          f"{_size(plan.kv_bytes_per_slot)} KV cache a slot")
    if plan.load_bytes > plan.weight_bytes:
        print(f"  while loading: {plan.load_bytes / g:.2f} GiB")
    for note in report.notes:
        print(f"  note: {note}")
    for w, p in sorted(others.items()):
        print(f"  {'total':10s} {_count(p.params)} params  {_size(p.weight_bytes)} weights with {w} linear layers")
    if len(cards) > 1 or others:
        print(f"sessions per card (largest batch that fits the usable memory; headroom {plan.headroom.describe()}):")
        for row in by_card:
            fits = "  ".join(f"{w} {n:3d}" for w, n in row["max_batch"].items())
            print(f"  {row['gpu']:8s} {row['usable_gib']:6.1f} GiB usable of {row['total_gib']:6.1f}  {fits}   ({row['source']})")
    print(f"GPU {gib:.1f} GiB usable ({card}: {source}); headroom kept free: {plan.headroom.describe()} of what is counted")
    if max_batch == 0:
        print("largest batch that fits: none (not even one session)")
    else:
        most = " (frontend.batch_size's maximum)" if max_batch == MAX_BATCH_SIZE else ""
        print(f"largest batch that fits: {max_batch}{most} (needs {plan.needed_bytes(max_batch) / g:.1f} GiB "
              f"with the headroom)")
    verdict = "fits" if batch <= max_batch else "does NOT fit"
    print(f"frontend.batch_size {batch}: {verdict} (needs {plan.needed_bytes(batch) / g:.1f} GiB with the headroom)")
    return 0
