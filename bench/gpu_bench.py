"""GPU check: the real 7B front-end (random bf16 weights) and a Kyutai-STT-shaped model.

Run by ``bench/gpu_check.sh`` on a CUDA machine. Prints, per batch size, the
median engine tick (Mimi encode + LM step with oracle + Mimi decode) with CUDA
graphs on or off, with slots attached and detached during the run, and the
peak GPU memory; then the largest batch that stays under the 80 ms frame.

    python bench/gpu_bench.py [--batches 1,8,32,64] [--steps 60] [--graphs on|off|both] [--stt]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

from kame.versions import versions_line


def build_models(device: torch.device, stt: bool = False):  # type: ignore[no-untyped-def]
    """Real-size models with random weights (no checkpoint can reach the GPU box)."""
    from moshi.models import loaders

    from kame.frontend.checkpoint import CheckpointFiles
    from kame.frontend.models import FrontendModels

    lm_kwargs = dict(loaders._lm_kwargs)
    if stt:  # Kyutai STT 1B-like shape: 32 codebooks in, text out, no delays
        lm_kwargs.update({"dim": 2048, "num_heads": 16, "num_layers": 16, "n_q": 32, "dep_q": 0,
                          "text_card": 8000, "delays": [0] * 33, "depformer_num_layers": 0})
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device=device, dtype=torch.bfloat16)
    mimi = loaders.get_mimi(None, loaders._mimi_config, device=device, num_codebooks=32 if stt else 8)

    class _Tok:
        def encode(self, text: str) -> list[int]:
            return [10 + (ord(c) % 200) for c in text]

    files = CheckpointFiles(source="random", lm_weights=None, mimi_weights=None, tokenizer=None,  # type: ignore[arg-type]
                            lm_kwargs=lm_kwargs, lm_gen_config={})
    return FrontendModels(files=files, device=device, lm=lm, mimi=mimi, tokenizer=_Tok(),
                          oracle_weight=lm.text_emb.weight.detach().clone(), has_oracle=True)


def bench_frontend(batch: int, steps: int, device: torch.device) -> tuple[float, float, float]:
    from kame.frontend.config import FrontendConfig
    from kame.frontend.engine import EngineCore

    torch.cuda.reset_peak_memory_stats()
    models = build_models(device)
    cfg = FrontendConfig(checkpoint="random", batch_size=batch)
    core = EngineCore(models, cfg)
    for s in range(batch):
        core.attach(s)
    frame = (0.05 * np.random.default_rng(0).standard_normal(1920)).astype(np.float32)
    ids = [11, 12, 13, 14, 15, 16, 17, 18]
    times = []
    for i in range(steps):
        if i == steps // 3 and batch > 1:
            core.detach(batch - 1)  # a session leaves...
        if i == steps // 2 and batch > 1:
            core.attach(batch - 1)  # ...and a new one arrives mid-stream
        if i % 10 == 0:
            core.oracle_reset(0, ids[:2])
            core.oracle_push(0, ids[2:])
        frames = {s: frame for s in core.attached_slots()}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        core.tick(frames)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    warm = max(3, steps // 5)
    mem = torch.cuda.max_memory_allocated() / 2**30
    del core, models
    torch.cuda.empty_cache()
    return statistics.median(times[warm:]), max(times[warm:]), mem


def bench_stt(batch: int, steps: int, device: torch.device) -> float:
    from moshi.models.lm import LMGen

    models = build_models(device, stt=True)
    gen = LMGen(models.lm, temp=0.0, temp_text=0.0, support_out_of_sync=True)
    models.mimi.streaming_forever(batch)
    gen.streaming_forever(batch)
    pcm = torch.zeros(batch, 1, 1920, device=device)
    times = []
    with torch.no_grad():
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gen.step(models.mimi.encode(pcm))
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    del gen, models
    torch.cuda.empty_cache()
    return statistics.median(times[max(3, steps // 5) :])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--graphs", choices=["on", "off"], default="on")
    p.add_argument("--stt", action="store_true", help="Kyutai-STT-shaped model instead of the front-end.")
    args = p.parse_args()
    if args.graphs == "off":
        os.environ["NO_CUDA_GRAPH"] = "1"
    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device")
        return 1
    device = torch.device("cuda")
    print(f"# gpu_bench: {versions_line()} gpu={torch.cuda.get_device_name()} graphs={args.graphs} stt={args.stt}")
    best = 0
    for b in [int(x) for x in args.batches.split(",")]:
        if args.stt:
            med = bench_stt(b, args.steps, device)
            print(f"stt batch {b:>3}: {med * 1e3:7.2f} ms per tick")
        else:
            med, worst, mem = bench_frontend(b, args.steps, device)
            print(f"frontend batch {b:>3}: median {med * 1e3:7.2f} ms, max {worst * 1e3:7.2f} ms, peak mem {mem:6.1f} GiB")
        if med < 0.08:
            best = b
    print(f"largest batch under 80 ms: {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
