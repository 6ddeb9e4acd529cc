"""A checkpoint of the released width at reduced depth, written with little memory, cached outside the checkout.

moshi's 7B shapes (dim 4096, 32 heads, text card 32000, 16 codebooks of 2048,
context 3000; depformer 1024 wide with weights per step) with ONE main and
ONE depformer layer: about 0.93 B parameters, 3.7 GB in float32. The LM file
is in Kyutai's release layout (fused ``self_attn.in_proj_weight`` /
``out_proj.weight``) with KAME's ``oracle_emb.weight``, float32 as an
unconverted training export would be, so that loading it as bf16 goes through
the loader's tensor-by-tensor cast. Mimi is a small one whose quantizer has
the real 2048 bins (the LM's audio codes must decode), and the tokenizer is
the tiny one.

safetensors' own writer needs every tensor in memory at once (3.7 GB); this
writes the format itself (an 8-byte header length, a JSON header of dtype,
shape and byte offsets, then the raw little-endian data), one tensor at a
time and in row blocks, so generating it holds at most one block.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

#: Bump when the layout or the values change.
REAL_WIDTH_FORMAT = 1
BLOCK_BYTES = 64 * 1024 * 1024


def real_width_lm_kwargs() -> dict[str, Any]:
    from moshi.models import loaders

    kwargs = copy.deepcopy(loaders._lm_kwargs)
    kwargs.update({"num_layers": 1, "depformer_num_layers": 1})
    return kwargs


def cache_root() -> Path:
    """``$KAME_TEST_CACHE_DIR``, else ``~/.cache/kame-test``: kept between runs, outside any checkout."""
    return Path(os.path.expanduser(os.environ.get("KAME_TEST_CACHE_DIR") or "~/.cache/kame-test"))


def _release_shapes(lm: Any) -> dict[str, tuple[int, ...]]:
    """The LM's tensors as the release file names them (fused attention weights), with KAME's oracle table."""
    from kame.frontend.release_layout import WRITTEN_NAMES, attention_modules

    shapes = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    for prefix, mult in attention_modules(lm):
        for split, fused in WRITTEN_NAMES.items():
            keys = [prefix + split.format(i=i) for i in range(mult)]
            if all(k in shapes for k in keys):
                parts = [shapes.pop(k) for k in keys]
                shapes[prefix + fused] = (sum(p[0] for p in parts), *parts[0][1:])
    shapes["oracle_emb.weight"] = shapes["text_emb.weight"]
    return shapes


def write_streamed_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], seed: int) -> None:
    """A float32 safetensors file of random tensors (norm scales 1), generated block by block."""
    import torch

    names = sorted(shapes)
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "kame": f"real-width-v{REAL_WIDTH_FORMAT}"}}
    offset = 0
    for name in names:
        size = 4
        for d in shapes[name]:
            size *= d
        header[name] = {"dtype": "F32", "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in names:
            shape = shapes[name]
            if name.endswith(".alpha"):  # RMS norm scales
                f.write(torch.ones(shape, dtype=torch.float32).numpy().tobytes())
                continue
            rows = shape[0] if shape else 1
            row_bytes = max(1, 4 * (int(torch.Size(shape).numel()) // max(rows, 1)))
            step = max(1, BLOCK_BYTES // row_bytes)
            for start in range(0, rows, step):
                block = (min(step, rows - start), *shape[1:]) if shape else ()
                f.write((0.02 * torch.randn(block, generator=gen)).numpy().tobytes())


def _write(directory: Path, seed: int) -> None:
    import torch
    from moshi.models import loaders
    from safetensors.torch import save_file

    from kame.frontend.loading import _no_init_on_meta
    from kame.frontend.tiny import _init_mimi_codebooks, _layout_state, tiny_mimi_config, train_tokenizer

    directory.mkdir(parents=True)
    lm_kwargs = real_width_lm_kwargs()
    with _no_init_on_meta():
        lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device=torch.device("meta"), dtype=torch.float32)
    write_streamed_safetensors(directory / "model.safetensors", _release_shapes(lm), seed)
    del lm

    torch.manual_seed(seed + 1)
    mimi_cfg = tiny_mimi_config()
    mimi_cfg["quantizer"]["bins"] = lm_kwargs["card"]
    mimi = loaders.get_mimi(None, mimi_cfg, device="cpu", num_codebooks=32)
    _init_mimi_codebooks(mimi, torch.Generator().manual_seed(seed + 1))
    save_file(_layout_state(mimi, "release"), str(directory / "mimi.safetensors"))
    (directory / "mimi_config.json").write_text(json.dumps(mimi_cfg, indent=1))
    train_tokenizer(directory / "tokenizer.model")
    config = {
        "moshi_name": "model.safetensors",
        "mimi_name": "mimi.safetensors",
        "mimi_config_name": "mimi_config.json",
        "tokenizer_name": "tokenizer.model",
        "model_type": "moshi",
        **lm_kwargs,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))


def ensure_real_width_checkpoint(root: Path | None = None, seed: int = 0) -> Path:
    """The cached checkpoint (made on first use, atomically: concurrent runs may race for it)."""
    root = cache_root() if root is None else root
    directory = root / f"real-width-v{REAL_WIDTH_FORMAT}-seed{seed}"
    if (directory / "config.json").is_file():
        return directory
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=root))
    try:
        _write(tmp / "ckpt", seed)
        try:
            os.rename(tmp / "ckpt", directory)
        except OSError:
            if not (directory / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
