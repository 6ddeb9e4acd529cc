"""The memory plan: its arithmetic (pure), the models measured on the meta device, ``kame plan`` and the
server's refusal of a batch that cannot fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kame.frontend.memory_plan import GIB, AttentionCache, Headroom, MemoryPlan, ModelFootprint, refusal

MIB = 1024**2


def _plan(weights: int = 10 * GIB, kv: int = GIB, load_extra: int = 0, headroom: Headroom | None = None) -> MemoryPlan:
    return MemoryPlan((ModelFootprint("frontend", 5, weights, kv, load_extra),), dtype="bfloat16",
                      headroom=headroom or Headroom(fixed_bytes=2 * GIB, fraction=0.0))


def test_attention_cache_bytes_are_keys_and_values_of_the_context() -> None:
    # moshi 7B: 32 layers of 32 heads x 128 dims, context 3000, bf16 -> 1.465 GiB a slot
    layer = AttentionCache(num_heads=32, head_dim=128, capacity=3000, bytes_per_value=2)
    assert layer.bytes_per_slot == 2 * 32 * 3000 * 128 * 2
    assert 32 * layer.bytes_per_slot / GIB == pytest.approx(1.465, abs=0.001)


def test_max_batch_is_what_fits_after_weights_and_headroom() -> None:
    plan = _plan()
    # 20 GiB card: 2 GiB headroom, 10 GiB weights, 1 GiB a slot -> 8 slots
    assert plan.max_batch(20 * GIB) == 8
    assert plan.max_batch(20 * GIB - 1) == 7
    assert plan.max_batch(12 * GIB) == 0  # the weights fit, not one slot
    assert plan.max_batch(11 * GIB) == 0
    assert plan.bytes_for(8) == 18 * GIB


def test_headroom_is_fixed_plus_a_fraction_of_what_the_plan_counts() -> None:
    plan = _plan(headroom=Headroom(fixed_bytes=GIB, fraction=0.1))
    assert plan.needed_bytes(16) == 10 * GIB + 16 * GIB + GIB + int(0.1 * 26 * GIB)  # 29.6 GiB
    assert plan.max_batch(30 * GIB) == 16
    assert plan.max_batch(int(29.6 * GIB)) == 16 and plan.max_batch(int(29.6 * GIB) - 1) == 15
    assert plan.max_batch(40 * GIB) == 25
    for available in range(12 * GIB, 60 * GIB, 97 * 1024**2):  # the solved batch is the exact largest
        n = plan.max_batch(available)
        assert n == 0 or plan.needed_bytes(n) <= available
        assert plan.needed_bytes(n + 1) > available


def test_a_lora_held_while_loading_counts_before_any_slot() -> None:
    plan = _plan(weights=10 * GIB, kv=GIB, load_extra=5 * GIB)
    assert plan.load_bytes == 15 * GIB
    assert plan.bytes_for(1) == 15 * GIB  # the load peak, not weights + one slot
    assert plan.max_batch(16 * GIB) == 0  # 14 GiB usable < 15 GiB peak
    assert plan.max_batch(17 * GIB) == 5


def test_refusal_names_the_largest_batch_that_fits() -> None:
    plan = _plan()
    assert refusal(plan, 8, 20 * GIB, 20 * GIB) is None
    line = refusal(plan, 9, 20 * GIB, 20 * GIB, "cuda:0")
    assert line is not None and "\n" not in line
    assert "frontend.batch_size 9 needs 21.0 GiB" in line
    assert "20.0 GiB free of 20.0 GiB on cuda:0" in line
    assert line.endswith("the largest batch that fits is 8 (kame serve --max-sessions 8)")
    none = refusal(plan, 1, 11 * GIB, 11 * GIB)
    assert none is not None and "not even one session fits" in none


# ---------------------------------------------------------------- models measured on the meta device


def test_default_config_plan_is_moshi_7b_with_kame_oracle_and_kyutai_stt(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SakanaAI/kame and kyutai/stt-1b-en_fr-candle with no config.json on disk: their known architectures."""
    from kame.config import KameConfig
    from kame.frontend.plan_models import build_plan

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hugging Face cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = KameConfig.model_validate({"cache_dir": str(tmp_path), "asr": {"kind": "kyutai"}})
    report = build_plan(cfg)
    plan = report.plan
    front = plan.model("frontend")
    assert report.frontend.origin == "known architecture"
    # moshi 7B (7.688 B) + the oracle table installed by the engine (32001 rows x 4096, held once: the
    # engine's table is the loaded tensor FrontendModels keeps)
    assert front.params == 7_687_729_152 + 32001 * 4096
    # bf16 weights + one slot's oracle id (int64)
    assert front.weight_bytes == 2 * front.params + 8
    assert front.kv_bytes_per_slot == 32 * 2 * 32 * 3000 * 128 * 2 + 6 * 2 * 16 * 8 * 64 * 2
    mimi = plan.model("mimi")
    assert mimi.weight_bytes / GIB == pytest.approx(0.358, abs=0.002)  # float32, with its codebooks
    stt = plan.model("stt")
    assert stt.params / 1e9 == pytest.approx(0.99, abs=0.01)
    assert stt.kv_bytes_per_slot == 16 * 2 * 16 * 750 * 128 * 2
    # 17.0 GiB of weights, 1.572 GiB a slot, 2 GiB + 10 % kept free: 34 slots on 80 GiB
    assert plan.max_batch(80 * GIB) == 34
    assert plan.needed_bytes(34) <= 80 * GIB < plan.needed_bytes(35)


def test_plan_of_a_tiny_checkpoint_matches_the_loaded_model(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    """The meta count equals the bytes of the model the engine really holds (float32 on CPU)."""
    from kame.config import KameConfig
    from kame.frontend.config import FrontendConfig
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.plan_models import attention_caches, build_plan

    cfg = KameConfig.model_validate({"frontend": {"checkpoint": str(tiny_kame_ckpt), "dtype": "float32"},
                                     "asr": {"kind": "none"}, "cache_dir": str(tmp_path)})
    plan = build_plan(cfg).plan
    fcfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), dtype="float32", batch_size=2)
    models = load_frontend(fcfg, torch.device("cpu"))
    core = EngineCore(models, fcfg, batch_size=2)
    lm = core.models.lm
    held = sum(t.numel() * t.element_size() for t in [*lm.parameters(), *lm.buffers()])
    # the oracle table is held once: the engine's parameter is the loaded tensor
    assert lm.text_emb.oracle_table.data_ptr() == models.oracle_weight.data_ptr()
    tokens = lm.text_emb.tokens  # the engine's per-slot oracle buffer: not a weight
    # the plan counts the oracle id buffer of one slot (8 bytes), the engine holds one per slot
    assert plan.model("frontend").weight_bytes == held - tokens.numel() * tokens.element_size() + 8
    assert plan.model("frontend").params == sum(p.numel() for p in lm.parameters())
    caches = [m._streaming_state.kv_cache.cache for m in lm.modules()
              if getattr(m, "_streaming_state", None) is not None and getattr(m._streaming_state, "kv_cache", None)]
    # the main transformer's caches live as long as the engine; the depformer's exist during each step
    # (moshi enters its streaming state per frame), the plan counts both
    main = sum(c.bytes_per_slot for c in attention_caches(lm.transformer))
    assert sum(c.numel() * c.element_size() for c in caches) == 2 * main
    depformer = sum(c.bytes_per_slot for c in attention_caches(lm.depformer))
    assert depformer > 0 and plan.model("frontend").kv_bytes_per_slot == main + depformer


def test_an_unknown_hub_repo_not_on_disk_is_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kame.errors import CheckpointError
    from kame.frontend.plan_models import architecture

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sentence = r"someone/model: its config.json is not on disk .*`kame download --checkpoint someone/model`"
    with pytest.raises(CheckpointError, match=sentence):
        architecture("someone/model")


# ---------------------------------------------------------------- the commands


def test_kame_plan_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kame.cli import main

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("KAME_CACHE_DIR", str(tmp_path))
    assert main(["plan", "--config", "default", "--gpu-memory-gib", "80", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu_memory_gib"] == 80
    assert out["lm_params"] == 7_687_729_152 + 32001 * 4096
    assert out["kv_bytes_per_slot"] == sum(m["kv_bytes_per_slot"] for m in out["models"])
    assert [m["name"] for m in out["models"]] == ["frontend", "mimi", "stt"]
    assert out["max_batch"] == 34 and out["batch_size"] == 8 and out["batch_size_fits"] is True
    assert main(["plan", "--config", "default", "--gpu-memory-gib", "24"]) == 0
    text = capsys.readouterr().out
    assert "largest batch that fits: 2 " in text and "frontend.batch_size 8: does NOT fit" in text
    assert main(["plan", "--config", "default", "--gpu-memory-gib", "0"]) == 2
    assert "--gpu-memory-gib 0.0: expected a positive number" in capsys.readouterr().err


def test_serve_refuses_a_batch_the_free_memory_cannot_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check `kame serve` runs on CUDA before loading, fed the figures torch.cuda.mem_get_info would give."""
    from kame.commands.serve import memory_refusal
    from kame.server.config import load_app_config

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_app_config("default", environ={"KAME_CACHE_DIR": str(tmp_path)}, overrides={"frontend.batch_size": 16})
    assert memory_refusal(cfg, 80 * GIB, 80 * GIB, "cuda:0") is None
    line = memory_refusal(cfg, 40 * GIB, 80 * GIB, "cuda:0")  # another process holds half the card
    assert line is not None and "\n" not in line
    assert line.startswith("frontend.batch_size 16 needs ")
    assert "40.0 GiB free of 80.0 GiB on cuda:0" in line
    assert line.endswith("the largest batch that fits is 11 (kame serve --max-sessions 11)")


def test_serve_check_reads_the_cards_free_memory_and_refuses_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check_memory`` as `kame serve` calls it on CUDA, with torch.cuda.mem_get_info answering for a card."""
    from kame.commands.serve import check_memory
    from kame.errors import UserError
    from kame.server.config import load_app_config

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked: list[object] = []

    def mem_get_info(device: object = None) -> tuple[int, int]:
        asked.append(device)
        return 24 * GIB, 24 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    cfg = load_app_config("default", environ={"KAME_CACHE_DIR": str(tmp_path)})  # batch_size 8
    with pytest.raises(UserError) as err:
        check_memory(cfg, torch.device("cuda:1"))
    assert asked == [torch.device("cuda:1")]
    assert str(err.value).endswith("on cuda:1: the largest batch that fits is 2 (kame serve --max-sessions 2)")
    check_memory(load_app_config("default", environ={"KAME_CACHE_DIR": str(tmp_path)},
                                 overrides={"frontend.batch_size": 1}), torch.device("cuda:1"))
    # an architecture kame cannot know before downloading: no plan, the server goes on to load (and download)
    unknown = load_app_config("default", environ={"KAME_CACHE_DIR": str(tmp_path)},
                              overrides={"frontend.checkpoint": "someone/model"})
    check_memory(unknown, torch.device("cuda:1"))


# ---------------------------------------------------------------- cards and weights


def test_plan_per_card_and_weights_agrees_with_the_servers_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kame plan --gpu all --weights both`: each card's usable memory, sessions for bf16 and int8; the server's
    refusal, given that card's free memory, names the same largest batch (one function, both ways)."""
    from kame.cli import main
    from kame.commands.serve import memory_refusal
    from kame.frontend.cards import CARDS
    from kame.frontend.memory_plan import largest_batch, refusal
    from kame.frontend.plan_models import build_plan
    from kame.server.config import load_app_config

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("KAME_CACHE_DIR", str(tmp_path))
    assert main(["plan", "--config", "default", "--gpu", "all", "--weights", "both", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {row["gpu"]: row for row in out["cards"]}
    assert list(rows) == list(CARDS) == ["h100", "h200", "l40s", "l4", "rtx4090"]
    h100 = rows["h100"]
    assert h100["total_gib"] == pytest.approx(79.6, abs=0.1) and h100["usable_gib"] == pytest.approx(78.5, abs=0.1)
    assert h100["max_batch"] == {"bf16": 33, "int8": 37}  # not 34: the card has 78.5 GiB free, not 80
    assert rows["l4"]["max_batch"]["bf16"] == 0 < rows["l4"]["max_batch"]["int8"]
    for row in out["cards"]:
        assert row["max_batch"]["int8"] >= row["max_batch"]["bf16"]
    weights = out["weight_bytes_by_weights"]
    # moshi's int8 replaces the linear layers only: ~7.0 GiB saved on the 7B, embeddings and tables kept
    assert 6.5 * GIB < weights["bf16"] - weights["int8"] < 7.5 * GIB
    cfg = load_app_config("default", environ={"KAME_CACHE_DIR": str(tmp_path)})
    for weights_kind in ("bf16", "int8"):
        plan = build_plan(cfg, weights=weights_kind).plan
        for key, card in CARDS.items():
            fits = rows[key]["max_batch"][weights_kind]
            assert largest_batch(plan, card.usable_bytes) == fits
            if fits:
                assert refusal(plan, fits, card.usable_bytes, card.total_bytes) is None
            line = refusal(plan, fits + 1, card.usable_bytes, card.total_bytes)
            assert line is not None and (f"the largest batch that fits is {fits} " in line if fits
                                         else "not even one session fits" in line)
    # the server's own check (bf16 as configured) on an H100's free memory
    h = CARDS["h100"]
    at = load_app_config("default", environ={"KAME_CACHE_DIR": str(tmp_path)}, overrides={"frontend.batch_size": 33})
    assert memory_refusal(at, h.usable_bytes, h.total_bytes) is None
    over = load_app_config("default", environ={"KAME_CACHE_DIR": str(tmp_path)}, overrides={"frontend.batch_size": 34})
    line = memory_refusal(over, h.usable_bytes, h.total_bytes)
    assert line is not None and line.endswith("the largest batch that fits is 33 (kame serve --max-sessions 33)")


def test_a_q8_checkpoint_is_planned_and_refused_with_int8_weights(tmp_path: Path) -> None:
    """A checkpoint whose config.json says ``quantize: true`` (Kyutai's q8 layout): the server's check uses int8."""
    from moshi.models import loaders

    from kame.commands.serve import memory_refusal
    from kame.frontend.cards import CARDS
    from kame.frontend.plan_models import build_plan
    from kame.server.config import load_app_config

    ckpt = tmp_path / "q8"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**loaders._lm_kwargs, "quantize": True,
                                                  "moshi_name": "model.q8.safetensors"}))
    env = {"KAME_CACHE_DIR": str(tmp_path)}
    cfg = load_app_config("default", environ=env, overrides={"frontend.checkpoint": str(ckpt), "asr.kind": "none"})
    plan = build_plan(cfg).plan
    assert plan.weights == "int8"
    bf16 = build_plan(cfg, weights="bf16").plan
    assert bf16.weight_bytes - plan.weight_bytes > 6 * GIB
    l4 = CARDS["l4"]
    fits = plan.max_batch(l4.usable_bytes)
    assert fits >= 1 and bf16.max_batch(l4.usable_bytes) < fits
    ok = load_app_config("default", environ=env, overrides={"frontend.checkpoint": str(ckpt), "asr.kind": "none",
                                                           "frontend.batch_size": fits})
    assert memory_refusal(ok, l4.usable_bytes, l4.total_bytes) is None
    too_many = load_app_config("default", environ=env, overrides={"frontend.checkpoint": str(ckpt), "asr.kind": "none",
                                                                 "frontend.batch_size": fits + 1})
    line = memory_refusal(too_many, l4.usable_bytes, l4.total_bytes)
    assert line is not None and "GiB int8 weights" in line and line.endswith(f"fits is {fits} (kame serve --max-sessions {fits})")
