"""Every moshi symbol kame uses still exists and the tiny path runs: a future moshi
release that breaks us fails here first."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent

#: module -> attributes kame reads from it. Keep in sync (the scan below checks).
USED = {
    "moshi.models.loaders": [
        "get_moshi_lm", "get_mimi", "CheckpointInfo", "MOSHI_NAME", "MIMI_NAME", "TEXT_TOKENIZER_NAME",
        "_lm_kwargs", "_mimi_config", "get_lora_moshi",
    ],
    "moshi.modules.lora": ["replace_all_linear_with_lora", "LoRALinear"],
    "moshi.models.lm": ["LMGen", "LMModel"],
    "moshi.utils": ["compile"],
    # kame/frontend/moshi_gate.py sets moshi's process-wide compile and graph switches around every call
    "moshi.utils.compile": [
        "no_compile", "no_cuda_graph", "torch_compile_lazy", "_is_cuda_graph_enabled", "_compile_disabled",
        "_disable_cuda_graph",
    ],
    "moshi.utils.quantize": ["replace_linear_with_qlinear", "QLinear"],  # 8-bit weights (kame/frontend/quantized.py)
    "moshi.utils.sampling": ["sample_token"],  # PersonaPlex's 16 depformer steps (kame/frontend/personaplex.py)
    "moshi.modules.transformer": ["StreamingMultiheadAttention"],
    "moshi.quantization.core_vq": ["EuclideanCodebook"],
    "moshi.modules.streaming": ["StreamingModule"],
}
LM_ATTRS = ["text_emb", "text_initial_token_id", "text_padding_token_id", "dtype", "state_dict", "load_state_dict",
            # PersonaPlex (kame.frontend.prompts, kame.frontend.personaplex)
            "transformer", "depformer", "forward_depformer", "dep_q", "delays", "dim", "card"]
LMGEN_METHODS = ["step", "reset_streaming", "set_exec_mask", "streaming_forever",
                 "depformer_step"]  # replaced per instance for PersonaPlex's 16 depformer steps
MIMI_METHODS = ["encode", "decode", "reset_streaming", "set_exec_mask", "streaming_forever", "set_num_codebooks"]


def test_symbols_exist() -> None:
    for module, names in USED.items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name} is gone"
    from moshi.models.lm import LMGen

    for name in LMGEN_METHODS:
        assert hasattr(LMGen, name), name
    from moshi.modules.transformer import StreamingMultiheadAttention

    # the release layout: kame maps fused weights by moshi's per-step count and its load hook's names
    attn = StreamingMultiheadAttention(8, 2, weights_per_step=3)
    assert attn.mult == 3 and [k for k in attn.state_dict()] == [
        *(f"out_projs.{i}.weight" for i in range(3)),
        *(f"in_projs.{i}.weight" for i in range(3)),
    ]


def test_streaming_internals_the_engine_frees_exist() -> None:
    """EngineCore lists streaming children beforehand and drops streaming states at close
    (kame/frontend/engine.py): moshi's private names it sets must keep their meaning."""
    from moshi.modules.streaming import StreamingModule
    from moshi.modules.transformer import StreamingMultiheadAttention

    attn = StreamingMultiheadAttention(8, 2, context=4)
    assert isinstance(attn, StreamingModule)
    assert attn._cached_children is None and attn._streaming_state is None and attn._streaming_detached is False
    assert callable(StreamingModule._apply_named_streaming)
    attn.streaming_forever(1)
    assert attn._cached_children == [("", attn)] and attn._streaming_state is not None


def test_every_moshi_import_is_listed() -> None:
    pattern = re.compile(r"from (moshi[\w.]*) import ([\w, ]+)")
    found: dict[str, set[str]] = {}
    for path in [*ROOT.joinpath("kame").rglob("*.py"), *ROOT.joinpath("server").rglob("*.py")]:
        for module, names in pattern.findall(path.read_text()):
            found.setdefault(module, set()).update(n.split(" as ")[0].strip() for n in names.split(","))
    for module, names in found.items():
        if module == "moshi.models":  # `from moshi.models import loaders`
            continue
        assert module in USED, f"{module} is imported by kame but not listed in USED"
        for name in names:
            assert name in USED[module], f"{module}.{name} is used by kame but not listed in USED"


def test_tiny_path_runs(tiny_kame_ckpt: Path) -> None:
    from kame.frontend.config import FrontendConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=2)
    models = load_frontend(cfg, torch.device("cpu"))
    for name in LM_ATTRS:
        assert hasattr(models.lm, name), name
    for name in MIMI_METHODS:
        assert hasattr(models.mimi, name), name
    core = EngineCore(models, cfg)
    core.attach(0)
    core.attach(1)
    outs = [core.tick({0: np.zeros(1920, np.float32), 1: np.zeros(1920, np.float32)}) for _ in range(4)]
    assert outs[-1][0].text_id is not None and outs[-1][1].audio_codes is not None
    # PersonaPlex's prompts write the LMGen's token cache: [batch, codebooks, positions], per-slot offsets
    state = core.lm_gen._streaming_state
    assert state.cache.dim() == 3 and state.cache.shape[:2] == (2, models.lm.num_codebooks)
    assert state.offsets.shape == (2,)
