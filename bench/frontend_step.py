"""Front-end step cost: our engine (oracle active) vs moshi's bare LMGen, and batch scaling.

Prints, measured in one run on the tiny model (or ``--checkpoint``):
  * median tick of our engine at batch 1 with an oracle sequence being fed,
    vs the same work done with moshi's own objects (Mimi encode + LMGen.step +
    Mimi decode, no oracle) -> overhead in % (target <= 5 %);
  * per-tick time at batch 1, 4, 8, 16 with every slot stepping
    (target: batch 16 <= 2x batch 1);
  * real-time factor of one session on one CPU thread (target >= 2x).
Measurements alternate between the two contestants to share the machine's noise.

    .venv/bin/python bench/frontend_step.py [--quick] [--checkpoint DIR] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kame.audio.media import FRAME_SIZE
from kame.frontend.config import FrontendConfig  # noqa: E402
from kame.frontend.engine import EngineCore  # noqa: E402
from kame.frontend.models import load_frontend  # noqa: E402
from kame.frontend.tiny import ensure_tiny_checkpoint  # noqa: E402
from kame.versions import versions_line  # noqa: E402

FRAME = FRAME_SIZE


def _frame(i: int) -> np.ndarray:
    t = np.arange(FRAME) / 24000
    return (0.1 * np.sin(2 * np.pi * (150 + 10 * (i % 30)) * t)).astype(np.float32)


class MoshiBaseline:
    """moshi's own streaming objects at batch 1, no kame code in the loop."""

    def __init__(self, ckpt: Path, device: torch.device) -> None:
        from moshi.models import loaders
        from moshi.models.lm import LMGen

        cfg = ckpt / "config.json"
        info = loaders.CheckpointInfo.from_hf_repo(
            "local/unused",
            moshi_weights=ckpt / "model.safetensors",
            mimi_weights=ckpt / "mimi.safetensors",
            tokenizer=ckpt / "tokenizer.model",
            config_path=cfg,
            mimi_config_path=ckpt / "mimi_config.json" if (ckpt / "mimi_config.json").exists() else None,
        )
        self.lm = loaders.get_moshi_lm(None, info.lm_config, device=device, dtype=torch.float32)
        self.mimi = info.get_mimi(device)
        self.gen = LMGen(self.lm, **info.lm_gen_config)
        self.device = device
        self.mimi.streaming_forever(1)
        self.gen.streaming_forever(1)

    def step(self, pcm: np.ndarray) -> None:
        with torch.no_grad():
            codes = self.mimi.encode(torch.from_numpy(pcm).to(self.device)[None, None])
            out = self.gen.step(codes)
            if out is not None:
                self.mimi.decode(out[:, 1:])


def _timed(fn, *args) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def bench_overhead(ckpt: Path, device: torch.device, steps: int) -> tuple[float, float]:
    from moshi.utils.compile import no_compile

    cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=1)
    core = EngineCore(load_frontend(cfg, device), cfg)
    core.attach(0)
    ids = core.models.encode_text("The capital of France is Paris, a city known for art and food.")
    with no_compile():
        base = MoshiBaseline(ckpt, device)
        ours_t, base_t = [], []
        for i in range(steps):
            if i % 20 == 0:  # keep an oracle sequence flowing the whole time
                core.oracle_reset(0, ids[:3])
                core.oracle_push(0, ids[3:])
            f = _frame(i)
            if i % 2:
                ours_t.append(_timed(core.tick, {0: f}))
                base_t.append(_timed(base.step, f))
            else:
                base_t.append(_timed(base.step, f))
                ours_t.append(_timed(core.tick, {0: f}))
    warm = min(5, steps // 4)
    return statistics.median(ours_t[warm:]), statistics.median(base_t[warm:])


def bench_batches(ckpt: Path, device: torch.device, batches: list[int], steps: int,
                  threads: int | None = None) -> dict[int, float]:
    out: dict[int, float] = {}
    for b in batches:
        cfg = FrontendConfig(checkpoint=str(ckpt), batch_size=b, cpu_threads=threads)
        core = EngineCore(load_frontend(cfg, device), cfg)
        for s in range(b):
            core.attach(s)
        times = []
        for i in range(steps):
            frames = {s: _frame(i + s) for s in range(b)}
            times.append(_timed(core.tick, frames))
        out[b] = statistics.median(times[min(5, steps // 4) :])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="Fewer steps (CI).")
    p.add_argument("--checkpoint", type=Path, default=None, help="Checkpoint dir (default: tiny, made in a temp dir).")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the batch sweep (default: frontend.cpu_threads).")
    args = p.parse_args()
    device = torch.device(args.device)
    print(f"# frontend_step: {versions_line()} device={device} threads={torch.get_num_threads()}")
    ckpt = args.checkpoint or ensure_tiny_checkpoint(Path(os.environ.get("KAME_CACHE_DIR") or tempfile.gettempdir()) / "kame-bench", 0)
    steps = 40 if args.quick else 200

    ours, base = bench_overhead(ckpt, device, steps)
    print(f"batch 1 tick, oracle active: kame {ours * 1e3:.2f} ms vs moshi LMGen+Mimi {base * 1e3:.2f} ms "
          f"-> overhead {100 * (ours / base - 1):+.1f} % (target <= 5 %)")

    threads = args.threads or FrontendConfig.model_fields["cpu_threads"].default
    batches = bench_batches(ckpt, device, [1, 4, 8, 16], steps // 2, threads)
    print(f"per tick, every slot stepping, {threads} torch thread(s) (frontend.cpu_threads):")
    for b, t in batches.items():
        print(f"batch {b:>2}: {t * 1e3:.2f} ms per tick ({t / b * 1e3:.2f} ms per session)")
    print(f"batch 16 / batch 1 = {batches[16] / batches[1]:.2f}x (target <= 2x)")

    if device.type == "cpu":
        threads = torch.get_num_threads()
        one = bench_batches(ckpt, device, [1], steps // 2, threads=1)[1]
        torch.set_num_threads(threads)
        print(f"one CPU thread, batch 1: {one * 1e3:.2f} ms per 80 ms frame -> {0.08 / one:.1f}x real time (target >= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
