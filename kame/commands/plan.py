"""``kame plan``: the configured models' memory before anything is loaded, and how many sessions fit a card."""

from __future__ import annotations

import argparse
import json
import os

NAME = "plan"
HELP = "Print the configured models' parameters, weight and KV-cache bytes, and the largest batch a GPU holds."

#: The card assumed when none is named and none is present: an 80 GB H100 / A100.
DEFAULT_GPU_GIB = 80.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-memory-gib", type=float, default=None, metavar="G",
                   help="Memory of the card to plan for (default: this machine's GPU, else 80).")
    p.add_argument("--json", action="store_true", help="One JSON object instead of text.")


def _card_gib(asked: float | None) -> tuple[float, str]:
    if asked is not None:
        return asked, "given"
    import torch

    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()[1] / 1024**3, f"this machine's {torch.cuda.get_device_name()}"
    return DEFAULT_GPU_GIB, "assumed (no GPU here; --gpu-memory-gib G)"


def _count(n: int) -> str:
    return f"{n / 1e9:7.3f} B" if n >= 1e8 else f"{n / 1e6:7.2f} M"


def _size(n: int) -> str:
    return f"{n / 1024**3:7.3f} GiB" if n >= 1024**3 // 10 else f"{n / 1024**2:7.2f} MiB"


def run(args: argparse.Namespace) -> int:
    from kame.errors import UserError
    from kame.frontend.memory_plan import GIB
    from kame.frontend.plan_models import FRONTEND, build_plan
    from kame.server.config import load_app_config

    environ = dict(os.environ)
    cfg = load_app_config(args.config or (None if environ.get("KAME_CONFIG") else "default"), environ=environ)
    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        raise UserError(f"--gpu-memory-gib {args.gpu_memory_gib}: expected a positive number of GiB")
    gib, card = _card_gib(args.gpu_memory_gib)
    report = build_plan(cfg)
    plan = report.plan
    total = int(gib * GIB)
    from kame.frontend.config import MAX_BATCH_SIZE

    max_batch = min(plan.max_batch(total), MAX_BATCH_SIZE)
    batch = int(cfg.frontend.batch_size)
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
        "gpu_memory_gib": round(gib, 2),
        "gpu": card,
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
    print(f"checkpoint {cfg.frontend.checkpoint} ({report.frontend.origin}), weights {plan.dtype}")
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
    print(f"GPU {gib:.1f} GiB ({card}); headroom kept free: {plan.headroom.describe()} of what is counted")
    if max_batch == 0:
        print("largest batch that fits: none (not even one session)")
    else:
        most = " (frontend.batch_size's maximum)" if max_batch == MAX_BATCH_SIZE else ""
        print(f"largest batch that fits: {max_batch}{most} (needs {plan.needed_bytes(max_batch) / g:.1f} GiB "
              f"with the headroom)")
    verdict = "fits" if batch <= max_batch else "does NOT fit"
    print(f"frontend.batch_size {batch}: {verdict} (needs {plan.needed_bytes(batch) / g:.1f} GiB with the headroom)")
    return 0
