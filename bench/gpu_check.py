"""The GPU check as one run: checkpoints, engine ticks per batch, the STT beside, a real server.

Run by ``run.sh`` of a folder that ``bench/gpu_check.sh --prepare DIR`` wrote (or from a checkout
with kame installed). Each phase runs in its own subprocess with its own time limit, so an
out-of-memory error (even during CUDA graph capture) or a hang ends only that batch; the result
file is rewritten after every phase, so a run cut short still leaves what it measured.

    python bench/gpu_check.py all --out gpu_check.json [--smoke] [--budget-s 340]

``--smoke``: the same code on CPU with tiny checkpoints and short phases (what the test runs).
Sub-commands ``checkpoint`` and ``ticks`` are what ``all`` starts in its subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FRAME_S = 0.08
FRAME = 1920
#: Real sizes: moshi's defaults are the released 7B front-end; the STT is Kyutai STT 1B's shape.
STT_1B = {"dim": 2048, "num_heads": 16, "num_layers": 16, "hidden_scale": 4.125, "n_q": 32, "dep_q": 0,
          "text_card": 8000, "delays": [0] * 33, "depformer_num_layers": 0, "extra_heads_num_heads": 4,
          "extra_heads_dim": 6}


# ---------------------------------------------------------------------------------------------- checkpoints
def write_real_checkpoint(directory: Path, *, stt: bool, device: str, layers: int | None = None) -> None:
    """A random-weight checkpoint of the released size in the released layout (bf16 safetensors);
    ``layers``: fewer transformer layers, same width (a dry run of this path on a CPU)."""
    import copy

    import torch
    from moshi.models import loaders
    from safetensors.torch import save_file

    from kame.frontend.release_layout import fuse_state_dict
    from kame.frontend.tiny import LM_GEN_CONFIG, train_tokenizer

    directory.mkdir(parents=True)
    torch.manual_seed(0)
    lm_kwargs = copy.deepcopy(loaders._lm_kwargs)
    if stt:
        lm_kwargs.update(STT_1B)
    if layers is not None:
        lm_kwargs["num_layers"] = layers
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device=device, dtype=torch.bfloat16)
    state = fuse_state_dict(lm, {k: v.contiguous() for k, v in lm.state_dict().items()})
    if not stt:
        w = state["text_emb.weight"]
        state["oracle_emb.weight"] = torch.randn(w.shape, device=w.device, dtype=w.dtype)
    save_file({k: v.cpu() for k, v in state.items()}, str(directory / "model.safetensors"))
    del lm, state
    mimi = loaders.get_mimi(None, loaders._mimi_config, device=device, num_codebooks=32)
    for name, buf in mimi.named_buffers():  # random codebooks are all zero until initialised
        if name.endswith("embedding_sum"):
            buf.normal_(0, 0.1)
        elif name.endswith("cluster_usage") or name.endswith("_initialized"):
            buf.fill_(1)
    mimi_state = fuse_state_dict(mimi, {k: v.contiguous() for k, v in mimi.state_dict().items()})
    save_file({k: v.cpu() for k, v in mimi_state.items()}, str(directory / "mimi.safetensors"))
    (directory / "mimi_config.json").write_text(json.dumps(loaders._mimi_config))
    train_tokenizer(directory / "tokenizer.model")
    config: dict[str, Any] = {"moshi_name": "model.safetensors", "mimi_name": "mimi.safetensors",
                              "mimi_config_name": "mimi_config.json", "tokenizer_name": "tokenizer.model",
                              "model_type": "stt" if stt else "moshi", "lm_gen_config": dict(LM_GEN_CONFIG), **lm_kwargs}
    if stt:
        config["stt_config"] = {"audio_silence_prefix_seconds": 0.0, "audio_delay_seconds": 0.5}
    (directory / "config.json").write_text(json.dumps(config))


def cmd_checkpoint(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    if (out / "config.json").is_file():
        return 0
    if args.smoke:
        from kame.frontend.tiny import write_tiny_checkpoint

        write_tiny_checkpoint(out, 0, stt=args.stt)
    else:
        write_real_checkpoint(out, stt=args.stt, device=args.device, layers=args.layers)
    return 0


# ---------------------------------------------------------------------------------------------- engine ticks
def cmd_ticks(args: argparse.Namespace) -> int:
    """Engine ticks at one batch size through kame's loader, as the server's engine thread steps them.

    Besides full ticks: ticks that step only some slots (frames arriving at other phases), a slot
    detached and a new one attached mid-run, per-slot text sampling on half the slots (the
    text-logits hook), oracle sequences; with ``--stt``, the shared Kyutai STT on every slot.
    """
    import torch

    from kame.frontend.config import FrontendConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.moshi_gate import compiled_graphs
    from kame.frontend.warmup import warm_up_engine

    device = torch.device(args.device)
    cfg = FrontendConfig(checkpoint=args.ckpt, batch_size=args.batch, cuda_graphs=args.graphs == "on")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t_load = time.perf_counter()
    stt = None
    models = load_frontend(cfg, device, mimi_codebooks=32 if args.stt_ckpt else None)
    if args.stt_ckpt:
        from kame.asr.kyutai_core import SttCore
        from kame.frontend.checkpoint import resolve_checkpoint

        stt = SttCore(resolve_checkpoint(args.stt_ckpt, None), device, args.batch, own_mimi=False)
    core = EngineCore(models, cfg, stt=stt)
    load_s = time.perf_counter() - t_load
    # as the server does: compile and graph capture before the timed ticks; a failure to compile runs eager
    warmup_s = warm_up_engine(core, 3)
    b = args.batch
    for s in range(b):
        core.attach(s)
        if stt is not None:
            core.stt_attach(s)
        if s % 2 == 1:
            core.set_slot_sampling(s, 0.5, 10)
    rng = np.random.default_rng(b)
    frame = (0.05 * rng.standard_normal(FRAME)).astype(np.float32)
    ids = list(range(20, 40))
    times: list[float] = []
    partial: list[float] = []
    warm = 5
    for i in range(args.steps + warm):
        if i == warm + args.steps // 3 and b > 1:
            core.detach(b - 1)
        if i == warm + args.steps // 2 and b > 1:
            core.attach(b - 1)  # a new session arrives mid-stream
        if i % 12 == 0:
            core.oracle_reset(i % b, ids[:2])
            core.oracle_push(i % b, ids[2:])
        slots = core.attached_slots()
        is_partial = i % 5 == 4 and len(slots) > 1
        if is_partial:  # frames of the other half arrive at another phase: a tick of some slots only
            slots = slots[::2]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        core.tick({s: frame for s in slots})
        if cuda:
            torch.cuda.synchronize()
        if i >= warm:
            (partial if is_partial else times).append(time.perf_counter() - t0)
    result = {
        "batch": b, "graphs": args.graphs, "stt": bool(args.stt_ckpt), "load_s": round(load_s, 2),
        "warmup_s": round(warmup_s, 2), "compile": core.mode.compile, "compiled_graphs": compiled_graphs(),
        "tick_p50_ms": round(1e3 * float(np.percentile(times, 50)), 2),
        "tick_p99_ms": round(1e3 * float(np.percentile(times, 99)), 2),
        "partial_tick_p50_ms": round(1e3 * float(np.percentile(partial, 50)), 2) if partial else None,
        "ticks": len(times),
    }
    if cuda:
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    core.close()
    Path(args.out).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- the orchestra
class Check:
    """The whole run: phases in subprocesses under one time budget; the result file after each."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.smoke = bool(args.smoke)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.out = Path(args.out).resolve()
        self.device = "cpu" if self.smoke else "cuda"
        self.result: dict[str, Any] = {"smoke": self.smoke, "device": self.device, "compile": not self.smoke,
                                       "batches": [], "graphs_off": [], "stt": None, "server": None,
                                       "largest_batch_under_80ms": 0, "largest_batch_p50_under_80ms": 0,
                                       "errors": []}
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.smoke:  # CPU: the engine turns compile off anyway; NO_TORCH_COMPILE covers the STT too
            self.env["NO_TORCH_COMPILE"] = "1"
            self.env.setdefault("OMP_NUM_THREADS", "1")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1))
        tmp.replace(self.out)

    def log(self, msg: str) -> None:
        print(f"[gpu_check {time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def sub(self, argv: list[str], timeout: float) -> tuple[int, str]:
        """Run this script with ``argv`` in a process of its own; (exit code, the output's tail)."""
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return 124, (out or "")[-2000:]
        return proc.returncode, (out or "")[-2000:]

    def checkpoints(self) -> bool:
        ok = True
        for name, stt in (("frontend", False), ("stt", True)):
            t = time.monotonic()
            rc, tail = self.sub(["checkpoint", "--dir", str(self.work / name), "--device", self.device,
                                 *(["--stt"] if stt else []), *(["--smoke"] if self.smoke else [])],
                                timeout=min(150.0, self.left()))
            self.result[f"checkpoint_{name}_s"] = round(time.monotonic() - t, 1)
            if rc != 0:
                self.result["errors"].append(f"checkpoint {name}: exit {rc}: {tail[-600:]}")
                ok = ok and stt  # without the STT the rest still runs
            self.log(f"checkpoint {name}: exit {rc} in {time.monotonic() - t:.0f} s")
            self.save()
        return ok

    def ticks(self, batch: int, graphs: str, *, stt: bool = False, timeout: float) -> dict[str, Any]:
        res_file = self.work / f"ticks-{batch}-{graphs}-{int(stt)}.json"
        res_file.unlink(missing_ok=True)
        argv = ["ticks", "--ckpt", str(self.work / "frontend"), "--batch", str(batch), "--graphs", graphs,
                "--steps", str(self.args.steps), "--device", self.device, "--out", str(res_file)]
        if stt:
            argv += ["--stt-ckpt", str(self.work / "stt")]
        t = time.monotonic()
        rc, tail = self.sub(argv, timeout=timeout)
        if rc == 0 and res_file.is_file():
            res: dict[str, Any] = json.loads(res_file.read_text())
        else:
            oom = "OutOfMemory" in tail or "out of memory" in tail
            res = {"batch": batch, "graphs": graphs, "stt": stt, "error": "out of memory" if oom else
                   ("timeout" if rc == 124 else f"exit {rc}"), "tail": tail[-800:]}
        res["wall_s"] = round(time.monotonic() - t, 1)
        self.log(f"ticks batch {batch} graphs {graphs} stt {stt}: " +
                 (f"p50 {res['tick_p50_ms']} ms p99 {res['tick_p99_ms']} ms" if "error" not in res else res["error"]))
        return res

    def run(self) -> int:
        """Growing batches first (the largest real-time batch), then the server at that batch, then the
        STT beside the engine, then graphs off: what is left out for lack of time is said in ``errors``."""
        a = self.args
        self.save()
        if not self.checkpoints():
            self.log("no front-end checkpoint: stopping")
            return 1
        server_s = a.server_seconds + (25 if self.smoke else 60)  # clients + start (load, warm-up) and stop
        limit = 60.0 if self.smoke else 90.0  # one batch's process at most
        estimate = limit  # the next batch's expected wall time: the last one's, with margin
        for b in [int(x) for x in a.batches.split(",")]:
            if self.left() - server_s < estimate:
                self.result["errors"].append(f"batch {b} and above: skipped, no time left")
                break
            res = self.ticks(b, "on", timeout=min(limit, self.left() - server_s))
            self.result["batches"].append(res)
            estimate = min(limit, 1.3 * res["wall_s"])
            if "error" not in res and res["tick_p99_ms"] < 80:  # every tick fits in a frame
                self.result["largest_batch_under_80ms"] = max(self.result["largest_batch_under_80ms"], b)
            if "error" not in res and res["tick_p50_ms"] < 80:
                self.result["largest_batch_p50_under_80ms"] = max(self.result["largest_batch_p50_under_80ms"], b)
            self.save()
            if res.get("error") == "out of memory" or ("error" not in res and res["tick_p50_ms"] >= 80):
                break  # a larger batch cannot do better
        best = self.result["largest_batch_under_80ms"] or 1
        if self.left() > a.server_seconds + 20:
            self.result["server"] = self.server(best)
        else:
            self.result["errors"].append("server run: skipped, no time left")
        self.save()
        if self.left() > estimate:
            self.result["stt"] = self.ticks(best, "on", stt=True, timeout=min(limit, self.left()))
        else:
            self.result["errors"].append("STT beside the engine: skipped, no time left")
        self.save()
        for b in [int(x) for x in a.graphs_off_batches.split(",")]:
            if self.left() < estimate:
                self.result["errors"].append(f"graphs off at batch {b}: skipped, no time left")
                break
            self.result["graphs_off"].append(self.ticks(b, "off", timeout=min(limit, self.left())))
            self.save()
        self.log(f"done: largest batch under 80 ms {self.result['largest_batch_under_80ms']}, results in {self.out}")
        return 0

    # ------------------------------------------------------------------ the server
    def server(self, sessions: int) -> dict[str, Any]:
        port = free_port()
        cfg = self.work / "serve.yaml"
        cfg.write_text(json.dumps({
            "device": self.device,
            "frontend": {"checkpoint": str(self.work / "frontend"), "batch_size": sessions},
            "asr": {"kind": "none"},
            "server": {"host": "127.0.0.1", "port": port},
            "backends": {"scripted": {"kind": "scripted"}},
        }))
        log_path = self.work / "serve.log"
        t = time.monotonic()
        with log_path.open("w") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "kame.cli", "serve", "--config", str(cfg)], stdout=log_file,
                                    stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        out: dict[str, Any] = {"sessions": sessions}
        try:
            base = f"http://127.0.0.1:{port}"
            ready = wait_ready(base, proc, timeout=min(120.0, self.left() - self.args.server_seconds - 5))
            out["start_s"] = round(time.monotonic() - t, 1)
            if not ready:
                out["error"] = "server not ready"
                return out
            self.log(f"server ready in {out['start_s']} s; {sessions} Realtime clients for {self.args.server_seconds} s")
            before = scrape(base)
            t_clients = time.monotonic()
            out.update(asyncio.run(asyncio.wait_for(drive_realtime(base, sessions, self.args.server_seconds),
                                                    self.args.server_seconds + 45)))
            wall = time.monotonic() - t_clients
            after = scrape(base)
            cpu = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            out["thread_cpu_pct_of_core"] = {k: round(100 * v / wall, 2) for k, v in sorted(cpu.items())}
            # per real-time session: CPU seconds over the seconds of audio the sessions received
            audio_s = float(out.get("audio_received_s") or 0.0)
            if audio_s > 0:
                out["thread_cpu_pct_per_session"] = {k: round(100 * v / audio_s, 3) for k, v in sorted(cpu.items())}
            self.log(f"server: {json.dumps({k: out.get(k) for k in ('rtf_min', 'lateness_p99_ms', 'first_audio_median_ms')})}")
        except Exception as exc:  # noqa: BLE001 - the result file says what broke
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            out["log_tail"] = log_path.read_text(errors="replace")[-1500:] if "error" in out else None
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(base + "/ready", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def scrape(base: str) -> dict[str, float]:
    """``kame_thread_cpu_seconds_total`` by thread group from /metrics."""
    import urllib.request

    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        body = r.read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("kame_thread_cpu_seconds_total{"):
            group = line.split('thread="', 1)[1].split('"', 1)[0]
            out[group] = float(line.split()[-1])
    return out


async def drive_realtime(base: str, n: int, seconds: float) -> dict[str, Any]:
    """``n`` Realtime clients streaming noise at real time, their starts spread over one frame
    (frames reach the engine at different phases); RTF, lateness and first audio over all."""
    from kame.client.realtime_client import RealtimeClient

    url = base.replace("http", "ws", 1) + "/v1/realtime"

    async def one(i: int) -> RealtimeClient | None:
        await asyncio.sleep(i * FRAME_S / max(1, n) + 0.02 * i)
        client = await RealtimeClient.connect(url, keep_audio=False)
        pcm = (0.05 * np.random.default_rng(i).standard_normal(int(seconds * 24000))).astype(np.float32)
        if await client.wait_for_type("session.created", 30):
            await client.send_pcm(pcm, chunk=FRAME)
            await client.drain_output(2.0)
        await client.close()
        return client

    clients = await asyncio.gather(*[one(i) for i in range(n)], return_exceptions=True)
    ok = [c for c in clients if isinstance(c, RealtimeClient) and c.stats.frame_arrivals]
    errors = [f"{type(c).__name__}: {c}" for c in clients if isinstance(c, BaseException)]
    if not ok:
        return {"error": "no session got audio", "client_errors": errors[:3]}
    late = [x for c in ok for x in c.stats.lateness_s()]
    ttfa = [c.stats.time_to_first_audio_s for c in ok if c.stats.time_to_first_audio_s is not None]
    return {
        "sessions_with_audio": len(ok),
        "audio_received_s": round(sum(c.stats.audio_received_s for c in ok), 1),
        "rtf_min": round(min(c.stats.rtf for c in ok), 3),
        "rtf_mean": round(statistics.mean(c.stats.rtf for c in ok), 3),
        "lateness_p99_ms": round(1e3 * float(np.percentile(late, 99)), 1) if late else None,
        "first_audio_median_ms": round(1e3 * statistics.median(ttfa), 0) if ttfa else None,
        "client_errors": errors[:3],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", default="gpu_check.json")
    a.add_argument("--work", default=os.environ.get("GPU_CHECK_WORK", "/tmp/kame-gpu-check"))
    a.add_argument("--smoke", action="store_true")
    a.add_argument("--budget-s", type=float, default=None, help="Whole run (default 345 s; smoke 270 s).")
    a.add_argument("--batches", default=None)
    a.add_argument("--graphs-off-batches", default=None)
    a.add_argument("--steps", type=int, default=None)
    a.add_argument("--server-seconds", type=float, default=None)
    c = sub.add_parser("checkpoint")
    c.add_argument("--dir", required=True)
    c.add_argument("--stt", action="store_true")
    c.add_argument("--smoke", action="store_true")
    c.add_argument("--device", default="cuda")
    c.add_argument("--layers", type=int, default=None, help="Fewer layers at the released width (a CPU dry run).")
    t = sub.add_parser("ticks")
    t.add_argument("--ckpt", required=True)
    t.add_argument("--stt-ckpt", default=None)
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--graphs", choices=("on", "off"), default="on")
    t.add_argument("--steps", type=int, default=40)
    t.add_argument("--device", default="cuda")
    t.add_argument("--out", required=True)
    args = p.parse_args()
    if args.cmd == "checkpoint":
        return cmd_checkpoint(args)
    if args.cmd == "ticks":
        return cmd_ticks(args)
    smoke = args.smoke
    defaults = {"budget_s": 270.0 if smoke else 345.0, "batches": "1,2,4" if smoke else "1,8,16,32,48,64",
                "graphs_off_batches": "1" if smoke else "1,8", "steps": 15 if smoke else 40,
                "server_seconds": 10.0 if smoke else 60.0}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not smoke:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device (use --smoke for the CPU run)", file=sys.stderr)
            return 2
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
