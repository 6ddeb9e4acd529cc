"""Host memory while loading an LM checkpoint: kame's loader vs reading the whole file.

A float32 release checkpoint loaded as bf16 must never sit whole in host
memory in float32 (the KAME release is ~32 GB in float32). kame reads,
splits, casts and moves tensors one at a time; this bench checks that by
loading in a FRESH subprocess per measurement and sampling the process's
anonymous resident memory (``RssAnon`` in ``/proc/self/status``: heap and
anonymous mappings, not the page cache of the mmapped file) every
millisecond during the load. It prints, per case: file size, loaded model
size, peak anonymous memory above the level before the load, and the same
for safetensors' ``load_file`` of the whole file followed by a cast (what
kame did before). ``load_file`` maps the file, so its float32 copy shows as
resident file pages (page cache charged to the process's cgroup) rather
than anonymous memory: both peaks are printed.

    .venv/bin/python bench/load_memory.py [--checkpoint DIR] [--dtype bfloat16] [--device cpu] [--weights int8]

Without ``--checkpoint`` it writes a ~0.9 GB float32 LM in Kyutai's release
layout (random weights, moshi's 7B vocabulary and depformer shape, fewer and
narrower layers) into a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")

MIB = 1024 * 1024

#: The measured child: loads, samples RssAnon in a thread, prints one JSON line.
CHILD = r"""
import json, os, sys, threading, time
os.environ.setdefault("NO_TORCH_COMPILE", "1")
import torch
from kame.frontend.checkpoint import resolve_checkpoint
from kame.frontend.loading import load_lm, resolve_device, resolve_dtype

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "VmRSS:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out

def rss_anon():
    return status()["RssAnon"]

def rss():
    return status()["VmRSS"]

mode, ckpt, dtype_name, device_name, weights = sys.argv[1:6]
files = resolve_checkpoint(ckpt)
device = resolve_device(device_name)
dtype = resolve_dtype(dtype_name, device)
if weights == "int8":  # its import (torch's compiler stack: a few hundred MiB) is not the load's
    from kame.frontend.quantized import require_bitsandbytes
    require_bitsandbytes(ckpt)
peak = [0]
peak_rss = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        now = status()
        peak[0] = max(peak[0], now["RssAnon"])
        peak_rss[0] = max(peak_rss[0], now["VmRSS"])
        time.sleep(0.001)
base = rss_anon()
base_rss = rss()
thread = threading.Thread(target=sample, daemon=True)
thread.start()
t0 = time.perf_counter()
if mode == "kame":
    loaded = load_lm(files, device, dtype, weights=weights)
    tensors = list(loaded.lm.state_dict().values()) + [loaded.oracle_weight]
else:
    from safetensors.torch import load_file
    state = load_file(str(files.lm_weights))
    tensors = [v.to(device=device, dtype=dtype) if v.dtype.is_floating_point else v for v in state.values()]
    del state
elapsed = time.perf_counter() - t0
stop.set()
thread.join()
peak[0] = max(peak[0], rss_anon())
peak_rss[0] = max(peak_rss[0], rss())
model_bytes = sum(t.numel() * t.element_size() for t in tensors)
print(json.dumps({"base": base, "peak": peak[0], "base_rss": base_rss, "peak_rss": peak_rss[0],
                  "model_bytes": model_bytes, "seconds": elapsed}))
"""


def write_bench_checkpoint(directory: Path) -> Path:
    """A float32 LM in the release layout, big enough for memory to be visible."""
    import torch
    from moshi.models import loaders
    from safetensors.torch import save_file

    from kame.frontend.release_layout import fuse_state_dict
    from kame.frontend.tiny import make_tiny_checkpoint, tiny_lm_kwargs

    tiny = make_tiny_checkpoint(directory / "tiny", seed=0)
    out = directory / "ckpt"
    out.mkdir()
    for name in ("mimi.safetensors", "mimi_config.json", "tokenizer.model"):
        shutil.copy(tiny / name, out / name)
    kwargs = tiny_lm_kwargs()
    kwargs.update(
        {
            "dim": 1024,
            "num_heads": 8,
            "num_layers": 4,
            "text_card": 32000,
            "card": 2048,
            "depformer_dim": 512,
            "depformer_num_heads": 8,
            "depformer_num_layers": 2,
            "depformer_dim_feedforward": 2048,
        }
    )
    torch.manual_seed(0)
    lm = loaders.get_moshi_lm(None, lm_kwargs=kwargs, device="cpu", dtype=torch.float32)
    state = fuse_state_dict(lm, {k: v.contiguous() for k, v in lm.state_dict().items()})
    state["oracle_emb.weight"] = torch.randn_like(state["text_emb.weight"])
    save_file(state, str(out / "model.safetensors"))
    del lm, state
    config = json.loads((tiny / "config.json").read_text())
    config.update(kwargs)
    (out / "config.json").write_text(json.dumps(config))
    return out


def measure(mode: str, ckpt: Path, dtype: str, device: str, weights: str = "bf16") -> dict[str, float]:
    res = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(ckpt), dtype, device, weights],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise SystemExit(f"{mode} load failed:\n{res.stderr[-2000:]}")
    data: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--checkpoint", type=Path, help="A checkpoint directory (default: write a ~0.9 GB one).")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32", "auto"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--weights", default="bf16", choices=("bf16", "int8"),
                    help="frontend.weights for kame's load (int8: moshi's 8-bit linears, quantized as read).")
    ap.add_argument("--skip-whole-file", action="store_true", help="Do not measure the whole-file baseline.")
    args = ap.parse_args()

    from kame.frontend.checkpoint import resolve_checkpoint
    from kame.versions import versions_line

    tmp = None
    ckpt = args.checkpoint
    if ckpt is None:
        tmp = Path(tempfile.mkdtemp(prefix="kame-load-bench-"))
        ckpt = write_bench_checkpoint(tmp)
    try:
        lm_file = resolve_checkpoint(str(ckpt)).lm_weights
        size = lm_file.stat().st_size
        print(versions_line())
        print(f"checkpoint {ckpt}: LM file {size / MIB:.1f} MiB, loading as {args.dtype} on {args.device}, "
              f"{args.weights} weights")
        modes = ["kame"] if args.skip_whole_file else ["kame", "whole-file"]
        for mode in modes:
            r = measure(mode, ckpt, args.dtype, args.device, args.weights)
            extra = (r["peak"] - r["base"]) / MIB
            model = r["model_bytes"] / MIB
            on_host = args.device == "cpu"
            over = extra - model if on_host else extra
            print(
                f"{mode:>10}: peak anonymous host memory +{extra:8.1f} MiB during the load "
                f"(file {size / MIB:.1f} MiB, loaded model {model:.1f} MiB"
                f"{', on the host' if on_host else ', on the device'}; "
                f"beyond the model: {over:.1f} MiB = {over / (size / MIB):.2f} x file) in {r['seconds']:.2f} s"
            )
            print(
                f"{'':>10}  peak resident (anonymous + file pages mapped) +{(r['peak_rss'] - r['base_rss']) / MIB:8.1f} MiB"
            )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
