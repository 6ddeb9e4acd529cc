"""The GPU check as one run: the checkpoint written and loaded once, the ceiling searched in that process.

Run by ``run.sh`` of a folder that ``bench/gpu_check.sh --prepare DIR`` wrote (or from a checkout
with kame installed). A worker process writes the random-weight checkpoints, loads them once and
measures batch sizes as told (the plan's largest first: ``bench/gpu_check_schedule.py`` decides what
runs and what is dropped when time runs short); a hang or crash ends only the worker. Then a real
``kame serve`` at the batch found, bounded by the deadline, sharing the worker's compiled kernels
(one inductor cache). The result file is rewritten after every stage.

    python bench/gpu_check.py all --out gpu_check.json [--smoke] [--budget-s 345]

``--smoke``: the same code on CPU with tiny checkpoints (what the test runs). Without torch, numpy, or
with a Python other than the one the wheels were prepared for, gpu_check.json says what is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_schedule as schedule  # noqa: E402 - beside this script, standard library only

FRAME_S = 0.08
FRAME = 1920
#: Real sizes: moshi's defaults are the released 7B front-end; the STT is Kyutai STT 1B's shape, at its own
#: context (750 frames; moshi's default 3000 would measure a cache four times too large).
STT_1B = {"dim": 2048, "num_heads": 16, "num_layers": 16, "hidden_scale": 4.125, "n_q": 32, "dep_q": 0,
          "text_card": 8000, "delays": [0] * 33, "depformer_num_layers": 0, "extra_heads_num_heads": 4,
          "extra_heads_dim": 6, "context": 750, "max_period": 100000}
MARK = "@@gpu_check "  #: a worker's result line on its stdout


# ---------------------------------------------------------------------------------------------- preflight
def preflight(smoke: bool, python_expected: str | None) -> dict[str, Any] | None:
    """What this box lacks for the check (None: nothing): Python version the wheels were built for, torch,
    numpy, CUDA. Standard library only, so it can say so on a box that has none of them."""
    import importlib.util

    missing: list[str] = []
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python_expected and python_expected != have:
        missing.append(f"python {python_expected} (the prepared wheels are for it; this box runs {have}: "
                       f"prepare again with --python-version {have})")
    for mod in ("torch", "numpy"):
        if importlib.util.find_spec(mod) is None:
            missing.append(mod)
    if not missing and not smoke:
        try:
            import torch

            if not torch.cuda.is_available():
                missing.append("a CUDA device (torch.cuda.is_available() is False; --smoke runs on CPU)")
        except Exception as exc:  # noqa: BLE001 - a broken torch is a missing torch
            missing.append(f"a working torch ({type(exc).__name__}: {exc})")
    if not missing:
        return None
    return {"ok": False, "python": sys.version.split()[0], "missing": missing,
            "error": "gpu_check cannot run here: missing " + "; ".join(missing)}


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


# ---------------------------------------------------------------------------------------------- the worker
class Worker:
    """The checkpoints loaded once; batch sizes measured on request (the engine rebuilt per batch, the
    models kept), as the server's engine thread steps them."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.ckpt = str(Path(args.work) / "frontend")
        self.stt_ckpt = str(Path(args.work) / "stt")
        self.models: Any = None
        self.weights = "bf16"

    def emit(self, kind: str, **data: Any) -> None:
        print(MARK + json.dumps({"kind": kind, **data}), flush=True)

    def write_checkpoints(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, stt in (("frontend", False), ("stt", True)):
            t = time.perf_counter()
            d = Path(self.args.work) / name
            try:
                if not (d / "config.json").is_file():
                    if self.args.smoke:
                        from kame.frontend.tiny import write_tiny_checkpoint

                        write_tiny_checkpoint(d, 0, stt=stt)
                    else:
                        write_real_checkpoint(d, stt=stt, device=self.args.device)
            except Exception as exc:  # noqa: BLE001 - without the STT the rest still runs
                out[f"checkpoint_{name}_error"] = f"{type(exc).__name__}: {exc}"[:600]
                if not stt:
                    raise
            out[f"checkpoint_{name}_s"] = round(time.perf_counter() - t, 1)
        return out

    def plan_max(self) -> tuple[int, dict[str, Any]]:
        """The memory plan's largest batch on this card now (the function the server's refusal calls)."""
        if self.args.smoke:
            return int(self.args.plan_max or 4), {"plan": "smoke: --plan-max"}
        import torch

        from kame.config import KameConfig
        from kame.frontend.memory_plan import largest_batch
        from kame.frontend.plan_models import build_plan

        free, total = torch.cuda.mem_get_info()
        cfg = KameConfig.model_validate({"frontend": {"checkpoint": self.ckpt},
                                         "asr": {"kind": "kyutai", "model": self.stt_ckpt, "share_engine": True}})
        plan = build_plan(cfg, weights=self.weights).plan
        n = largest_batch(plan, free)
        if self.args.plan_max:
            n = min(n, int(self.args.plan_max))
        return n, {"free_gib": round(free / 2**30, 2), "total_gib": round(total / 2**30, 2),
                   "plan_weights_gib": round(plan.weight_bytes / 2**30, 2),
                   "plan_kv_gib_per_slot": round(plan.kv_bytes_per_slot / 2**30, 4), "plan_max": n}

    def load(self, weights: str = "bf16") -> float:
        import torch

        from kame.frontend.config import FrontendConfig
        from kame.frontend.models import load_frontend

        t = time.perf_counter()
        self.models = None
        if self.cuda:
            torch.cuda.empty_cache()
        extra = {"weights": weights} if weights != "bf16" else {}
        cfg = FrontendConfig(checkpoint=self.ckpt, batch_size=1, **extra)
        stt_ok = (Path(self.stt_ckpt) / "config.json").is_file()
        self.models = load_frontend(cfg, self.device, mimi_codebooks=32 if stt_ok else None)
        self.weights = weights
        return time.perf_counter() - t

    def _core(self, batch: int, *, graphs: bool = True, stt: bool = False, sampling: dict[str, Any] | None = None) -> Any:
        from kame.frontend.config import FrontendConfig
        from kame.frontend.engine import EngineCore
        from kame.frontend.oracle_input import remove_oracle_input

        extra: dict[str, Any] = {"weights": self.weights} if self.weights != "bf16" else {}
        if sampling is not None:
            extra["sampling"] = sampling
        cfg = FrontendConfig(checkpoint=self.ckpt, batch_size=batch, cuda_graphs=graphs, **extra)
        remove_oracle_input(self.models.lm)  # the previous batch's engine installed its own
        stt_core = None
        if stt:
            from kame.asr.kyutai_core import SttCore
            from kame.frontend.checkpoint import resolve_checkpoint

            stt_core = SttCore(resolve_checkpoint(self.stt_ckpt, None), self.device, batch, own_mimi=False)
        return EngineCore(self.models, cfg, stt=stt_core)

    def _free(self, core: Any) -> None:
        import gc

        import torch

        if core is not None:
            core.close()
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def ticks(self, batch: int, *, graphs: bool = True, stt: bool = False) -> dict[str, Any]:
        """Warm-up (compile, graph capture), then timed ticks: full ones, ticks of some slots only (frames
        arriving at other phases), a slot detached and a new one attached mid-run, per-slot text sampling on
        half the slots, oracle sequences; with ``stt``, the shared Kyutai STT on every slot."""
        import numpy as np
        import torch

        from kame.frontend.moshi_gate import compiled_graphs
        from kame.frontend.warmup import warm_up_engine

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        core = None
        t0 = time.perf_counter()
        try:
            core = self._core(batch, graphs=graphs, stt=stt)
            warmup_s = warm_up_engine(core, 3)
            b = batch
            for s in range(b):
                core.attach(s)
                if stt:
                    core.stt_attach(s)
                if s % 2 == 1:
                    core.set_slot_sampling(s, 0.5, 10)
            rng = np.random.default_rng(b)
            frame = (0.05 * rng.standard_normal(FRAME)).astype(np.float32)
            ids = list(range(20, 40))
            times: list[float] = []
            partial: list[float] = []
            warm = 5
            steps = int(self.args.steps)
            for i in range(steps + warm):
                if i == warm + steps // 3 and b > 1:
                    core.detach(b - 1)
                if i == warm + steps // 2 and b > 1:
                    core.attach(b - 1)  # a new session arrives mid-stream
                if i % 12 == 0:
                    core.oracle_reset(i % b, ids[:2])
                    core.oracle_push(i % b, ids[2:])
                slots = core.attached_slots()
                is_partial = i % 5 == 4 and len(slots) > 1
                if is_partial:
                    slots = slots[::2]
                if self.cuda:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                core.tick({s: frame for s in slots})
                if self.cuda:
                    torch.cuda.synchronize()
                if i >= warm:
                    (partial if is_partial else times).append(time.perf_counter() - t)
            res: dict[str, Any] = {
                "batch": b, "graphs": "on" if graphs else "off", "stt": stt, "weights": self.weights,
                "warmup_s": round(warmup_s, 2), "compile": core.mode.compile, "compiled_graphs": compiled_graphs(),
                "tick_p50_ms": round(1e3 * float(np.percentile(times, 50)), 2),
                "tick_p99_ms": round(1e3 * float(np.percentile(times, 99)), 2),
                "partial_tick_p50_ms": round(1e3 * float(np.percentile(partial, 50)), 2) if partial else None,
                "ticks": len(times),
            }
        except Exception as exc:  # noqa: BLE001 - out of memory (even in graph capture) ends this batch only
            oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)
            res = {"batch": batch, "graphs": "on" if graphs else "off", "stt": stt, "weights": self.weights,
                   "error": "out of memory" if oom else f"{type(exc).__name__}: {exc}"[:600]}
        finally:
            self._free(core)
        if self.cuda:
            res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        return res

    def behaviour(self, steps: int) -> dict[str, list[int]]:
        """Greedy decoding of one fixed input (a seeded noise and tone, a fixed oracle answer) at batch 1: the
        text token and the speak/silence decision of every step, to compare int8 with bf16."""
        import numpy as np

        core = self._core(1, sampling={"use_sampling": False})
        try:
            core.attach(0)
            core.oracle_reset(0, [20, 21])
            core.oracle_push(0, list(range(22, 40)))
            vocab = self.models.vocab
            rng = np.random.default_rng(7)
            t = np.arange(FRAME) / 24000
            text: list[int] = []
            speak: list[int] = []
            for i in range(steps):
                frame = (0.05 * rng.standard_normal(FRAME) + 0.2 * np.sin(2 * np.pi * 220 * (t + i * FRAME_S))).astype(np.float32)
                out = core.tick({0: frame})[0]
                text.append(-1 if out.text_id is None else int(out.text_id))
                speak.append(int(vocab.is_text(out.text_id)))
            return {"text": text, "speak": speak}
        finally:
            self._free(core)

    def int8(self, batch: int) -> dict[str, Any]:
        """bf16's behaviour on the fixed input, then int8 weights loaded: the same input, and ticks at ``batch``."""
        steps = int(self.args.agreement_steps)
        ref = self.behaviour(steps)
        load_s = self.load("int8")
        got = self.behaviour(steps)
        # the same figure `kame run --compare-weights bf16,int8` prints (kame.frontend.agreement)
        from kame.frontend.agreement import agreement

        same = agreement([None if t < 0 else t for t in ref["text"]], [None if t < 0 else t for t in got["text"]])
        speak = sum(a == b for a, b in zip(ref["speak"], got["speak"], strict=True)) / steps
        return {"load_s": round(load_s, 1), "steps": steps, "text_agreement": round(same.text_rate, 4),
                "speak_agreement": round(same.speak_rate, 4), "first_text_difference_step": same.first_text_difference,
                "first_speak_difference_step": same.first_speak_difference, "vocab_speak_agreement": round(speak, 4),
                "agreement": same.to_json(), "ticks": self.ticks(batch)}

    def serve_forever(self) -> int:
        """Read one JSON request a line on stdin, answer one MARK line each, until ``quit`` or EOF."""
        try:
            info = self.write_checkpoints()
            n, plan = self.plan_max()
            info.update(plan)
            info["load_s"] = round(self.load(), 1)
        except Exception as exc:  # noqa: BLE001 - the orchestrator records it
            self.emit("loaded", plan_max=0, error=f"{type(exc).__name__}: {exc}"[:800])
            return 1
        self.emit("loaded", plan_max=n, **info)
        for line in sys.stdin:
            req = json.loads(line)
            op = req.get("op")
            if op == "quit":
                break
            try:
                if op == "ticks":
                    out = self.ticks(int(req["batch"]), graphs=req.get("graphs", "on") == "on", stt=bool(req.get("stt")))
                elif op == "int8":
                    out = self.int8(int(req["batch"]))
                else:
                    out = {"error": f"unknown op {op!r}"}
            except Exception as exc:  # noqa: BLE001
                out = {"error": f"{type(exc).__name__}: {exc}"[:800]}
            self.emit("result", **out)
        return 0


def has_int8_weights() -> bool:
    """This build's ``frontend.weights`` (issue 62's quantize-at-load) exists and offers int8, and moshi's 8-bit
    layers can be built here (bitsandbytes importable)."""
    import importlib.util

    from kame.frontend.config import FrontendConfig

    field = FrontendConfig.model_fields.get("weights")
    return field is not None and "int8" in str(field.annotation) and importlib.util.find_spec("bitsandbytes") is not None


# ---------------------------------------------------------------------------------------------- the orchestra
class Check:
    """The schedule's operations: a worker process (loaded once) and a server; the result file after each."""

    def __init__(self, args: argparse.Namespace, clock: Any = time.monotonic) -> None:
        self.args = args
        self.smoke = bool(args.smoke)
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.out = Path(args.out).resolve()
        self.device = "cpu" if self.smoke else "cuda"
        costs = schedule.Costs()
        if self.smoke:  # tiny models on a CPU: seconds, not minutes
            costs = schedule.Costs(load_s=10, new_batch_s=8, server_start_s=15, server_stop_s=5, server_min_clients_s=5,
                                   stt_s=10, int8_s=20, graphs_off_s=5)
        self.schedule = schedule.Schedule(budget_s=args.budget_s, costs=costs, clock=clock,
                                          server_clients_s=args.server_seconds)
        self.result = self.schedule.result
        self.result.update(ok=True, smoke=self.smoke, device=self.device, compile=not self.smoke, errors=[])
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        # one inductor cache for the worker and the server: the server's warm-up reuses the compiled kernels
        self.env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.work / "inductor"))
        self.env.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
        if self.smoke:  # CPU: the engine turns compile off anyway; NO_TORCH_COMPILE covers the STT too
            self.env["NO_TORCH_COMPILE"] = "1"
            self.env.setdefault("OMP_NUM_THREADS", "1")
        self.int8_available = has_int8_weights()
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.tail: list[str] = []

    def save(self) -> None:
        self.result["elapsed_s"] = round(self.schedule.clock() - self.schedule.t0, 1)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        tmp.replace(self.out)

    def log(self, msg: str) -> None:
        print(f"[gpu_check {self.schedule.clock() - self.schedule.t0:6.1f}s] {msg}", flush=True)

    # ------------------------------------------------------------------ the worker
    def _reader(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(MARK):
                self.lines.put(json.loads(line[len(MARK):]))
            else:
                self.tail = (self.tail + [line.rstrip()])[-40:]
        self.lines.put(None)

    def _await(self, timeout: float) -> dict[str, Any] | None:
        """The worker's next answer, or None (it died, or ``timeout`` passed: then it is killed)."""
        try:
            got = self.lines.get(timeout=max(1.0, timeout))
        except queue.Empty:
            got = None
        if got is None:
            self.close_worker(kill=True)
        return got

    def load(self) -> int:
        argv = [sys.executable, str(Path(__file__).resolve()), "worker", "--work", str(self.work), "--device", self.device,
                "--steps", str(self.args.steps), "--agreement-steps", str(self.args.agreement_steps),
                *(["--smoke"] if self.smoke else []), *(["--plan-max", str(self.args.plan_max)] if self.args.plan_max else [])]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=self.env, text=True, start_new_session=True)
        threading.Thread(target=self._reader, args=(self.proc,), daemon=True).start()
        got = self._await(min(240.0, self.schedule.left() - 60.0))
        if got is None or got.get("error"):
            self.result["errors"].append("load: " + (got or {}).get("error", "worker died or timed out: " + " | ".join(self.tail[-8:])))
            self.save()
            return 0
        got.pop("kind", None)
        n = int(got.pop("plan_max"))
        self.result["load"] = got
        self.log(f"written and loaded: plan max {n} ({got})")
        self.save()
        return n

    def _ask(self, req: dict[str, Any], limit: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            return {"error": "worker not running"}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        got = self._await(min(limit, self.schedule.left() - 5.0))
        if got is None:
            return {"error": "timeout (worker killed)", "tail": " | ".join(self.tail[-8:])}
        got.pop("kind", None)
        return got

    def measure(self, batch: int) -> schedule.Measurement:
        res = self._ask({"op": "ticks", "batch": batch}, limit=300.0)
        self.result.setdefault("ticks", []).append(res)
        self.log(f"batch {batch}: " + (f"p50 {res['tick_p50_ms']} ms p99 {res['tick_p99_ms']} ms"
                                       if "error" not in res else res["error"]))
        self.save()
        return schedule.Measurement(batch, res.get("tick_p99_ms"), res.get("tick_p50_ms"), res.get("error"))

    def stt(self, batch: int) -> dict[str, Any]:
        res = self._ask({"op": "ticks", "batch": batch, "stt": True}, limit=240.0)
        self.log(f"STT beside at batch {batch}: {res.get('tick_p99_ms', res.get('error'))}")
        return res

    def int8(self, batch: int) -> dict[str, Any] | None:
        if not has_int8_weights():
            return None
        res = self._ask({"op": "int8", "batch": batch}, limit=300.0)
        self.log(f"int8: {json.dumps({k: res.get(k) for k in ('text_agreement', 'speak_agreement', 'error')})}")
        return res

    def graphs_off(self, batch: int) -> dict[str, Any]:
        return self._ask({"op": "ticks", "batch": batch, "graphs": "off"}, limit=120.0)

    def close_worker(self, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if not kill and proc.stdin is not None:
            try:
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.close()
                proc.wait(20)
                return
            except (OSError, subprocess.TimeoutExpired):
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def run(self) -> int:
        self.save()
        try:
            self.schedule.run(self)
        finally:
            self.close_worker(kill=True)
        r = self.result
        r["largest_batch_p50_under_80ms"] = max(
            (t["batch"] for t in r.get("ticks", []) if "error" not in t and t["tick_p50_ms"] < 80), default=0)
        r["errors"] += [t["error"] for t in r.get("ticks", []) if "error" in t and t["error"] != "out of memory"]
        self.save()
        self.log(f"done: largest batch under 80 ms {r.get('largest_batch_under_80ms')} "
                 f"(bracket {r.get('bracket')}), notes {r.get('notes')}, results in {self.out}")
        return 0 if r.get("load") else 1

    # ------------------------------------------------------------------ the server
    def server(self, sessions: int, clients_s: float, deadline: float) -> dict[str, Any]:
        """``kame serve`` at ``sessions`` with Realtime clients for ``clients_s``; killed by ``deadline`` at the latest
        (its start, the clients and its stop all fit before it)."""
        stop_s = self.schedule.costs.server_stop_s
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
        out: dict[str, Any] = {"sessions": sessions, "clients_s": round(clients_s, 1)}
        try:
            base = f"http://127.0.0.1:{port}"
            ready = wait_ready(base, proc, timeout=deadline - time.monotonic() - clients_s - stop_s)
            out["start_s"] = round(time.monotonic() - t, 1)
            if not ready:
                out["error"] = "server not ready"
                return out
            # the clients get what the start left them, never past the deadline
            clients_s = max(3.0, min(clients_s, deadline - time.monotonic() - stop_s - 10.0))
            out["clients_s"] = round(clients_s, 1)
            self.log(f"server ready in {out['start_s']} s; {sessions} Realtime clients for {clients_s:.0f} s")
            before = scrape(base)
            t_clients = time.monotonic()
            out.update(asyncio.run(asyncio.wait_for(drive_realtime(base, sessions, clients_s),
                                                    max(1.0, deadline - time.monotonic() - stop_s))))
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
                    proc.wait(max(1.0, min(15.0, deadline - time.monotonic())))
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
    import numpy as np

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
    a.add_argument("--budget-s", type=float, default=None, help="Whole run (default 345 s; smoke 240 s).")
    a.add_argument("--plan-max", type=int, default=None, help="Cap the memory plan's largest batch (smoke: 4).")
    a.add_argument("--steps", type=int, default=None)
    a.add_argument("--agreement-steps", type=int, default=None, help="Steps of the int8/bf16 behaviour run.")
    a.add_argument("--server-seconds", type=float, default=None)
    a.add_argument("--python-expected", default=os.environ.get("GPU_CHECK_PYTHON"),
                   help="The Python X.Y the prepared wheels are for (run.sh sets it).")
    w = sub.add_parser("worker")
    w.add_argument("--work", required=True)
    w.add_argument("--smoke", action="store_true")
    w.add_argument("--device", default="cuda")
    w.add_argument("--steps", type=int, default=40)
    w.add_argument("--agreement-steps", type=int, default=100)
    w.add_argument("--plan-max", type=int, default=None)
    c = sub.add_parser("checkpoint", help="Only write a checkpoint (a dry run of the real-size writer).")
    c.add_argument("--dir", required=True)
    c.add_argument("--stt", action="store_true")
    c.add_argument("--smoke", action="store_true")
    c.add_argument("--device", default="cuda")
    c.add_argument("--layers", type=int, default=None, help="Fewer layers at the released width (a CPU dry run).")
    args = p.parse_args()
    if args.cmd == "checkpoint":
        return cmd_checkpoint(args)
    if args.cmd == "worker":
        return Worker(args).serve_forever()
    smoke = args.smoke
    defaults = {"budget_s": 240.0 if smoke else 345.0, "plan_max": 4 if smoke else None, "steps": 15 if smoke else 40,
                "agreement_steps": 20 if smoke else 100, "server_seconds": 10.0 if smoke else 60.0}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    missing = preflight(smoke, args.python_expected)
    if missing is not None:
        Path(args.out).write_text(json.dumps(missing, indent=1))
        print(missing["error"], file=sys.stderr)
        return 2
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
