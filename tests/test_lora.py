"""LoRA fine-tunes (moshi-finetune's output: ``lora``/``lora_rank``/``lora_scaling`` in config.json, adapters in
``lora_name`` or given by hand) load as moshi's and KAME's own loaders load them, fused by default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kame.errors import CheckpointError
from kame.frontend.checkpoint import resolve_checkpoint
from kame.frontend.config import FrontendConfig
from kame.frontend.loading import LoraSettings, build_empty_lm, load_lm, lora_shapes, with_lora_layers

RANK, SCALING = 4, 2.0


def _lora_state(ckpt: Path, rank: int = RANK, seed: int = 7) -> dict[str, torch.Tensor]:
    """Random adapters for every linear of the checkpoint's LM, named as moshi's LoRA model names them
    (both A and B non-zero, so that fusing changes every weight)."""
    files = resolve_checkpoint(ckpt)
    probe = with_lora_layers(build_empty_lm(files, torch.float32), LoraSettings(rank, SCALING, None))
    gen = torch.Generator().manual_seed(seed)
    return {k: 0.1 * torch.randn(shape, generator=gen) for k, shape in lora_shapes(probe).items()}


def _fused_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Attention adapters under the fused names moshi's load hook splits (``self_attn.in_proj.lora_A.weight``:
    the per-step tensors concatenated along dim 0), the rest as is."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for key, value in state.items():
        for split, fused in (("in_projs", "in_proj"), ("out_projs", "out_proj")):
            marker = f".self_attn.{split}."
            if marker in key:
                head, tail = key.split(marker)
                step, rest = tail.split(".", 1)
                groups.setdefault(f"{head}.self_attn.{fused}.{rest}", []).append((int(step), value))
                break
        else:
            out[key] = value
    for key, parts in groups.items():
        out[key] = torch.cat([v for _, v in sorted(parts, key=lambda p: p[0])], dim=0).contiguous()
    return out


def _lora_checkpoint(src: Path, dst: Path, state: dict[str, torch.Tensor], *, name: str | None = "lora.safetensors",
                     rank: int = RANK) -> Path:
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update({"lora": True, "lora_rank": rank, "lora_scaling": SCALING})
    if name is not None:
        config["lora_name"] = name
        save_file(state, str(dst / name))
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return dst


@pytest.mark.parametrize("layout", ["split", "fused"])
def test_lora_loads_as_moshis_own_loader_loads_it(tiny_moshi_ckpt: Path, tmp_path: Path, layout: str) -> None:
    """Every tensor equals moshi's get_moshi_lm(lora_weights=..., fuse_lora=True) on the same files."""
    from moshi.models import loaders

    state = _lora_state(tiny_moshi_ckpt)
    ckpt = _lora_checkpoint(tiny_moshi_ckpt, tmp_path / "ckpt", _fused_names(state) if layout == "fused" else state)
    files = resolve_checkpoint(ckpt)
    assert files.lora_weights == ckpt / "lora.safetensors"
    ours = load_lm(files, "cpu", torch.float32).lm
    theirs = loaders.get_moshi_lm(files.lm_weights, lm_kwargs=files.lm_kwargs, device="cpu", dtype=torch.float32,
                                  lora_weights=files.lora_weights, fuse_lora=True)
    base = load_lm(resolve_checkpoint(tiny_moshi_ckpt), "cpu", torch.float32).lm.state_dict()
    mine, ref = ours.state_dict(), theirs.state_dict()
    assert mine.keys() == ref.keys() == base.keys()  # fused: no adapter left
    for key in ref:
        assert torch.equal(mine[key], ref[key]), key
    key = "transformer.layers.0.self_attn.in_projs.0.weight"
    a, b = state[key.replace(".weight", ".lora_A.weight")], state[key.replace(".weight", ".lora_B.weight")]
    assert torch.allclose(mine[key], base[key] + SCALING * b @ a, atol=1e-6)


def test_unfused_lora_keeps_adapters_and_computes_the_same(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    from moshi.modules.lora import LoRALinear

    ckpt = _lora_checkpoint(tiny_kame_ckpt, tmp_path / "ckpt", _lora_state(tiny_kame_ckpt))
    files = resolve_checkpoint(ckpt)
    fused = load_lm(files, "cpu", torch.float32)
    kept = load_lm(files, "cpu", torch.float32, fuse_lora=False)
    assert kept.has_oracle and torch.equal(kept.oracle_weight, fused.oracle_weight)
    layer = kept.lm.transformer.layers[0].self_attn.in_projs[0]
    assert isinstance(layer, LoRALinear)
    x = torch.randn(3, layer.in_features)
    with torch.no_grad():
        assert torch.allclose(layer(x), fused.lm.transformer.layers[0].self_attn.in_projs[0](x), atol=1e-5)


@pytest.mark.parametrize("fuse", [True, False])
def test_a_lora_checkpoint_serves_through_the_engine(tiny_kame_ckpt: Path, tmp_path: Path, fuse: bool) -> None:
    """The engine ticks a LoRA checkpoint (given by hand, as --lora-weight), fused or not, at batch 2 with an
    oracle."""
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    state = _lora_state(tiny_kame_ckpt)
    ckpt = _lora_checkpoint(tiny_kame_ckpt, tmp_path / "ckpt", state, name=None)
    from safetensors.torch import save_file

    save_file(_fused_names(state), str(tmp_path / "adapters.safetensors"))
    cfg = FrontendConfig(checkpoint=str(ckpt), lora_weights=str(tmp_path / "adapters.safetensors"), batch_size=2,
                         seed=1, fuse_lora=fuse)
    models = load_frontend(cfg, torch.device("cpu"))
    core = EngineCore(models, cfg, batch_size=2)
    for slot in (0, 1):
        core.attach(slot)
    answer = models.encode_text("hello there")
    core.oracle_reset(0, answer)
    silence = np.zeros(core.frame_size, np.float32)
    outs = [core.tick({0: silence, 1: silence}) for _ in range(4)]
    assert [o[0].oracle_id for o in outs] == [models.start_id, *answer, models.idle_id()][:4]
    assert all(o[1].oracle_id == models.idle_id() for o in outs)
    assert outs[-1][0].text_id is not None and outs[-1][0].pcm.shape == (core.frame_size,)


def test_lora_rank_mismatch_is_one_sentence_naming_the_key(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    ckpt = _lora_checkpoint(tiny_kame_ckpt, tmp_path / "ckpt", _lora_state(tiny_kame_ckpt, rank=8))  # config: 4
    with pytest.raises(CheckpointError) as err:
        load_lm(resolve_checkpoint(ckpt), "cpu", torch.float32)
    msg = str(err.value)
    assert "lora.safetensors: key " in msg and ".lora_A.weight has shape (8, " in msg
    assert "the config expects (4, " in msg and "\n" not in msg


def test_lora_file_missing_adapters_is_refused(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    state = _lora_state(tiny_kame_ckpt)
    del state["text_linear.lora_B.weight"]
    ckpt = _lora_checkpoint(tiny_kame_ckpt, tmp_path / "ckpt", state)
    with pytest.raises(CheckpointError, match=r"lora.safetensors: missing keys text_linear.lora_B.weight"):
        load_lm(resolve_checkpoint(ckpt), "cpu", torch.float32)


def test_lora_without_file_or_file_without_lora_is_one_sentence(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    no_file = _lora_checkpoint(tiny_kame_ckpt, tmp_path / "a", {}, name=None)
    with pytest.raises(CheckpointError, match=r'sets "lora": true but names no LoRA weights .*--lora-weight'):
        load_lm(resolve_checkpoint(no_file), "cpu", torch.float32)
    from safetensors.torch import save_file

    save_file(_lora_state(tiny_kame_ckpt), str(tmp_path / "x.safetensors"))
    with pytest.raises(CheckpointError, match=r'does not set "lora": true'):
        load_lm(resolve_checkpoint(tiny_kame_ckpt), "cpu", torch.float32, lora_weights=tmp_path / "x.safetensors")


def test_plan_counts_lora_adapters(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    from kame.config import KameConfig
    from kame.frontend.plan_models import build_plan

    state = _lora_state(tiny_kame_ckpt)
    ckpt = _lora_checkpoint(tiny_kame_ckpt, tmp_path / "ckpt", state)
    adapters = sum(v.numel() for v in state.values())

    def front(fuse: bool) -> tuple[int, int, int]:
        cfg = KameConfig.model_validate({"frontend": {"checkpoint": str(ckpt), "dtype": "float32", "fuse_lora": fuse},
                                         "asr": {"kind": "none"}, "cache_dir": str(tmp_path)})
        m = build_plan(cfg).plan.model("frontend")
        return m.params, m.weight_bytes, m.load_extra_bytes

    plain = build_plan(KameConfig.model_validate({"frontend": {"checkpoint": str(tiny_kame_ckpt), "dtype": "float32"},
                                                  "asr": {"kind": "none"}})).plan.model("frontend")
    assert front(True) == (plain.params, plain.weight_bytes, 4 * adapters)  # fused: held only while loading
    assert front(False) == (plain.params + adapters, plain.weight_bytes + 4 * adapters, 0)


def test_kame_run_lora_weight_flag_reaches_the_loader(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    """`--lora-weight` overrides config.json's lora_name: a file of the wrong rank is refused in one line naming it."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    ckpt = _lora_checkpoint(tiny_kame_ckpt, tmp_path / "ckpt", _lora_state(tiny_kame_ckpt))  # a good lora_name
    save_file(_lora_state(tiny_kame_ckpt, rank=2), str(tmp_path / "rank2.safetensors"))
    wav = tmp_path / "in.wav"
    import wave

    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(np.zeros(2400, "<i2").tobytes())
    res = subprocess.run(
        [sys.executable, "-m", "kame.cli", "run", "--checkpoint", str(ckpt), "--input", str(wav), "--output",
         str(tmp_path / "out.wav"), "--fast", "--lora-weight", str(tmp_path / "rank2.safetensors"), "--no-fuse-lora"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = [x for x in res.stderr.splitlines() if "error:" in x]
    assert "rank2.safetensors: key " in line and "has shape (2, " in line and "the config expects (4, " in line


def test_a_checkpoint_the_engine_cannot_run_is_refused_at_load(kame_cache_dir: Path) -> None:
    """An STT-shaped LM as the front-end loads fine but would fail at its first step: refused in one sentence."""
    from kame.frontend.models import load_frontend, runnable_mismatch
    from kame.frontend.tiny import ensure_tiny_checkpoint

    stt = ensure_tiny_checkpoint(kame_cache_dir, 0, stt=True)
    with pytest.raises(CheckpointError, match=r"the engine cannot run it: its LM generates no audio \(dep_q 0"):
        load_frontend(FrontendConfig(checkpoint=str(stt), batch_size=1), torch.device("cpu"))
    ok = {"dep_q": 8, "n_q": 16, "card": 2048, "text_card": 32000, "mimi_cardinality": 2048, "mimi_codebooks": 32,
          "tokenizer_pieces": 32000}
    assert runnable_mismatch(**ok) is None
    assert runnable_mismatch(**{**ok, "mimi_cardinality": 64}) == (
        "the LM's audio tokens have 2048 values but Mimi's codebooks 64 entries")
    assert "reads 9 audio codebooks but Mimi has 8" in str(runnable_mismatch(**{**ok, "n_q": 17, "dep_q": 8,
                                                                               "mimi_codebooks": 8}))
    assert "tokenizer has 32001 pieces" in str(runnable_mismatch(**{**ok, "tokenizer_pieces": 32001}))
