"""8-bit weights: Kyutai's q8 checkpoints as released, and a bf16 checkpoint quantized at load.

Both go through moshi's own quantized linear layer (``moshi.utils.quantize``:
bitsandbytes' ``int8_vectorwise_quant``, an int8 ``weight`` and a float32
``weight_scb`` a row, ``bnb.matmul`` in float16). A q8 checkpoint says
``quantize: true`` in config.json (moshi's ``scripts/export_quantized.py``
writes it), so moshi's ``LMModel`` builds those layers itself; with
``frontend.weights: int8`` kame builds the same layers and quantizes each
float weight with moshi's QLinear as it is read (the float model is never
whole on the device).
Only ``nn.Linear`` layers change: the embeddings and KAME's oracle table stay
in ``frontend.dtype``. bitsandbytes runs these layers on CUDA and on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from kame.errors import CheckpointError

if TYPE_CHECKING:
    import torch

    from kame.frontend.checkpoint import CheckpointFiles

Weights = Literal["bf16", "int8"]
WEIGHTS: tuple[Weights, ...] = ("bf16", "int8")
#: State-dict suffix of a quantized linear's float32 scales (moshi's QLinear).
SCALE_SUFFIX = "_scb"


def is_quantized(lm_kwargs: Mapping[str, Any] | None) -> bool:
    """Whether a checkpoint's config.json declares moshi's 8-bit layers (``quantize: true``)."""
    return bool((lm_kwargs or {}).get("quantize"))


def effective_weights(requested: str, checkpoint_quantized: bool) -> Weights:
    """The weights a load ends with: a q8 checkpoint is int8 whatever was asked (its float weights are gone)."""
    if requested not in WEIGHTS:
        raise CheckpointError(f"frontend.weights {requested!r}: expected one of {', '.join(WEIGHTS)}")
    return "int8" if checkpoint_quantized or requested == "int8" else "bf16"


def keeps_float32(key: str) -> bool:
    """A quantized linear's scales stay float32 (moshi's QLinear refuses any other dtype)."""
    return key.endswith(SCALE_SUFFIX)


def require_bitsandbytes(source: str) -> None:
    """One sentence when bitsandbytes is missing, before any weight is read."""
    import logging

    # Its CPU backend warns at import that an optional 4-bit kernel package is missing: 4-bit is not used here.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise CheckpointError(
            f"checkpoint {source}: 8-bit weights need bitsandbytes (pip install 'bitsandbytes>=0.50'; "
            f"./scripts/install.sh installs it)"
        ) from None
    except Exception as exc:  # a broken native library
        raise CheckpointError(f"checkpoint {source}: bitsandbytes cannot be loaded ({exc})") from None


def quantize_linears(lm: Any) -> Any:
    """moshi's ``replace_linear_with_qlinear`` on a loaded LM: every ``nn.Linear`` becomes int8 + scales
    (one layer at a time, so the peak is the model plus one layer's float16 copy); embeddings untouched."""
    from moshi.utils.quantize import replace_linear_with_qlinear

    replace_linear_with_qlinear(lm)
    return lm


def with_quantize(files: CheckpointFiles) -> CheckpointFiles:
    """``files`` whose LM is built with moshi's 8-bit layers (``quantize: true`` over its LM keywords)."""
    from moshi.models import loaders

    base = dict(files.lm_kwargs) if files.lm_kwargs is not None else dict(loaders._lm_kwargs)
    return replace(files, lm_kwargs={**base, "quantize": True})


def quantized_weight_keys(lm: Any) -> set[str]:
    """State-dict keys of the int8 weights of moshi's quantized linears in ``lm``."""
    from moshi.utils.quantize import QLinear

    return {f"{name}.weight" for name, m in lm.named_modules() if isinstance(m, QLinear)}


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One float linear weight -> (int8 weight, float32 scales), by moshi's own QLinear (on the weight's device)."""
    import torch
    from moshi.utils.quantize import QLinear

    linear = torch.nn.Linear(1, 1, bias=False, device="meta")
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    q = QLinear(linear)
    return q.weight.data, q.weight_scb.data


def count_quantized(lm: Any) -> int:
    """How many of moshi's quantized linears ``lm`` holds."""
    from moshi.utils.quantize import QLinear

    return sum(1 for m in lm.modules() if isinstance(m, QLinear))
