"""Checkpoints: tiny ones are deterministic and atomic; real layout; clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kame.errors import CheckpointError
from kame.frontend.checkpoint import resolve_checkpoint
from kame.frontend.config import FrontendConfig
from kame.frontend.loading import _no_init_on_meta, load_lm, load_mimi
from kame.frontend.models import load_frontend
from kame.frontend.tiny import make_tiny_checkpoint


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_tiny_checkpoint_deterministic_per_seed(tmp_path: Path) -> None:
    a = make_tiny_checkpoint(tmp_path / "a", seed=5)
    b = make_tiny_checkpoint(tmp_path / "b", seed=5)
    c = make_tiny_checkpoint(tmp_path / "c", seed=6)
    assert _files(a) == _files(b)
    assert _files(a)["model.safetensors"] != _files(c)["model.safetensors"]
    cfg = json.loads((a / "config.json").read_text())
    for key in ("moshi_name", "mimi_name", "mimi_config_name", "tokenizer_name", "model_type", "lm_gen_config"):
        assert key in cfg


def test_tiny_checkpoint_race_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "race"
    code = "import sys; from kame.frontend.tiny import make_tiny_checkpoint; make_tiny_checkpoint(sys.argv[1], 1)"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(target)]) for _ in range(2)]
    assert all(p.wait(120) == 0 for p in procs)
    assert (target / "config.json").is_file()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "race"]
    assert leftovers == []
    load_frontend(FrontendConfig(checkpoint=str(target)), torch.device("cpu"))


def test_tiny_tokenizer_special_ids(tiny_kame_ckpt: Path) -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tiny_kame_ckpt / "tokenizer.model"))
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3)
    cfg = json.loads((tiny_kame_ckpt / "config.json").read_text())
    assert sp.vocab_size() <= cfg["text_card"]


def test_kame_checkpoint_loads_oracle_table(tiny_kame_ckpt: Path) -> None:
    from safetensors.torch import load_file

    files = resolve_checkpoint(str(tiny_kame_ckpt))
    loaded = load_lm(files, "cpu", torch.float32)
    assert loaded.has_oracle
    raw = load_file(str(tiny_kame_ckpt / "model.safetensors"))
    assert torch.equal(loaded.oracle_weight, raw["oracle_emb.weight"])
    assert not torch.equal(loaded.oracle_weight, loaded.lm.text_emb.weight)
    assert loaded.lm.text_initial_token_id == json.loads((tiny_kame_ckpt / "config.json").read_text())["text_card"]


def test_plain_moshi_checkpoint_copies_text_table(tiny_moshi_ckpt: Path) -> None:
    models = load_frontend(FrontendConfig(checkpoint=str(tiny_moshi_ckpt)), torch.device("cpu"))
    assert not models.has_oracle
    assert torch.equal(models.oracle_weight, models.lm.text_emb.weight)
    assert models.idle_id() == -1


def test_moshi_own_loader_reads_the_layout(tiny_moshi_ckpt: Path) -> None:
    """moshi's CheckpointInfo reads our config.json; its models match ours."""
    from moshi.models import loaders

    d = tiny_moshi_ckpt
    info = loaders.CheckpointInfo.from_hf_repo(
        "local/unused",
        moshi_weights=d / "model.safetensors",
        mimi_weights=d / "mimi.safetensors",
        tokenizer=d / "tokenizer.model",
        config_path=d / "config.json",
        mimi_config_path=d / "mimi_config.json",
    )
    lm = info.get_moshi(device="cpu", dtype=torch.float32)
    ours = load_frontend(FrontendConfig(checkpoint=str(d)), torch.device("cpu"))
    for key, value in lm.state_dict().items():
        assert torch.equal(value, ours.lm.state_dict()[key]), key
    mimi = info.get_mimi("cpu")
    assert mimi.num_codebooks == ours.mimi.num_codebooks == 8


def test_mimi_with_32_codebooks(tiny_kame_ckpt: Path) -> None:
    files = resolve_checkpoint(str(tiny_kame_ckpt))
    mimi32 = load_mimi(files, "cpu", 32)
    mimi8 = load_mimi(files, "cpu", 8)
    pcm = torch.randn(1, 1, 1920 * 3) * 0.1
    with torch.no_grad():
        c32 = mimi32.encode(pcm)
        c8 = mimi8.encode(pcm)
    assert c32.shape[1] == 32 and c8.shape[1] == 8
    assert torch.equal(c32[:, :8], c8)
    assert len(set(c32.flatten().tolist())) > 4  # codebooks initialised: not all zeros


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_file_named(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    (d / "mimi.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"mimi\.safetensors: missing"):
        resolve_checkpoint(str(d))


def test_wrong_shape_named(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    cfg = json.loads((d / "config.json").read_text())
    cfg["dim"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: key .* has shape"):
        load_frontend(FrontendConfig(checkpoint=str(d)), torch.device("cpu"))


def test_unknown_key_named(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    state = load_file(str(d / "model.safetensors"))
    state["surprise.weight"] = torch.zeros(2)
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unknown keys surprise\.weight"):
        load_frontend(FrontendConfig(checkpoint=str(d)), torch.device("cpu"))


def test_corrupt_weights_named(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors"):
        load_frontend(FrontendConfig(checkpoint=str(d)), torch.device("cpu"))


def test_directory_without_config_uses_moshi_defaults(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    from moshi.models import loaders

    d = tmp_path / "legacy"
    d.mkdir()
    with pytest.raises(CheckpointError, match=loaders.MOSHI_NAME):
        resolve_checkpoint(str(d))
    shutil.copy(tiny_kame_ckpt / "model.safetensors", d / loaders.MOSHI_NAME)
    shutil.copy(tiny_kame_ckpt / "mimi.safetensors", d / loaders.MIMI_NAME)
    shutil.copy(tiny_kame_ckpt / "tokenizer.model", d / loaders.TEXT_TOKENIZER_NAME)
    files = resolve_checkpoint(str(d))
    assert files.lm_kwargs is None  # the 7B config
    with pytest.raises(CheckpointError, match="missing keys|has shape"):  # tiny weights vs the 7B config
        load_lm(files, "cpu", torch.float32)


def test_hub_offline_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="kame download --checkpoint SakanaAI/kame"):
        resolve_checkpoint("SakanaAI/kame")
    assert time.monotonic() - t0 < 5


def test_hub_unreachable_fails_fast(tmp_path: Path) -> None:
    """Without HF_HUB_OFFLINE and without network: one sentence, no retry loop."""
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")
    env.pop("HF_HUB_OFFLINE", None)
    code = "from kame.frontend.checkpoint import resolve_checkpoint; resolve_checkpoint('SakanaAI/kame')"
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert time.monotonic() - t0 < 20
    assert "CheckpointError" in res.stderr and "cannot be reached" in res.stderr


def test_not_a_repo_id(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such directory"):
        resolve_checkpoint(str(tmp_path / "missing-dir"))


def test_kame_download_local_and_offline(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    kame = [sys.executable, "-m", "kame.cli", "download"]
    ok = subprocess.run([*kame, "--checkpoint", str(tiny_kame_ckpt), "--asr", "none"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "local, nothing to download" in ok.stdout
    bad = subprocess.run([*kame, "--checkpoint", "SakanaAI/kame", "--asr", "none"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "HF_HUB_OFFLINE" in bad.stderr and "Traceback" not in bad.stderr


# --- Kyutai's release layout (fused attention weights) ---------------------

ASSETS = Path(__file__).resolve().parent / "assets"
KYUTAI_TEST_LM = ASSETS / "moshi_test_lm_model.safetensors"
#: The LMModel arguments of moshi's test asset (tests/assets/README.md).
KYUTAI_TEST_LM_KWARGS: dict[str, object] = {
    "delays": [0, 1, 2, 4],
    "n_q": 3,
    "dep_q": 3,
    "card": 32,
    "text_card": 48,
    "dim": 16,
    "num_layers": 2,
    "num_heads": 1,
    "hidden_scale": 1,
    "depformer_dim": 16,
    "depformer_multi_linear": True,
    "depformer_weights_per_step": True,
    "depformer_weights_per_step_schedule": [0, 1, 1],
    "depformer_low_rank_embeddings": 8,
    "depformer_num_heads": 1,
    "depformer_gating": "silu",
    "context": 4,
}


def _keys(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


@pytest.mark.parametrize("stt", [False, True])
def test_tiny_checkpoint_is_in_release_layout(tmp_path: Path, stt: bool) -> None:
    d = make_tiny_checkpoint(tmp_path / "ck", seed=3, stt=stt)
    for name in ("model.safetensors", "mimi.safetensors"):
        keys = _keys(d / name)
        assert any(k.endswith("self_attn.in_proj_weight") for k in keys), name
        assert any(k.endswith("self_attn.out_proj.weight") for k in keys), name
        assert not [k for k in keys if ".in_projs." in k or ".out_projs." in k], name


def test_split_layout_loads_the_same_weights(tmp_path: Path) -> None:
    """moshi's state_dict() names still load, to exactly the release-layout model."""
    fused = make_tiny_checkpoint(tmp_path / "fused", seed=4)
    split = make_tiny_checkpoint(tmp_path / "split", seed=4, layout="split")
    assert any(".in_projs.7." in k for k in _keys(split / "model.safetensors"))  # depformer: 8 weights per step
    a = load_frontend(FrontendConfig(checkpoint=str(fused)), torch.device("cpu"))
    b = load_frontend(FrontendConfig(checkpoint=str(split)), torch.device("cpu"))
    for left, right in ((a.lm, b.lm), (a.mimi, b.mimi)):
        sa, sb = left.state_dict(), right.state_dict()
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key], sb[key]), key
    assert torch.equal(a.oracle_weight, b.oracle_weight)


def test_release_layout_equals_moshis_own_load(tmp_path: Path) -> None:
    """Our fused files, read by moshi's load hook, give the model kame loads (LM, Mimi, STT)."""
    from moshi.models import loaders
    from safetensors.torch import load_file

    from kame.frontend.tiny import tiny_lm_kwargs, tiny_mimi_config

    for stt in (False, True):
        d = make_tiny_checkpoint(tmp_path / f"ck{stt}", seed=5, stt=stt)
        files = resolve_checkpoint(str(d))
        ours = load_lm(files, "cpu", torch.float32).lm.state_dict()
        theirs = loaders.get_moshi_lm(None, lm_kwargs=tiny_lm_kwargs(stt=stt), device="cpu", dtype=torch.float32)
        state = load_file(str(d / "model.safetensors"))
        state.pop("oracle_emb.weight", None)
        theirs.load_state_dict(state, strict=True)
        for key, value in theirs.state_dict().items():
            assert torch.equal(value, ours[key]), key
    mimi = loaders.get_mimi(str(d / "mimi.safetensors"), tiny_mimi_config(), device="cpu", num_codebooks=32)
    mine = load_mimi(files, "cpu", 32).state_dict()
    for key, value in mimi.state_dict().items():
        assert torch.equal(value, mine[key]), key


def _kyutai_asset_checkpoint(tiny: Path, dst: Path) -> Path:
    """A checkpoint directory whose LM weights are the file Kyutai wrote."""
    dst.mkdir()
    shutil.copy(KYUTAI_TEST_LM, dst / "lm.safetensors")
    for name in ("mimi.safetensors", "mimi_config.json", "tokenizer.model"):
        shutil.copy(tiny / name, dst / name)
    config = {
        "moshi_name": "lm.safetensors",
        "mimi_name": "mimi.safetensors",
        "mimi_config_name": "mimi_config.json",
        "tokenizer_name": "tokenizer.model",
        **KYUTAI_TEST_LM_KWARGS,
    }
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kyutai_own_file_loads(tiny_kame_ckpt: Path, tmp_path: Path, dtype: torch.dtype) -> None:
    """moshi's test asset, in Kyutai's release layout, loads to what moshi's own hook gives."""
    from moshi.models.lm import LMModel
    from safetensors.torch import load_file

    assert any(k.endswith("self_attn.in_proj_weight") for k in _keys(KYUTAI_TEST_LM))
    files = resolve_checkpoint(str(_kyutai_asset_checkpoint(tiny_kame_ckpt, tmp_path / "kyutai")))
    loaded = load_lm(files, "cpu", dtype)
    assert not loaded.has_oracle and loaded.lm.dtype == dtype
    reference = LMModel(**KYUTAI_TEST_LM_KWARGS)  # type: ignore[arg-type]
    reference.load_state_dict(load_file(str(KYUTAI_TEST_LM)), strict=True)
    ours = loaded.lm.state_dict()
    # two weights per step in the depformer: the fused tensor was split in two
    assert "depformer.layers.0.self_attn.in_projs.1.weight" in ours
    for key, value in reference.state_dict().items():
        assert torch.equal(value.to(dtype), ours[key]), key


def _rewrite(path: Path, edit: object) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    edit(state)  # type: ignore[operator]
    save_file(state, str(path))


def test_release_layout_missing_fused_key_named(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    _rewrite(d / "model.safetensors", lambda s: s.pop("transformer.layers.1.self_attn.in_proj_weight"))
    with pytest.raises(CheckpointError) as err:
        load_frontend(FrontendConfig(checkpoint=str(d)), torch.device("cpu"))
    msg = str(err.value)
    assert msg == f"checkpoint file {d / 'model.safetensors'}: missing keys transformer.layers.1.self_attn.in_proj_weight"


def test_release_layout_wrong_fused_shape_named(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    key = "depformer.layers.0.self_attn.out_proj.weight"

    def cut(state: dict[str, torch.Tensor]) -> None:
        state[key] = state[key][:-32].contiguous()  # one of the 8 per-step weights short

    _rewrite(d / "model.safetensors", cut)
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: key {key} has shape \(224, 32\), the config expects \(256, 32\)"):
        load_frontend(FrontendConfig(checkpoint=str(d)), torch.device("cpu"))


def test_mimi_release_layout_errors_named(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    key = "decoder_transformer.transformer.layers.0.self_attn.in_proj_weight"
    _rewrite(d / "mimi.safetensors", lambda s: s.update({key: torch.zeros(3, 32)}))
    with pytest.raises(CheckpointError, match=rf"mimi\.safetensors: key {key} has shape \(3, 32\)"):
        load_mimi(resolve_checkpoint(str(d)), "cpu", 8)


def test_fused_and_split_twice_is_refused(tiny_moshi_ckpt: Path, tmp_path: Path) -> None:
    d = _copy(tiny_moshi_ckpt, tmp_path / "ck")
    fused = "transformer.layers.0.self_attn.out_proj.weight"
    _rewrite(d / "model.safetensors", lambda s: s.update({"transformer.layers.0.self_attn.out_projs.0.weight": s[fused].clone()}))
    with pytest.raises(CheckpointError, match="given twice, fused and split: transformer.layers.0.self_attn.out_projs.0"):
        load_lm(resolve_checkpoint(str(d)), "cpu", torch.float32)


def test_plan_load_is_pure() -> None:
    """The layout decision works on names and shapes alone (no torch, no file)."""
    from kame.frontend.release_layout import fused_key_map, plan_load

    expected = {"a.in_projs.0.weight": (6, 2), "a.in_projs.1.weight": (6, 2), "b.weight": (2,)}
    fused = fused_key_map([("a.", 2)], expected)
    assert fused["a.in_proj_weight"] == ("a.in_projs.0.weight", "a.in_projs.1.weight")
    plans = plan_load(Path("f"), {"a.in_proj_weight": (12, 2), "b.weight": (2,)}, expected, fused)
    assert [p.targets for p in plans] == [("a.in_projs.0.weight", "a.in_projs.1.weight"), ("b.weight",)]
    with pytest.raises(CheckpointError,
                       match=r"^checkpoint file f: key a.in_proj_weight has shape \(10, 2\), the config expects \(12, 2\)$"):
        plan_load(Path("f"), {"a.in_proj_weight": (10, 2), "b.weight": (2,)}, expected, fused)
    with pytest.raises(CheckpointError, match=r"^checkpoint file f: unknown keys a.bias$"):
        plan_load(Path("f"), {"a.in_proj_weight": (12, 2), "b.weight": (2,), "a.bias": (1,)}, expected, fused)


def test_tiny_front_end_and_stt_share_mimi_bytes_whatever_the_threads(tmp_path: Path) -> None:
    """Same seed, same Mimi file for the front-end and the STT (so the server shares one encode),
    even when they are written under different torch thread counts."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        a = make_tiny_checkpoint(tmp_path / "kame", seed=7)
        torch.set_num_threads(1)
        b = make_tiny_checkpoint(tmp_path / "stt", seed=7, stt=True)
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before
    assert (a / "mimi.safetensors").read_bytes() == (b / "mimi.safetensors").read_bytes()


def test_tiny_mimi_codes_follow_the_audio(tiny_kame_ckpt: Path) -> None:
    """The tiny Mimi's codebooks come from its own latents: codes change with the audio
    and with the encoder's streaming state (as with the real model)."""
    mimi = load_mimi(resolve_checkpoint(str(tiny_kame_ckpt)), "cpu", 8)
    rng = torch.Generator().manual_seed(0)
    frames = [0.1 * torch.randn(1, 1, 1920, generator=rng) for _ in range(6)]
    with torch.no_grad():
        mimi.streaming_forever(1)
        codes = [mimi.encode(f)[0, :, 0].tolist() for f in frames]
        mimi.reset_streaming()
        fresh = mimi.encode(frames[3])[0, :, 0].tolist()
    assert len({tuple(c) for c in codes}) == len(codes)
    assert fresh != codes[3]


def test_mimi_with_older_codebook_names_loads(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    """Older Mimi files name the codebook buffers inited / cluster_size / embed_avg (moshi still loads
    them, renaming): so does kame, to the same model."""
    d = _copy(tiny_kame_ckpt, tmp_path / "ck")
    renames = {"._initialized": ".inited", ".cluster_usage": ".cluster_size", ".embedding_sum": ".embed_avg"}

    def rename(state: dict[str, torch.Tensor]) -> None:
        for key in list(state):
            for new, old in renames.items():
                if key.endswith("_codebook" + new):
                    state[key[: -len(new)] + old] = state.pop(key)

    _rewrite(d / "mimi.safetensors", rename)
    assert any(k.endswith("._codebook.embed_avg") for k in _keys(d / "mimi.safetensors"))
    old = load_mimi(resolve_checkpoint(str(d)), "cpu", 8).state_dict()
    new = load_mimi(resolve_checkpoint(str(tiny_kame_ckpt)), "cpu", 8).state_dict()
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)


def test_make_tiny_checkpoint_command_writes_the_release_layout(tmp_path: Path) -> None:
    kame = [sys.executable, "-m", "kame.cli", "make-tiny-checkpoint"]
    res = subprocess.run([*kame, str(tmp_path / "stt"), "--stt", "--silence-prefix", "1.0"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    keys = _keys(tmp_path / "stt" / "model.safetensors")
    assert any(k.endswith("self_attn.in_proj_weight") for k in keys) and not any(".in_projs." in k for k in keys)
    cfg = json.loads((tmp_path / "stt" / "config.json").read_text())
    assert cfg["stt_config"]["audio_silence_prefix_seconds"] == 1.0
    res = subprocess.run([*kame, str(tmp_path / "split"), "--layout", "split"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert any(".in_projs.0." in k for k in _keys(tmp_path / "split" / "model.safetensors"))


def test_the_empty_lm_is_built_without_initialising_meta_tensors() -> None:
    """Initialising a meta tensor only cost time: its first ``normal_`` imports ``torch._dynamo``.
    Other tensors are initialised as before, and the functions are restored after."""
    original = torch.nn.init.normal_
    with _no_init_on_meta():
        real = torch.nn.init.normal_(torch.zeros(4000), mean=5.0)
        meta = torch.empty(3, device="meta")
        assert torch.nn.init.normal_(meta) is meta
        assert torch.nn.init.uniform_(meta) is meta
    assert abs(float(real.mean()) - 5.0) < 0.2
    assert torch.nn.init.normal_ is original


def test_loading_a_checkpoint_does_not_import_torch_dynamo(tiny_kame_ckpt: Path) -> None:
    """A fresh process (as a server start): loading the model leaves ``torch._dynamo`` unimported,
    about 1.2 s of CPU a start with torch.compile off."""
    code = (
        "import sys, torch\n"
        "from kame.frontend.config import FrontendConfig\nfrom kame.frontend.models import load_frontend\n"
        f"load_frontend(FrontendConfig(checkpoint={str(tiny_kame_ckpt)!r}), torch.device('cpu'))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_TORCH_COMPILE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout
