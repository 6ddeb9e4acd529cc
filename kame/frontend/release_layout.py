"""Kyutai's release layout of attention weights, mapped onto moshi's modules.

Kyutai's published safetensors (Moshi LM and depformer, Mimi's encoder and
decoder transformers, Kyutai STT; SakanaAI's KAME release too) store each
attention as ONE fused ``self_attn.in_proj_weight`` and ONE
``self_attn.out_proj.weight``. moshi's ``StreamingMultiheadAttention`` holds
``in_projs.{i}.weight`` / ``out_projs.{i}.weight`` (``i < mult``, ``mult`` > 1
for depformers with weights per step) and splits the fused tensors in a
``load_state_dict`` pre-hook. kame checks a file against the model *before*
loading it, tensor by tensor, so it needs the same mapping up front: the
fused tensor is the ``torch.cat`` of the per-step tensors along dim 0.

:func:`plan_load` is pure (names and shapes only) so that every error a file
can cause is found before a byte of weights is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kame.errors import CheckpointError

#: fused file name (relative to the attention module) -> moshi's per-step name.
#: The same table as moshi's ``_load_hook``; ``_scb`` suffixes are quantized data.
FUSED_NAMES: dict[str, str] = {
    "in_proj_weight": "in_projs.{i}.weight",
    "in_proj.weight": "in_projs.{i}.weight",
    "in_proj.lora_A.weight": "in_projs.{i}.lora_A.weight",
    "in_proj.lora_B.weight": "in_projs.{i}.lora_B.weight",
    "out_proj.weight": "out_projs.{i}.weight",
    "out_proj.lora_A.weight": "out_projs.{i}.lora_A.weight",
    "out_proj.lora_B.weight": "out_projs.{i}.lora_B.weight",
}
#: The names Kyutai's release files use (what :func:`fuse_state_dict` writes).
WRITTEN_NAMES: dict[str, str] = {
    "in_projs.{i}.weight": "in_proj_weight",
    "out_projs.{i}.weight": "out_proj.weight",
}

#: Older names of Mimi's codebook buffers that moshi's ``EuclideanCodebook`` still loads (its
#: ``_load_from_state_dict`` renames them): old name -> current name, relative to the codebook.
CODEBOOK_OLD_NAMES: dict[str, str] = {
    "inited": "_initialized",
    "cluster_size": "cluster_usage",
    "embed_avg": "embedding_sum",
    "embed_sum": "embedding_sum",
}

Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorPlan:
    """How one tensor of the file becomes module tensors.

    ``targets`` has one module key for a tensor stored as the module holds it,
    and ``mult`` keys for a fused tensor (split into ``mult`` equal chunks
    along dim 0, in order).
    """

    file_key: str
    targets: tuple[str, ...]

    @property
    def fused(self) -> bool:
        return len(self.targets) > 1 or self.targets[0] != self.file_key


def attention_modules(module: Any) -> list[tuple[str, int]]:
    """(state-dict prefix, mult) of every moshi attention inside ``module``."""
    from moshi.modules.transformer import StreamingMultiheadAttention

    out: list[tuple[str, int]] = []
    for name, sub in module.named_modules():
        if isinstance(sub, StreamingMultiheadAttention):
            out.append((f"{name}." if name else "", int(sub.mult)))
    return out


def codebook_prefixes(module: Any) -> list[str]:
    """State-dict prefixes of every Mimi codebook inside ``module``."""
    from moshi.quantization.core_vq import EuclideanCodebook

    return [f"{name}." if name else "" for name, sub in module.named_modules() if isinstance(sub, EuclideanCodebook)]


def renamed_key_map(prefixes: list[str], expected: Mapping[str, Shape]) -> dict[str, tuple[str, ...]]:
    """Old codebook buffer names a file may use -> the module key each one fills."""
    out: dict[str, tuple[str, ...]] = {}
    for prefix in prefixes:
        for old, new in CODEBOOK_OLD_NAMES.items():
            if prefix + new in expected:
                out[prefix + old] = (prefix + new,)
    return out


def fused_key_map(attentions: list[tuple[str, int]], expected: Mapping[str, Shape]) -> dict[str, tuple[str, ...]]:
    """Every fused file key that ``attentions`` accept -> the module keys it fills."""
    out: dict[str, tuple[str, ...]] = {}
    for prefix, mult in attentions:
        for fused, split in FUSED_NAMES.items():
            for suffix in ("", "_scb"):
                targets = tuple(prefix + split.format(i=i) + suffix for i in range(mult))
                if all(t in expected for t in targets):
                    out[prefix + fused + suffix] = targets
    return out


def _limited(keys: list[str]) -> str:
    more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
    return ", ".join(keys[:3]) + more


def _missing_names(missing: set[str], fused: Mapping[str, tuple[str, ...]], file_is_fused: bool) -> list[str]:
    """Missing module keys, named as the file would name them.

    In a file that uses the release layout, a whole missing attention weight
    is reported under its fused name (``...self_attn.in_proj_weight``).
    """
    if not file_is_fused:
        return sorted(missing)
    names = set(missing)
    written = tuple(WRITTEN_NAMES.values())
    for key, targets in fused.items():
        if key.endswith(written) and all(t in names for t in targets):
            names.difference_update(targets)
            names.add(key)
    return sorted(names)


def plan_load(
    path: Path,
    file_shapes: Mapping[str, Shape],
    expected: Mapping[str, Shape],
    fused: Mapping[str, tuple[str, ...]],
) -> list[TensorPlan]:
    """Match a file's keys and shapes to a model's, in either layout.

    Raises one :class:`CheckpointError` sentence naming the file and the
    first offending keys: unknown (neither a module key nor a fused one),
    missing once fused tensors are mapped, given twice (fused and split), or
    of the wrong shape.
    """
    plans: list[TensorPlan] = []
    unknown: list[str] = []
    covered: dict[str, str] = {}
    twice: list[str] = []
    for key in sorted(file_shapes):
        if key in expected:
            targets: tuple[str, ...] = (key,)
        elif key in fused:
            targets = fused[key]
        else:
            unknown.append(key)
            continue
        for t in targets:
            if t in covered:
                twice.append(f"{t} ({covered[t]} and {key})")
            covered[t] = key
        plans.append(TensorPlan(key, targets))
    if unknown:
        raise CheckpointError(f"checkpoint file {path}: unknown keys {_limited(unknown)}")
    missing = _missing_names(set(expected) - set(covered), fused, any(p.fused for p in plans))
    if missing:
        raise CheckpointError(f"checkpoint file {path}: missing keys {_limited(missing)}")
    if twice:
        raise CheckpointError(f"checkpoint file {path}: keys given twice, fused and split: {_limited(twice)}")
    for plan in plans:
        got = tuple(file_shapes[plan.file_key])
        parts = [tuple(expected[t]) for t in plan.targets]
        want = parts[0] if len(parts) == 1 else (sum(p[0] for p in parts), *parts[0][1:])
        if got != want or any(p != parts[0] for p in parts):
            raise CheckpointError(
                f"checkpoint file {path}: key {plan.file_key} has shape {got}, the config expects {want}"
            )
    return plans


def fuse_state_dict(module: Any, state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` (module layout) rewritten in Kyutai's release layout.

    moshi has no writer for it: each attention's ``in_projs.{i}.weight`` are
    concatenated along dim 0 into ``in_proj_weight`` (``out_projs`` into
    ``out_proj.weight``), which is what moshi's load hook splits again.
    """
    import torch

    out = dict(state)
    for prefix, mult in attention_modules(module):
        for split, fused in WRITTEN_NAMES.items():
            keys = [prefix + split.format(i=i) for i in range(mult)]
            if not all(k in out for k in keys):
                continue
            out[prefix + fused] = torch.cat([out.pop(k) for k in keys], dim=0).contiguous()
    return out
