"""Building Mimi, the LM (with KAME's ``oracle_emb``) and the tokenizer from checkpoint files.

moshi's strict loader refuses the extra ``oracle_emb.weight`` key of a KAME
checkpoint, so the LM is built empty (meta device) through moshi's own
``get_moshi_lm`` and the weights are checked and loaded here: the oracle
table is taken out, every other key must match the model by name and shape.
A plain Moshi checkpoint (no oracle table) gets a copy of ``text_emb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kame.errors import CheckpointError
from kame.frontend.checkpoint import CheckpointFiles

ORACLE_KEY = "oracle_emb.weight"


@dataclass
class LoadedLM:
    lm: Any  # moshi.models.lm.LMModel
    oracle_weight: torch.Tensor  # (text_card + 1, dim), on the LM's device and dtype
    has_oracle: bool  # True: the checkpoint carried its own oracle_emb (a KAME checkpoint)


def _read_safetensors(path: Path, device: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=device)
    except Exception as exc:  # safetensors raises its own error types, OSError, ValueError
        raise CheckpointError(f"checkpoint file {path}: not a readable safetensors file ({exc})") from None


def _check_state(path: Path, state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    unknown = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    if unknown:
        more = f" (+{len(unknown) - 3} more)" if len(unknown) > 3 else ""
        raise CheckpointError(f"checkpoint file {path}: unknown keys {', '.join(unknown[:3])}{more}")
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(f"checkpoint file {path}: missing keys {', '.join(missing[:3])}{more}")
    for key, value in state.items():
        want = tuple(expected[key].shape)
        if tuple(value.shape) != want:
            raise CheckpointError(
                f"checkpoint file {path}: key {key} has shape {tuple(value.shape)}, the config expects {want}"
            )


def load_lm(files: CheckpointFiles, device: str | torch.device, dtype: torch.dtype) -> LoadedLM:
    """The LM with weights loaded, plus its oracle table (own or copied from text_emb)."""
    from moshi.models import loaders

    device = torch.device(device)
    if not files.lm_weights.suffix in (".safetensors", ".sft", ".sfts"):
        raise CheckpointError(f"checkpoint file {files.lm_weights}: only safetensors LM weights are supported")
    try:
        lm = loaders.get_moshi_lm(None, lm_kwargs=files.lm_kwargs, device=torch.device("meta"), dtype=dtype)
    except TypeError as exc:
        raise CheckpointError(f"checkpoint {files.source}: config.json has an invalid LM setting ({exc})") from None
    state = _read_safetensors(files.lm_weights, "cpu")
    oracle = state.pop(ORACLE_KEY, None)
    _check_state(files.lm_weights, state, lm.state_dict())
    for key, value in state.items():
        if value.dtype.is_floating_point:
            keep_fp32 = key.startswith(("condition_provider.", "fuser."))
            value = value.float() if keep_fp32 else value.to(dtype)
        state[key] = value.to(device)
    lm.load_state_dict(state, assign=True, strict=True)
    lm.eval()
    text_weight = lm.text_emb.weight
    if oracle is None:
        oracle_weight = text_weight.detach().clone()
        has_oracle = False
    else:
        if tuple(oracle.shape) != tuple(text_weight.shape):
            raise CheckpointError(
                f"checkpoint file {files.lm_weights}: key {ORACLE_KEY} has shape {tuple(oracle.shape)}, "
                f"expected {tuple(text_weight.shape)} (same as text_emb)"
            )
        oracle_weight = oracle.to(device=device, dtype=text_weight.dtype)
        has_oracle = True
    return LoadedLM(lm=lm, oracle_weight=oracle_weight, has_oracle=has_oracle)


def load_mimi(files: CheckpointFiles, device: str | torch.device, num_codebooks: int = 8) -> Any:
    """Mimi with its weights; ``num_codebooks`` 8 for Moshi, 32 for Kyutai STT."""
    from moshi.models import loaders

    config = files.mimi_config or loaders._mimi_config
    try:
        mimi = loaders.get_mimi(None, config, device=device, num_codebooks=num_codebooks)
    except (TypeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {files.source}: invalid Mimi config ({exc})") from None
    state = _read_safetensors(files.mimi_weights, str(device))
    _check_state(files.mimi_weights, state, mimi.state_dict())
    mimi.load_state_dict(state)
    mimi.set_num_codebooks(num_codebooks)
    mimi.eval()
    return mimi


def load_tokenizer(files: CheckpointFiles) -> Any:
    import sentencepiece

    proc = sentencepiece.SentencePieceProcessor()
    try:
        proc.Load(str(files.tokenizer))
    except (OSError, RuntimeError):
        raise CheckpointError(f"checkpoint file {files.tokenizer}: not a SentencePiece model") from None
    return proc


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"device {name}: CUDA is not available on this machine (use --device cpu)")
    return dev


def lm_num_codebooks(files: CheckpointFiles) -> int:
    """How many Mimi codebooks the LM consumes (moshi's rule)."""
    kw = files.lm_kwargs
    if not kw:
        return 8
    n_q, dep_q = int(kw.get("n_q", 16)), int(kw.get("dep_q", 8))
    return max(dep_q, n_q - dep_q)
