"""``kame run``: stream a wav file through the front-end offline.

Plain: the front-end alone, with optional fixed oracle texts. Tandem
(``--asr`` and/or ``--backend``): the whole KAME loop at real time, speech in,
ASR partials, LLM requests, oracle tokens, reply audio out, with a timeline of
events (``--events-out``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

NAME = "run"
HELP = "Run a wav through the front-end (or the whole tandem loop) and write the reply audio and text."

log = logging.getLogger("kame.run")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kame.session.settings import ORACLE_POLICIES

    p.add_argument("--checkpoint", help="Hub repo id or local checkpoint directory (default: from config).")
    p.add_argument("--input", required=True, type=Path, help="Input audio (any format; converted to 24 kHz mono).")
    p.add_argument("--output", required=True, type=Path, help="Reply wav (24 kHz mono, same length as the input).")
    p.add_argument("--oracle", action="append", default=[], metavar="TEXT@SECONDS",
                   help="Inject TEXT into the oracle stream at SECONDS (split on the last @). Repeatable.")
    p.add_argument("--lora-weight", default=None, metavar="FILE",
                   help="LoRA adapters for a checkpoint whose config.json sets lora (frontend.lora_weights).")
    p.add_argument("--no-fuse-lora", "--no_fuse_lora", dest="fuse_lora", action="store_false", default=None,
                   help="Keep LoRA adapters as separate layers instead of fusing them (frontend.fuse_lora false).")
    p.add_argument("--seed", type=int, default=None, help="Sampling seed (reproducible output).")
    p.add_argument("--weights", default=None, choices=["bf16", "int8"],
                   help="LM linear weights: as stored, or quantized to int8 at load (frontend.weights).")
    p.add_argument("--compare-weights", default=None, metavar="A,B",
                   help="Run the input twice, with weights A then B (e.g. bf16,int8), and print how often their text "
                        "tokens and speak/silence decisions agree step by step (the --output wav is A's reply).")
    p.add_argument("--compare-out", type=Path, default=None,
                   help="With --compare-weights: the agreement and both runs' text tokens as one JSON object.")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: config, auto).")
    p.add_argument("--text-out", type=Path, default=None, help="JSON lines, one per text token: step, t_s, id, piece.")
    p.add_argument("--fast", action="store_true", help="Run as fast as possible instead of at real time.")
    p.add_argument("--asr", default=None, choices=["kyutai", "whisper", "pocketsphinx", "none"],
                   help="Tandem mode: transcribe the input with this recogniser and ask the LLM while it plays.")
    p.add_argument("--backend", default=None, help="Tandem mode: LLM back-end by name (default: the default back-end).")
    p.add_argument("--oracle-policy", default=None, choices=list(ORACLE_POLICIES),
                   help="Answer-switch policy (default: config).")
    p.add_argument("--events-out", type=Path, default=None,
                   help="Tandem mode: timeline of ASR, LLM, oracle and text events, one JSON object a line.")
    p.add_argument("--tail", type=float, default=0.0, help="Seconds of silence fed after the input (tandem mode).")
    p.add_argument("--voice", default=None,
                   help="PersonaPlex checkpoints: the voice (a name in its voices folder; default: frontend.voice).")
    p.add_argument("--persona", default=None,
                   help="PersonaPlex checkpoints: the role text, stepped as <system> TEXT <system> before the input.")


def run(args: argparse.Namespace) -> int:
    from kame.audio.files import read_audio, write_wav
    from kame.errors import UserError
    from kame.frontend.engine import EngineCore
    from kame.frontend.loading import resolve_device
    from kame.frontend.models import load_frontend
    from kame.frontend.runner import OracleInjection, run_offline, write_text_file
    from kame.oracle.answer_text import encode_answer_text
    from kame.server.config import load_app_config
    from kame.versions import versions_line

    tandem = bool(args.backend) or (args.asr not in (None, "none"))
    cfg = load_app_config(
        args.config,
        overrides={
            "frontend.checkpoint": args.checkpoint,
            "device": args.device,
            "frontend.seed": args.seed,
            "frontend.lora_weights": args.lora_weight,
            "frontend.fuse_lora": args.fuse_lora,
            "frontend.weights": args.weights,
            "asr.kind": args.asr if tandem else None,
            "oracle.policy": args.oracle_policy,
        },
    )
    try:
        injections = [OracleInjection.parse(spec) for spec in args.oracle]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    pcm = read_audio(args.input)
    device = resolve_device(cfg.device)
    if args.compare_weights is not None:
        if tandem:
            raise UserError("--compare-weights runs the front-end alone: drop --asr and --backend")
        return _run_compare(args, cfg, device, pcm, injections)
    if args.compare_out is not None:
        raise UserError("--compare-out needs --compare-weights")
    log.info("loading %s on %s (%s)", cfg.frontend.checkpoint, device, versions_line())
    models = load_frontend(cfg.frontend, device, cache_dir=cfg.cache_dir)
    core = EngineCore(models, cfg.frontend, batch_size=1)
    if core.prompts is None and (args.voice or args.persona):
        raise UserError(f"--voice and --persona need a PersonaPlex checkpoint; {cfg.frontend.checkpoint} has one voice")
    try:
        prompt = models.prompt_plan(args.voice, args.persona)
    except ValueError as exc:  # an unknown voice: the message names the checkpoint's voices
        raise UserError(str(exc)) from None

    def encode_answer(text: str) -> list[int]:
        return encode_answer_text(text, models.encode_text)

    t0 = time.monotonic()
    if tandem:
        result_pcm, outputs = _run_tandem(args, cfg, core, pcm, injections, encode_answer)
    elif args.text_out is None:  # the reply goes to the file as it comes: an hour of input in flat memory
        steps = _run_to_file(args.output, models.sample_rate, pcm.size, lambda on_output: run_offline(
            core, pcm, injections=injections, encode_answer=encode_answer, seed=cfg.frontend.seed, fast=args.fast,
            prompt=prompt, on_output=on_output, keep=False))
        result_pcm, outputs = None, [None] * steps
    else:
        result = run_offline(core, pcm, injections=injections, encode_answer=encode_answer,
                             seed=cfg.frontend.seed, fast=args.fast, prompt=prompt)
        result_pcm, outputs = result.pcm, result.outputs
    wall = time.monotonic() - t0
    if result_pcm is not None:
        write_wav(args.output, result_pcm, models.sample_rate)
    if args.text_out is not None:
        write_text_file(args.text_out, outputs, models.tokenizer)
    print(f"kame run: {len(outputs)} steps, {pcm.size / models.sample_rate:.2f} s of audio in {wall:.2f} s")
    written = [str(p) for p in (args.output, args.text_out, args.events_out) if p is not None]
    print(f"kame run: wrote {', '.join(written)}")
    return 0


def _encode_answer(encode: Callable[[str], list[int]], text: str) -> list[int]:
    from kame.oracle.answer_text import encode_answer_text

    return encode_answer_text(text, encode)


def parse_compare(spec: str) -> tuple[str, str]:
    """``A,B`` -> the two ``frontend.weights`` to compare (each bf16 or int8)."""
    from kame.errors import UserError
    from kame.frontend.quantized import WEIGHTS

    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != 2 or any(p not in WEIGHTS for p in parts):
        raise UserError(f"--compare-weights {spec!r}: expected two of {', '.join(WEIGHTS)} separated by a comma, "
                        f"e.g. bf16,int8")
    return parts[0], parts[1]


def _run_compare(args, cfg, device, pcm, injections) -> int:
    """The same input, seed and oracle texts through the checkpoint loaded with each weights setting, one
    after the other (one model in memory at a time); the agreement of their text tokens and speak/silence."""
    import gc
    import json

    import torch

    from kame.audio.files import write_wav
    from kame.frontend.agreement import agreement
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.runner import run_offline
    names = parse_compare(args.compare_weights)
    seed = cfg.frontend.seed if cfg.frontend.seed is not None else 0
    traces: list[list[int | None]] = []
    loaded: list[str] = []
    silent: frozenset[int] = frozenset()
    for i, name in enumerate(names):
        fcfg = cfg.frontend.model_copy(update={"weights": name})
        log.info("loading %s with %s weights on %s", fcfg.checkpoint, name, device)
        models = load_frontend(fcfg, device, cache_dir=cfg.cache_dir)
        core = EngineCore(models, fcfg, batch_size=1)
        prompt = models.prompt_plan(args.voice, args.persona)
        result = run_offline(core, pcm, injections=injections, seed=seed, fast=True, prompt=prompt,
                             encode_answer=functools.partial(_encode_answer, models.encode_text))
        traces.append([o.text_id for o in result.outputs])
        loaded.append(models.weights)
        silent = models.vocab.silent_ids
        if i == 0:
            write_wav(args.output, result.pcm, models.sample_rate)
        core.close()
        del core, models, result
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    got = agreement(traces[0], traces[1], silent_ids=silent, idle_steps=cfg.oracle.barge_in_idle_steps)
    label_a, label_b = (f"{n} ({w} loaded)" if n != w else n for n, w in zip(names, loaded))
    print(f"kame run: {got.summary(label_a, label_b)}")
    if args.compare_out is not None:
        args.compare_out.parent.mkdir(parents=True, exist_ok=True)
        report = {"checkpoint": cfg.frontend.checkpoint, "weights": list(names), "loaded": loaded, "seed": seed,
                  "agreement": got.to_json(), "text_ids": {"a": traces[0], "b": traces[1]}}
        args.compare_out.write_text(json.dumps(report) + "\n")
    written = [str(p) for p in (args.output, args.compare_out) if p is not None]
    print(f"kame run: wrote {', '.join(written)}")
    return 0


def _run_to_file(path, sample_rate, samples, run):
    """``run(on_output)`` with each step's reply frame written to the wav at ``path`` (the reply has the
    input's ``samples``, as :func:`write_wav` of the whole reply would have it); returns the steps."""
    import wave
    from pathlib import Path

    from kame.audio.pcm import float_to_pcm16_bytes

    left, steps = [samples], [0]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)

        def write(out):
            n = min(left[0], out.pcm.size)
            if n > 0:
                w.writeframes(float_to_pcm16_bytes(out.pcm[:n]))
                left[0] -= n
            steps[0] += 1

        run(write)
    return steps[0]


def _run_tandem(args, cfg, core, pcm, injections, encode_answer):
    import torch

    from kame.asr.factory import create_recognizer
    from kame.backend.registry import BackendRegistry
    from kame.backend.resolve import resolve_backends
    from kame.frontend.engine_thread import EngineThread
    from kame.oracle.session_tools import ToolCatalog
    from kame.session.offline import run_tandem_file, write_events
    from kame.session.root import SessionRoot
    from kame.session.settings import SessionSettings

    if cfg.frontend.seed is not None:
        torch.manual_seed(cfg.frontend.seed)
    registry = None
    if resolve_backends(cfg, os.environ).backends:
        registry = BackendRegistry.from_config(cfg, os.environ)
        if args.backend:
            registry.resolve_name(args.backend)  # unknown name: one-line error now
    else:
        log.warning("no LLM back-end configured (set KAME_LLM_BASE_URL or --config): running without the oracle")
    recognizer = create_recognizer(cfg.asr, cache_dir=cfg.cache_dir)
    engine = EngineThread(core)
    tools = ToolCatalog(cfg.tools, os.environ)  # the configured MCP servers (server-wide and the back-ends')
    root = SessionRoot.for_models(engine, core.models, oracle_config=cfg.oracle, registry=registry,
                                  recognizer=recognizer, tools=tools, echo_guard=cfg.asr.echo_guard)
    engine.start()
    settings = SessionSettings(backend=args.backend or None, voice=args.voice, instructions=args.persona)

    async def main():
        try:
            return await run_tandem_file(root, pcm, settings=settings, injections=injections,
                                         encode_answer=encode_answer, tail_s=args.tail, fast=args.fast)
        finally:
            await tools.aclose()
            if registry is not None:
                await registry.aclose()

    try:
        result = asyncio.run(main())
    finally:
        engine.stop()
        if recognizer is not None:
            recognizer.close()
    if args.events_out is not None:
        write_events(args.events_out, result.events)
    return result.pcm, result.frames
