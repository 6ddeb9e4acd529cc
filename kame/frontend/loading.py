"""Building Mimi, the LM (with KAME's ``oracle_emb``) and the tokenizer from checkpoint files.

moshi's strict loader refuses the extra ``oracle_emb.weight`` key of a KAME
checkpoint, so the LM is built empty (meta device) through moshi's own
``get_moshi_lm`` and the weights are checked and loaded here: the oracle
table is taken out, every other key must match the model by name and shape
once Kyutai's fused release layout is mapped (:mod:`kame.frontend.release_layout`).
A plain Moshi checkpoint (no oracle table) gets a copy of ``text_emb``.
Tensors are read, split, cast and moved one at a time, so peak host memory
is the loaded model plus the largest single tensor of the file.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kame.errors import CheckpointError
from kame.frontend.checkpoint import CheckpointFiles
from kame.frontend.personaplex import AGENT_CODEBOOKS
from kame.frontend.quantized import (
    SCALE_SUFFIX,
    Weights,
    effective_weights,
    is_quantized,
    keeps_float32,
    quantize_linears,
    quantize_weight,
    quantized_weight_keys,
    require_bitsandbytes,
    with_quantize,
)
from kame.frontend.release_layout import (
    TensorPlan,
    attention_modules,
    codebook_prefixes,
    fused_key_map,
    plan_load,
    renamed_key_map,
)

ORACLE_KEY = "oracle_emb.weight"
#: Bytes of tensors read through one mapping of the file before it is reopened.
REOPEN_BYTES = 64 * 1024 * 1024


@dataclass
class LoadedLM:
    lm: Any  # moshi.models.lm.LMModel
    oracle_weight: torch.Tensor  # (text_card + 1, dim), on the LM's device and dtype
    has_oracle: bool  # True: the checkpoint carried its own oracle_emb (a KAME checkpoint)
    weights: Weights = "bf16"  # int8: moshi's 8-bit linears (a q8 checkpoint, or frontend.weights int8)


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a safetensors file, read from its header only."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as exc:  # safetensors raises its own error types, OSError, ValueError
        raise CheckpointError(f"checkpoint file {path}: not a readable safetensors file ({exc})") from None


def _read_planned(
    path: Path,
    plans: list[TensorPlan],
    convert: Callable[[str, torch.Tensor], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Read the planned tensors ONE at a time, split fused ones, convert each piece.

    ``convert`` casts and moves a module tensor; the file's own copy of a
    tensor is dropped before the next one is read, so a float32 file loaded
    as bf16 (or onto a GPU) never sits whole in host memory.
    """
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    try:
        pending = list(plans)
        while pending:
            # The file is mapped while open and every page read stays resident
            # until it is closed: reopen it every REOPEN_BYTES so that mapped
            # pages of tensors already converted are released as we go.
            with safe_open(str(path), framework="pt", device="cpu") as f:
                read = 0
                while pending and read < REOPEN_BYTES:
                    plan = pending.pop(0)
                    raw = f.get_tensor(plan.file_key)
                    read += raw.numel() * raw.element_size()
                    if len(plan.targets) == 1:
                        out[plan.targets[0]] = convert(plan.targets[0], raw)
                    else:
                        pieces = raw.view(len(plan.targets), -1, *raw.shape[1:])
                        for i, target in enumerate(plan.targets):
                            out[target] = convert(target, pieces[i])
                    del raw
    except CheckpointError:
        raise
    except Exception as exc:  # a truncated file, an I/O error
        raise CheckpointError(f"checkpoint file {path}: not a readable safetensors file ({exc})") from None
    return out


def _plan(path: Path, module: Any, expected: dict[str, tuple[int, ...]], skip: tuple[str, ...] = ()) -> list[TensorPlan]:
    shapes = {k: v for k, v in _file_shapes(path).items() if k not in skip}
    mapped = fused_key_map(attention_modules(module), expected)
    mapped.update(renamed_key_map(codebook_prefixes(module), expected))
    return plan_load(path, shapes, expected, mapped)


def _moved(value: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Onto ``device`` first, then cast there: no second host copy in the target dtype."""
    if value.device != device:
        value = value.to(device)
    if value.dtype != dtype:
        value = value.to(dtype)
    return value


#: ``torch.nn.init`` functions the modules' ``reset_parameters`` call.
_INIT_FUNCTIONS = (
    "normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
    "xavier_normal_", "ones_", "zeros_", "constant_",
)


@contextlib.contextmanager
def _no_init_on_meta() -> Iterator[None]:
    """Skip ``torch.nn.init`` on meta tensors while the empty LM is built.

    A meta tensor holds no values, so initialising one does nothing useful, but the first ``normal_``
    on one goes through ``torch._refs`` and imports ``torch._dynamo``: about 1.2 s of CPU in every
    process that loads a model (each server start), for a module that is never used with
    ``torch.compile`` off. Any other tensor is initialised as before, so a thread building a real
    module meanwhile is unaffected; a nested or concurrent use restores to wrappers that behave the same.
    """
    originals = {name: getattr(torch.nn.init, name) for name in _INIT_FUNCTIONS}

    def skipping(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(original)
        def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            return tensor if tensor.is_meta else original(tensor, *args, **kwargs)

        return init

    for name, original in originals.items():
        setattr(torch.nn.init, name, skipping(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.nn.init, name, original)


#: LMModel keywords moshi's ``get_moshi_lm`` pops to build LoRA layers (with their defaults there).
LORA_KEYS = ("lora", "lora_rank", "lora_scaling")


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA fine-tune as its config.json declares it (moshi-finetune writes ``lora``, ``lora_rank``,
    ``lora_scaling``; the adapter file is ``lora_name`` or ``--lora-weight``)."""

    rank: int
    scaling: float
    weights: Path | None  # None: the config declares LoRA layers but names no file
    fuse: bool = True


def split_lora(lm_kwargs: dict[str, Any] | None) -> tuple[dict[str, Any] | None, tuple[int, float] | None]:
    """``lm_kwargs`` without moshi's LoRA keywords, and (rank, scaling) when ``lora`` is set."""
    if lm_kwargs is None:
        return None, None
    rest = {k: v for k, v in lm_kwargs.items() if k not in LORA_KEYS}
    if not lm_kwargs.get("lora"):
        return rest, None
    # moshi's defaults when the keys are absent (get_moshi_lm)
    return rest, (int(lm_kwargs.get("lora_rank", 128)), float(lm_kwargs.get("lora_scaling", 2.0)))


def lora_settings(files: CheckpointFiles, weights: Path | None = None, fuse: bool = True) -> LoraSettings | None:
    """The checkpoint's LoRA (``weights`` overrides its ``lora_name``), or None; a file without
    ``lora: true`` in config.json, or ``lora: true`` without a file, is one sentence."""
    _, lora = split_lora(files.lm_kwargs)
    path = weights if weights is not None else files.lora_weights
    if lora is None:
        if path is not None:
            raise CheckpointError(
                f"checkpoint {files.source}: LoRA weights {path} given, but its config.json does not set "
                f"\"lora\": true (with lora_rank and lora_scaling, as moshi-finetune writes them)"
            )
        return None
    if path is None:
        raise CheckpointError(
            f"checkpoint {files.source}: config.json sets \"lora\": true but names no LoRA weights "
            f"(lora_name): set frontend.lora_weights (kame serve --lora-weight FILE)"
        )
    if path.suffix not in (".safetensors", ".sft", ".sfts"):
        raise CheckpointError(f"LoRA weights {path}: only safetensors files are supported")
    return LoraSettings(rank=lora[0], scaling=lora[1], weights=path, fuse=fuse)


def build_empty_lm(files: CheckpointFiles, dtype: torch.dtype) -> Any:
    """The LM of ``files`` on the meta device, through moshi's own ``get_moshi_lm`` (LoRA layers not
    added: :func:`with_lora_layers` does that, on a copy or after the base weights are in)."""
    from moshi.models import loaders

    lm_kwargs, _ = split_lora(files.lm_kwargs)
    if is_quantized(lm_kwargs):  # moshi builds its 8-bit layers with bitsandbytes
        require_bitsandbytes(files.source)
    try:
        # The default device too: moshi builds a few Linears without a device argument (text_linear,
        # depformer_in, linears: 0.2 B parameters at 7B), which would otherwise be allocated and
        # initialised on the CPU (seconds, hundreds of MB) only to be replaced by the file's tensors.
        with torch.device("meta"), _no_init_on_meta():
            return loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device=torch.device("meta"), dtype=dtype)
    except (TypeError, AssertionError) as exc:
        raise CheckpointError(f"checkpoint {files.source}: config.json has an invalid LM setting ({exc})") from None


def with_lora_layers(lm: Any, lora: LoraSettings) -> Any:
    """A meta copy of ``lm`` with moshi's LoRA layers (what moshi's loader builds before reading a LoRA file)."""
    import copy

    from moshi.modules.lora import replace_all_linear_with_lora

    probe = copy.deepcopy(lm)
    replace_all_linear_with_lora(probe, lora.rank, lora.scaling, device=torch.device("meta"))
    return probe


def lora_shapes(probe: Any) -> dict[str, tuple[int, ...]]:
    """The LoRA adapter tensors of a model built by :func:`with_lora_layers`, by state-dict name."""
    return {
        k: tuple(v.shape) for k, v in probe.state_dict().items() if k.endswith((".lora_A.weight", ".lora_B.weight"))
    }


def check_lora_file(probe: Any, lora: LoraSettings) -> None:
    """The LoRA file's names and shapes against ``probe`` (either attention layout), from its header:
    one sentence naming the first unknown, missing or misshapen key."""
    assert lora.weights is not None
    expected = lora_shapes(probe)
    plan_load(lora.weights, _file_shapes(lora.weights), expected, fused_key_map(attention_modules(probe), expected))


def _apply_lora(lm: Any, lora: LoraSettings, device: torch.device, dtype: torch.dtype) -> Any:
    """moshi's own LoRA loader on the loaded base LM: adapters added, loaded, fused unless ``lora.fuse`` is off."""
    from moshi.models import loaders

    try:
        return loaders.get_lora_moshi(
            lm, lora_weights=lora.weights, lora_rank=lora.rank, lora_scaling=lora.scaling,
            dtype=dtype, device=device, fuse_lora=lora.fuse,
        )
    except RuntimeError as exc:  # what the check above missed (moshi's own load_state_dict)
        raise CheckpointError(f"LoRA weights {lora.weights}: cannot be loaded ({exc})") from None


def load_lm(
    files: CheckpointFiles,
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    lora_weights: Path | None = None,
    fuse_lora: bool = True,
    weights: str = "bf16",
) -> LoadedLM:
    """The LM with weights loaded, plus its oracle table (own or copied from text_emb).

    Both of Kyutai's layouts load: fused attention weights (the release
    files) and moshi's per-step ones (what ``state_dict()`` gives). A LoRA
    fine-tune (``lora`` in config.json, adapters in ``lora_name`` or
    ``lora_weights``) is added by moshi's own loader after the base weights,
    fused into them unless ``fuse_lora`` is false, as KAME's and moshi's servers do.
    8-bit (:mod:`kame.frontend.quantized`): a q8 checkpoint (``quantize: true``)
    loads its int8 weights and float32 scales into moshi's quantized linears;
    ``weights="int8"`` quantizes a float checkpoint's linears as they are read.
    """
    device = torch.device(device)
    if files.lm_weights.suffix not in (".safetensors", ".sft", ".sfts"):
        raise CheckpointError(f"checkpoint file {files.lm_weights}: only safetensors LM weights are supported")
    lora = lora_settings(files, lora_weights, fuse_lora)
    quantized = is_quantized(files.lm_kwargs)
    wanted = effective_weights(weights, quantized)
    if wanted == "int8":
        if lora is not None and (quantized or not lora.fuse):
            raise CheckpointError(
                f"checkpoint {files.source}: LoRA adapters cannot be "
                + ("added to a q8 checkpoint's 8-bit weights (as in moshi): use its bf16 release"
                   if quantized else "kept as separate layers with 8-bit weights: fuse them (frontend.fuse_lora true)")
            )
        require_bitsandbytes(files.source)
    # int8 from a float file: moshi's 8-bit layers built empty and each linear quantized as it is read, so the
    # float model never sits whole on the device (a card too small for bf16 loads it); with LoRA adapters
    # to fuse first, the linears are quantized once the adapters are in.
    at_load = wanted == "int8" and not quantized and lora is None
    lm = build_empty_lm(with_quantize(files) if at_load else files, dtype)
    if lora is not None:  # a LoRA file that cannot load is refused before the base weights are read
        check_lora_file(with_lora_layers(lm, lora), lora)
    expected = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    qweights = quantized_weight_keys(lm) if at_load else set()
    scales: dict[str, torch.Tensor] = {}
    expected_in_file = {k: v for k, v in expected.items() if k.removesuffix(SCALE_SUFFIX) not in qweights
                        or not k.endswith(SCALE_SUFFIX)}
    file_shapes = _file_shapes(files.lm_weights)
    oracle_shape = file_shapes.get(ORACLE_KEY)
    want_oracle = expected["text_emb.weight"]
    if oracle_shape is not None and tuple(oracle_shape) != want_oracle:
        raise CheckpointError(
            f"checkpoint file {files.lm_weights}: key {ORACLE_KEY} has shape {tuple(oracle_shape)}, "
            f"expected {want_oracle} (same as text_emb)"
        )
    plans = _plan(files.lm_weights, lm, expected_in_file, skip=(ORACLE_KEY,))
    if oracle_shape is not None:
        plans.append(TensorPlan(ORACLE_KEY, (ORACLE_KEY,)))

    def convert(key: str, value: torch.Tensor) -> torch.Tensor:
        if not value.dtype.is_floating_point:
            return _moved(value, device, value.dtype)
        if key in qweights:
            int8, scales[key + SCALE_SUFFIX] = quantize_weight(_moved(value, device, dtype))
            return int8
        keep_fp32 = key.startswith(("condition_provider.", "fuser.")) or keeps_float32(key)
        return _moved(value, device, torch.float32 if keep_fp32 else dtype)

    state = _read_planned(files.lm_weights, plans, convert)
    state.update(scales)
    oracle = state.pop(ORACLE_KEY, None)
    lm.load_state_dict(state, assign=True, strict=True)
    del state
    if lora is not None:
        lm = _apply_lora(lm, lora, device, dtype)
    if wanted == "int8" and not quantized and not at_load:
        lm = quantize_linears(lm)
    lm.eval()
    if files.personaplex:
        # 16 depformer steps loaded; LMGen must see the agent's 8 (kame.frontend.personaplex).
        lm.dep_q = AGENT_CODEBOOKS
    text_weight = lm.text_emb.weight
    if oracle is None:
        oracle_weight = text_weight.detach().clone()
        has_oracle = False
    else:
        oracle_weight = oracle.to(dtype=text_weight.dtype)
        has_oracle = True
    return LoadedLM(lm=lm, oracle_weight=oracle_weight, has_oracle=has_oracle, weights=wanted)


def load_mimi(files: CheckpointFiles, device: str | torch.device, num_codebooks: int = 8) -> Any:
    """Mimi with its weights; ``num_codebooks`` 8 for Moshi, 32 for Kyutai STT."""
    from moshi.models import loaders

    device = torch.device(device)
    config = files.mimi_config or loaders._mimi_config
    try:
        mimi = loaders.get_mimi(None, config, device=device, num_codebooks=num_codebooks)
    except (TypeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {files.source}: invalid Mimi config ({exc})") from None
    own = mimi.state_dict()
    expected = {k: tuple(v.shape) for k, v in own.items()}
    plans = _plan(files.mimi_weights, mimi, expected)
    state = _read_planned(files.mimi_weights, plans, lambda key, value: _moved(value, device, own[key].dtype))
    mimi.load_state_dict(state, strict=True)
    del state
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
    if files.personaplex:
        return AGENT_CODEBOOKS
    if not kw:
        return 8
    n_q, dep_q = int(kw.get("n_q", 16)), int(kw.get("dep_q", 8))
    return max(dep_q, n_q - dep_q)
