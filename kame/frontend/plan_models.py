"""A configuration's models built on the meta device, measured for a :class:`~kame.frontend.memory_plan.MemoryPlan`.

Nothing is loaded or downloaded: each model is built empty through the path
that loads it (:func:`kame.frontend.loading.build_empty_lm` with KAME's oracle
input installed as the engine installs it, moshi's ``get_mimi``, the Kyutai
STT's LM, moshi's LoRA layers), and its parameters, buffers and attention
caches are counted. The architecture comes from the checkpoint's
``config.json`` when it is on disk (a local directory, ``tiny:SEED``, or the
Hugging Face cache); for a Hub repo not yet downloaded, from
:data:`KNOWN_ARCHITECTURES`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kame.config import KameConfig
from kame.errors import CheckpointError
from kame.frontend.checkpoint import CheckpointFiles, is_tiny, resolve_spec
from kame.frontend.loading import (
    LoraSettings,
    _no_init_on_meta,
    build_empty_lm,
    resolve_dtype,
    split_lora,
    with_lora_layers,
)
from kame.frontend.memory_plan import AttentionCache, Headroom, MemoryPlan, ModelFootprint

FRONTEND, MIMI, STT = "frontend", "mimi", "stt"

#: Kyutai STT 1B (kyutai/stt-1b-en_fr; its -candle sibling adds the 4 end-of-turn heads), as its config.json
#: declares it (hidden_scale 4.125: moshi's gating then uses 5632 hidden units, like the Rust config's 8192).
_STT_1B: dict[str, Any] = {
    "dim": 2048, "num_heads": 16, "num_layers": 16, "hidden_scale": 4.125, "context": 750, "max_period": 100000,
    "text_card": 8000, "card": 2048, "n_q": 32, "dep_q": 0, "delays": [0] * 33, "existing_text_padding_id": 3,
    "causal": True, "layer_scale": None, "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope",
    "extra_heads_num_heads": 4, "extra_heads_dim": 6,
}
#: Kyutai STT 2.6B (English), as its config.json declares it.
_STT_2_6B: dict[str, Any] = {
    **_STT_1B, "num_heads": 32, "num_layers": 48, "context": 375, "text_card": 4000,
    "extra_heads_num_heads": 0,
}

#: LM keyword arguments of Hub checkpoints whose config.json may not be on disk yet. ``None``: moshi's 7B
#: (``loaders._lm_kwargs``), which KAME's checkpoint and Kyutai's Moshi releases use.
KNOWN_ARCHITECTURES: dict[str, dict[str, Any] | None] = {
    "SakanaAI/kame": None,
    "kyutai/moshiko-pytorch-bf16": None,
    "kyutai/moshika-pytorch-bf16": None,
    "kyutai/moshiko-pytorch-q8": None,
    "kyutai/moshika-pytorch-q8": None,
    "kyutai/moshika-rl-seamless": None,
    "kyutai/personaplex-rl-seamless": None,
    "nvidia/personaplex-7b-v1": None,
    "kyutai/stt-1b-en_fr": {k: v for k, v in _STT_1B.items() if not k.startswith("extra_heads")},
    "kyutai/stt-1b-en_fr-candle": _STT_1B,
    "kyutai/stt-2.6b-en": _STT_2_6B,
    "kyutai/stt-2.6b-en-candle": _STT_2_6B,
}

#: Hub checkpoints that are moshi's 7B with a few keywords changed (applied over ``loaders._lm_kwargs``):
#: Kyutai's q8 repos (moshi's 8-bit linears, ``quantize: true`` as scripts/export_quantized.py writes it) and
#: PersonaPlex's layout (16 depformer steps: kame.frontend.personaplex).
MOSHI_7B_VARIANTS: dict[str, dict[str, Any]] = {
    "kyutai/moshiko-pytorch-q8": {"quantize": True},
    "kyutai/moshika-pytorch-q8": {"quantize": True},
    "kyutai/personaplex-rl-seamless": {"dep_q": 16},
    "nvidia/personaplex-7b-v1": {"dep_q": 16},
}


@dataclass(frozen=True)
class Architecture:
    """What a plan needs of a checkpoint: where the shapes came from, LM kwargs, Mimi config."""

    source: str
    origin: str  # "config.json" or "known architecture"
    lm_kwargs: dict[str, Any] | None
    mimi_config: dict[str, Any] | None = None


def _cached_hub_json(repo: str, name: str, revision: str | None) -> dict[str, Any] | None:
    """A JSON file of a Hub repo from the local cache only (a plan never downloads)."""
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo, name, revision=revision, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError and kin)
        return None
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, dict) else None


def architecture(spec: str, revision: str | None = None, *, cache_dir: str | Path | None = None,
                 stt: bool = False) -> Architecture:
    """The shapes of checkpoint ``spec`` (``tiny:SEED``, a directory, a Hub id), without its weights."""
    from kame.frontend.checkpoint import NON_LM_KEYS

    text = resolve_spec(spec, cache_dir, stt=stt) if is_tiny(spec) else str(spec)
    path = Path(os.path.expanduser(text))
    raw: dict[str, Any] | None
    mimi: dict[str, Any] | None = None
    if path.is_dir():
        cfg_path = path / "config.json"
        raw = json.loads(cfg_path.read_text()) if cfg_path.is_file() else None
        name = (raw or {}).get("mimi_config_name")
        if name and (path / name).is_file():
            mimi = json.loads((path / name).read_text())
        origin = "config.json" if raw is not None else "moshi's 7B defaults (no config.json)"
    else:
        raw = _cached_hub_json(text, "config.json", revision)
        if raw is not None and raw.get("mimi_config_name") and "://" not in str(raw["mimi_config_name"]):
            mimi = _cached_hub_json(text, str(raw["mimi_config_name"]), revision)
        origin = "config.json (Hugging Face cache)"
        if raw is None:
            if text not in KNOWN_ARCHITECTURES:
                raise CheckpointError(
                    f"checkpoint {text}: its config.json is not on disk and its architecture is not one kame knows "
                    f"({', '.join(sorted(KNOWN_ARCHITECTURES))}): run `kame download --checkpoint {text}` first"
                )
            known = KNOWN_ARCHITECTURES[text]
            if text in MOSHI_7B_VARIANTS:
                from moshi.models import loaders

                known = {**loaders._lm_kwargs, **MOSHI_7B_VARIANTS[text]}
            return Architecture(str(spec), "known architecture", copy.deepcopy(known), None)
    lm_kwargs = None if raw is None else {k: v for k, v in raw.items() if k not in NON_LM_KEYS}
    return Architecture(str(spec), origin, lm_kwargs, mimi)


def _files(arch: Architecture) -> CheckpointFiles:
    """Enough of a :class:`CheckpointFiles` for :func:`build_empty_lm` (no file is opened)."""
    none = Path("/nonexistent")
    return CheckpointFiles(source=arch.source, lm_weights=none, mimi_weights=none, tokenizer=none,
                           lm_kwargs=arch.lm_kwargs)


def attention_caches(module: torch.nn.Module) -> list[AttentionCache]:
    """The streaming KV cache of every attention in ``module``, sized as moshi's ``_init_streaming_state`` does."""
    from moshi.modules.transformer import StreamingMultiheadAttention
    from moshi.utils.quantize import QLinear

    out: list[AttentionCache] = []
    for sub in module.modules():
        if not isinstance(sub, StreamingMultiheadAttention) or sub.cross_attention:
            continue
        capacity = sub.context if sub.context is not None else sub.weights_per_step
        if not capacity:
            continue
        proj = sub.in_projs[0]
        weight = proj.lora_A.weight if hasattr(proj, "lora_A") else proj.weight
        out.append(
            AttentionCache(
                num_heads=sub.num_heads // sub.kv_repeat,
                head_dim=sub.embed_dim // sub.num_heads,
                capacity=int(capacity),
                # moshi keeps the cache of an 8-bit attention in float16
                bytes_per_value=2 if isinstance(proj, QLinear) else weight.element_size(),
            )
        )
    return out


def _tensor_bytes(module: torch.nn.Module) -> tuple[int, int]:
    """(parameters, bytes of parameters and buffers) of ``module``."""
    params = sum(p.numel() for p in module.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in module.parameters())
    nbytes += sum(b.numel() * b.element_size() for b in module.buffers())
    return params, nbytes


def _key(arch: Architecture) -> str:
    return json.dumps([arch.lm_kwargs, arch.mimi_config], sort_keys=True, default=str)


@functools.lru_cache(maxsize=16)
def _frontend_cached(key: str, dtype: torch.dtype, lora: LoraSettings | None, name: str, weights: str) -> ModelFootprint:
    lm_kwargs, mimi_config = json.loads(key)
    return _frontend_footprint(Architecture("plan", "", lm_kwargs, mimi_config), dtype, lora, name, weights)


WEIGHTS = ("bf16", "int8")


def int8_saving(module: torch.nn.Module) -> int:
    """Bytes saved by moshi's 8-bit path (``moshi/utils/quantize.py``: every ``nn.Linear`` and nothing else
    becomes an int8 ``weight`` and a float32 ``weight_scb`` a row); embeddings, norms stay as they are."""
    saved = 0
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear):
            w = sub.weight
            saved += w.numel() * w.element_size() - (w.numel() + 4 * int(w.shape[0]))
    return saved


def configured_weights(cfg: KameConfig, arch: Architecture | None = None) -> str:
    """"int8" for a q8 checkpoint (``quantize: true``: its weights are int8 whatever is asked), else
    ``frontend.weights``."""
    if arch is not None and (arch.lm_kwargs or {}).get("quantize"):
        return "int8"
    return str(cfg.frontend.weights)


def frontend_footprint(arch: Architecture, dtype: torch.dtype, lora: LoraSettings | None = None,
                       name: str = FRONTEND, weights: str = "bf16") -> ModelFootprint:
    """The front-end LM as the engine holds it: the oracle input installed (its table shares the loaded
    tensor :class:`~kame.frontend.models.FrontendModels` keeps: counted once), LoRA adapters fused or kept
    (memoised: a 7B model takes seconds to build even on the meta device)."""
    return _frontend_cached(_key(arch), dtype, lora, name, weights)


def _frontend_footprint(arch: Architecture, dtype: torch.dtype, lora: LoraSettings | None = None,
                        name: str = FRONTEND, weights: str = "bf16") -> ModelFootprint:
    """The front-end LM as the engine holds it: the oracle input installed (one table), LoRA adapters fused or kept."""
    from kame.frontend.oracle_input import install_oracle_input

    lm_kwargs = {k: v for k, v in (arch.lm_kwargs or {}).items() if k != "quantize"} if arch.lm_kwargs else None
    lm = build_empty_lm(_files(Architecture(arch.source, arch.origin, lm_kwargs, arch.mimi_config)), dtype)
    lora_bytes = 0
    if lora is not None:
        probe = with_lora_layers(lm, lora)
        lora_params = sum(p.numel() for n, p in probe.named_parameters() if ".lora_" in n)
        lora_bytes = lora_params * torch.empty((), dtype=dtype).element_size()
        if not lora.fuse:
            lm = probe
    oracle = torch.empty_like(lm.text_emb.weight)  # meta, like the table the loader reads
    install_oracle_input(lm, oracle, 1, int(lm.text_padding_token_id))
    params, nbytes = _tensor_bytes(lm)
    if weights == "int8":
        nbytes -= int8_saving(lm)
    return ModelFootprint(
        name=name,
        params=params,
        weight_bytes=nbytes,
        kv_bytes_per_slot=sum(c.bytes_per_slot for c in attention_caches(lm)),
        load_extra_bytes=lora_bytes if lora is not None and lora.fuse else 0,
    )


def stt_footprint(arch: Architecture, dtype: torch.dtype) -> ModelFootprint:
    return _stt_cached(_key(arch), dtype)


@functools.lru_cache(maxsize=8)
def _stt_cached(key: str, dtype: torch.dtype) -> ModelFootprint:
    lm_kwargs, _ = json.loads(key)
    lm = build_empty_lm(_files(Architecture("plan", "", lm_kwargs)), dtype)
    params, nbytes = _tensor_bytes(lm)
    return ModelFootprint(STT, params, nbytes, sum(c.bytes_per_slot for c in attention_caches(lm)))


@contextlib.contextmanager
def _on_meta() -> Iterator[None]:
    with torch.device("meta"), _no_init_on_meta():
        yield


def mimi_footprint(mimi_config: dict[str, Any] | None, name: str = MIMI) -> ModelFootprint:
    """Mimi as kame loads it (float32, its own config or moshi's)."""
    from moshi.models import loaders

    with _on_meta():
        mimi = loaders.get_mimi(None, mimi_config or loaders._mimi_config, device=torch.device("meta"), num_codebooks=32)
    params, nbytes = _tensor_bytes(mimi)
    return ModelFootprint(name, params, nbytes, sum(c.bytes_per_slot for c in attention_caches(mimi)))


@dataclass(frozen=True)
class PlanReport:
    """A plan and what it was built from, for ``kame plan`` and the server's check."""

    plan: MemoryPlan
    frontend: Architecture
    stt: Architecture | None
    notes: tuple[str, ...]


def _same_device(asr_device: str, device: str) -> bool:
    if asr_device == "auto":
        return True
    return torch.device(asr_device).type == torch.device(device).type if device != "auto" else asr_device != "cpu"


def build_plan(cfg: KameConfig, *, device: str = "cuda", headroom: Headroom | None = None,
               weights: str | None = None) -> PlanReport:
    """The memory plan of ``cfg``'s models on a ``device`` (CUDA by default: the card the plan is for);
    ``weights`` "bf16" or "int8" (default: :func:`configured_weights`)."""
    fcfg = cfg.frontend
    dtype = resolve_dtype(fcfg.dtype, torch.device(device))
    notes: list[str] = []
    front = architecture(fcfg.checkpoint, fcfg.revision, cache_dir=cfg.cache_dir)
    weights = weights or configured_weights(cfg, front)
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r}: expected one of {', '.join(WEIGHTS)}")
    _, lora_kw = split_lora(front.lm_kwargs)
    lora = None
    if lora_kw is not None:
        lora = LoraSettings(rank=lora_kw[0], scaling=lora_kw[1], weights=None, fuse=fcfg.fuse_lora)
        notes.append(
            f"LoRA rank {lora.rank}: " + ("fused into the weights at load (its tensors held only while loading)"
                                          if lora.fuse else "kept as separate layers (frontend.fuse_lora false)")
        )
    models = [frontend_footprint(front, dtype, lora, weights=weights), mimi_footprint(front.mimi_config)]
    stt_arch = None
    asr = cfg.asr
    if asr.kind == "kyutai":
        from kame.asr.kyutai_recognizer import DEFAULT_MODEL

        if _same_device(asr.device, device):
            stt_arch = architecture(asr.model or DEFAULT_MODEL, cache_dir=cfg.cache_dir, stt=True)
            stt_dtype = resolve_dtype(fcfg.dtype if asr.share_engine else "auto", torch.device(device))
            models.append(stt_footprint(stt_arch, stt_dtype))
            if not asr.share_engine:
                models.append(mimi_footprint(None, name="stt-mimi"))
        else:
            notes.append(f"Kyutai STT on {asr.device}: not on this card")
    elif asr.kind == "whisper":
        notes.append("Whisper (CTranslate2) not counted: it allocates outside torch (tiny.en: ~0.1 GiB)")
    plan = MemoryPlan(tuple(models), dtype=str(dtype).removeprefix("torch."), headroom=headroom or Headroom(),
                      weights=weights)
    return PlanReport(plan, front, stt_arch, tuple(notes))
