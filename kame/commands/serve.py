"""``kame serve``: the websocket server (Moshi protocol on /api/chat) with health, readiness and metrics."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kame.server.config import AppConfig

NAME = "serve"
HELP = "Serve the voice assistant over websockets (Moshi protocol on /api/chat); see docs/server.md."

log = logging.getLogger("kame.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None, help="Listen address (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=None, help="Listen port (default 8998).")
    p.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N (default: config).")
    p.add_argument("--max-sessions", type=int, default=None, help="Concurrent sessions = engine slots (frontend.batch_size).")
    p.add_argument("--lora-weight", default=None, metavar="FILE",
                   help="LoRA adapters for a checkpoint whose config.json sets lora (frontend.lora_weights).")
    p.add_argument("--no-fuse-lora", "--no_fuse_lora", dest="fuse_lora", action="store_false", default=None,
                   help="Keep LoRA adapters as separate layers instead of fusing them (frontend.fuse_lora false).")
    p.add_argument("--weights", default=None, choices=["bf16", "int8"],
                   help="LM linear weights: as stored, or quantized to int8 at load (frontend.weights).")
    p.add_argument("--ssl-certfile", type=Path, default=None, help="TLS certificate (PEM), with --ssl-keyfile.")
    p.add_argument("--ssl-keyfile", type=Path, default=None, help="TLS private key (PEM).")
    p.add_argument(
        "--client-dir", "--static", dest="client_dir", type=Path, default=None,
        help="Serve this built web client at / (e.g. Kyutai's Moshi client's dist/; server.client_dir).",
    )


def _secrets(cfg: AppConfig, environ: dict[str, str]) -> list[str]:
    """Values that must never reach a log line: the auth token and the back-ends' API keys."""
    from kame.backend.resolve import resolve_backends

    out: list[str] = []
    token = cfg.server.auth_token
    if token is not None and token.get_secret_value():
        out.append(token.get_secret_value())
    for bcfg in resolve_backends(cfg, environ).backends.values():
        for name in bcfg.key_env_names():
            if environ.get(name):
                out.append(environ[name])
    return out


def unwritable_dirs(dirs: list[Path]) -> list[Path]:
    """Those of ``dirs`` where no file can be created (made first when missing): a container's
    ``/data`` volume mounted read-only or owned by another uid fails here, at start, in one line,
    instead of as a traceback deep in a model download."""
    bad: list[Path] = []
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / f".kame-write-check-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError:
            bad.append(d)
    return bad


def run(args: argparse.Namespace) -> int:
    from kame.errors import UserError
    from kame.server.config import load_app_config

    environ = dict(os.environ)
    # `kame serve` alone serves the built-in `default` config (unless $KAME_CONFIG names one).
    config = args.config or (None if environ.get("KAME_CONFIG") else "default")
    cfg = load_app_config(
        config,
        environ=environ,
        overrides={
            "server.host": args.host,
            "server.port": args.port,
            "device": args.device,
            "frontend.batch_size": args.max_sessions,
            "frontend.lora_weights": args.lora_weight,
            "frontend.fuse_lora": args.fuse_lora,
            "frontend.weights": args.weights,
            "server.ssl_certfile": args.ssl_certfile,
            "server.ssl_keyfile": args.ssl_keyfile,
            "server.client_dir": args.client_dir,
        },
    )
    s = cfg.server
    if (s.ssl_certfile is None) != (s.ssl_keyfile is None):
        raise UserError("TLS needs both --ssl-certfile and --ssl-keyfile (server.ssl_certfile / server.ssl_keyfile)")
    for path in (s.ssl_certfile, s.ssl_keyfile):
        if path is not None and not Path(path).is_file():
            raise UserError(f"TLS file {path}: not found")
    if s.client_dir is not None:
        from kame.server.app.static import ClientDirError, check_client_dir

        try:
            check_client_dir(s.client_dir)
        except ClientDirError as e:
            raise UserError(str(e)) from None
    if cfg.sip.port is not None:
        import importlib.util

        if importlib.util.find_spec("pjsua2") is None:
            raise UserError("sip.port is set but PJSIP's Python bindings are missing: pip install 'pjsua2-python>=2.15.1,"
                            "<2.16' (wheels for CPython 3.8-3.12; docs/sip.md)")

    from kame.server.telemetry.logs import configure_logging

    configure_logging(cfg.log.level, cfg.log.json_format, secrets=_secrets(cfg, environ))

    dirs = [Path(cfg.cache_dir).expanduser()] + ([Path(environ["HF_HOME"])] if environ.get("HF_HOME") else [])
    for d in unwritable_dirs(dirs):
        log.error(
            "%s is not writable by uid %d: models and generated files cannot be stored there "
            "(a read-only or root-owned volume? in Docker: chown the /data volume to uid 10001)",
            d, os.getuid(),
        )

    from kame.server.app.allocator import AllocatorSettings, tune_allocator

    # Before torch and the server's threads exist: see kame/server/app/allocator.py.
    applied = tune_allocator(AllocatorSettings(s.malloc_arena_max, s.malloc_mmap_threshold_bytes), environ)

    if apply_switch_interval(s.switch_interval_ms):
        log.info("GIL switch interval %.2f ms", s.switch_interval_ms)

    from kame.server.host import choose_device
    from kame.versions import versions_line

    device = choose_device(cfg)
    log.info("kame serve: %s device=%s", versions_line(), device)
    if device.type == "cuda":
        check_memory(cfg, device)
    if applied:
        log.info("malloc: %s", " ".join(f"{k}={v}" for k, v in applied.items()))

    from kame.server.app.serving import run_server

    return run_server(cfg, str(device), environ=environ)


def memory_refusal(cfg: AppConfig, free_bytes: int, total_bytes: int, device: str = "cuda") -> str | None:
    """The one line that refuses ``frontend.batch_size`` when the plan (weights, KV caches, headroom) does not
    fit ``free_bytes`` of a card of ``total_bytes``; None when it fits. Pure given the figures: no GPU needed."""
    from kame.frontend.memory_plan import refusal
    from kame.frontend.plan_models import build_plan
    from kame.server.host import engine_batch_size

    plan = build_plan(cfg, device="cuda").plan
    return refusal(plan, engine_batch_size(cfg), free_bytes, total_bytes, device)


def check_memory(cfg: AppConfig, device: torch.device) -> None:
    """Before loading: the plan against the card's free memory (``torch.cuda.mem_get_info``)."""
    import torch

    from kame.errors import CheckpointError, UserError

    free, total = torch.cuda.mem_get_info(device)
    try:
        line = memory_refusal(cfg, free, total, str(device))
    except CheckpointError as exc:  # an architecture not on disk yet: loading will download it
        log.warning("no memory plan before loading: %s", exc)
        return
    if line is not None:
        raise UserError(line)
    log.info("memory plan: frontend.batch_size %d fits %.1f GiB free on %s", cfg.frontend.batch_size, free / 1024**3, device)


def apply_switch_interval(ms: float) -> bool:
    """``server.switch_interval_ms`` (why: its description, the engine thread's GIL waits under load): set
    Python's GIL switch interval, process-wide, before the server's threads start; 0 keeps Python's."""
    if ms <= 0:
        return False
    sys.setswitchinterval(ms / 1000)
    return True
