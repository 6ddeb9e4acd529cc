"""8-bit weights on CPU (bitsandbytes): Kyutai's q8 repos as released, and ``frontend.weights: int8``.

A tiny q8 repo is made from a tiny bf16 one the way moshi's ``scripts/export_quantized.py`` makes
Kyutai's (tests/support/release_repos.py); both sit in a Hugging Face cache under Kyutai's repo ids, so
the q8 config's ``hf://`` names resolve into the bf16 repo as they do from the Hub (offline here).
``kame run --compare-weights bf16,int8`` (the behaviour check before switching) runs here too.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kame.errors import CheckpointError
from kame.frontend.agreement import agreement
from kame.frontend.checkpoint import resolve_checkpoint
from kame.frontend.config import FrontendConfig
from kame.frontend.loading import load_lm
from kame.frontend.models import load_frontend
from kame.frontend.quantized import count_quantized, effective_weights
from tests.support.inprocess import InProcessServer
from tests.support.release_repos import seed_hub_cache, write_q8

BF16_REPO, Q8_REPO = "kyutai/moshika-pytorch-bf16", "kyutai/moshika-pytorch-q8"


@pytest.fixture(scope="module")
def q8_hub(tiny_moshi_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tiny bf16 and q8 repos in a Hugging Face cache of their own, offline; yields the q8 export."""
    from huggingface_hub import constants

    root = tmp_path_factory.mktemp("q8hub")
    q8 = write_q8(tiny_moshi_ckpt, root / "export", BF16_REPO)
    seed_hub_cache(root / "hf", BF16_REPO, tiny_moshi_ckpt)
    seed_hub_cache(root / "hf", Q8_REPO, q8)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_CACHE", str(root / "hf" / "hub"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield q8


def _file_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_q8_repo_loads_as_released(q8_hub: Path) -> None:
    """The released layout: model.q8.safetensors, quantize: true, hf:// names into the bf16 repo; every
    int8 weight and float32 scale lands in moshi's quantized linears unchanged."""
    files = resolve_checkpoint(Q8_REPO)
    assert files.lm_weights.name == "model.q8.safetensors"
    assert "models--kyutai--moshika-pytorch-bf16" in str(files.mimi_weights)
    assert "models--kyutai--moshika-pytorch-bf16" in str(files.tokenizer)
    loaded = load_lm(files, "cpu", torch.float32)
    assert loaded.weights == "int8" and not loaded.has_oracle
    state = loaded.lm.state_dict()
    quantized = {k: v for k, v in _file_tensors(q8_hub / "model.q8.safetensors").items()
                 if v.dtype == torch.int8 or k.endswith("_scb")}
    assert len(quantized) == 2 * count_quantized(loaded.lm) > 0
    for key, value in quantized.items():
        assert state[key].dtype == value.dtype and torch.equal(state[key], value), key
    assert not any(isinstance(m, torch.nn.Linear) for m in loaded.lm.modules())
    assert loaded.lm.text_emb.weight.dtype == torch.float32  # embeddings stay in frontend.dtype


def test_int8_at_load_is_moshis_quantization(q8_hub: Path, tiny_moshi_ckpt: Path) -> None:
    """``frontend.weights: int8`` on the bf16 checkpoint (loaded as bf16) gives exactly the q8 export's int8
    weights and scales: the same moshi path, applied at load."""
    loaded = load_lm(resolve_checkpoint(str(tiny_moshi_ckpt)), "cpu", torch.bfloat16, weights="int8")
    assert loaded.weights == "int8"
    state = loaded.lm.state_dict()
    exported = _file_tensors(q8_hub / "model.q8.safetensors")
    assert set(state) == set(exported)
    for key, value in exported.items():
        assert torch.equal(state[key], value), key


def test_int8_at_load_keeps_the_oracle_table_and_runs_batched(tiny_kame_ckpt: Path) -> None:
    from kame.frontend.engine import EngineCore

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), dtype="float32", weights="int8")
    models = load_frontend(cfg, torch.device("cpu"))
    assert models.weights == "int8" and models.has_oracle
    assert models.oracle_weight.dtype == torch.float32 and count_quantized(models.lm) > 0
    core = EngineCore(models, cfg, batch_size=2)
    core.attach(0)
    core.attach(1)
    rng = np.random.default_rng(0)
    for _ in range(4):
        out = core.tick({0: (0.1 * rng.standard_normal(1920)).astype(np.float32), 1: np.zeros(1920, np.float32)})
    assert {o.slot for o in out.values()} == {0, 1}
    assert all(o.text_id is not None and o.pcm.shape == (1920,) for o in out.values())


def test_weights_choice_and_lora_refused(tiny_kame_ckpt: Path) -> None:
    from kame.server.config import load_app_config

    assert load_app_config(None, environ={"KAME_FRONTEND__WEIGHTS": "int8"}).frontend.weights == "int8"
    with pytest.raises(Exception, match="weights"):
        load_app_config(None, environ={"KAME_FRONTEND__WEIGHTS": "fp8"})
    assert effective_weights("bf16", True) == "int8" and effective_weights("bf16", False) == "bf16"
    with pytest.raises(CheckpointError, match="frontend.weights 'fp8'"):
        effective_weights("fp8", False)
    files = resolve_checkpoint(str(tiny_kame_ckpt))
    raw = dict(files.lm_kwargs or {}, quantize=True, lora=True)
    from dataclasses import replace

    with pytest.raises(CheckpointError, match="LoRA adapters cannot be added to a q8 checkpoint"):
        load_lm(replace(files, lm_kwargs=raw, lora_weights=files.lm_weights), "cpu", torch.float32)


@pytest.fixture(scope="module")
def q8_server(q8_hub: Path, kame_cache_dir: Path) -> Iterator[InProcessServer]:
    srv = InProcessServer(Q8_REPO, kame_cache_dir).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_q8_repo_serves(q8_server: InProcessServer) -> None:
    """``kame serve`` on the q8 repo id: /health says int8 weights and no oracle table; a Realtime session
    through the ``openai`` SDK gets reply audio."""
    from openai import AsyncOpenAI

    status, body = q8_server.get("/health")
    frontend = json.loads(body)["models"]["frontend"]
    assert status == 200 and frontend["weights"] == "int8" and frontend["has_oracle"] is False
    frame = base64.b64encode((0.05 * np.random.default_rng(0).standard_normal(480) * 32767).astype("<i2").tobytes())

    async def main() -> int:
        client = AsyncOpenAI(base_url=f"{q8_server.http_url}/v1", api_key="sk-unused")
        audio = 0
        async with client.realtime.connect(model="moshi") as conn:
            await asyncio.wait_for(conn.recv(), 10)
            for _ in range(300):
                await conn.input_audio_buffer.append(audio=frame.decode())
                await asyncio.sleep(0.01)
                try:
                    while True:
                        event: Any = await asyncio.wait_for(conn.recv(), 0.001)
                        if event.type in ("response.output_audio.delta", "kame.output_audio.delta"):
                            audio += 1
                except asyncio.TimeoutError:
                    pass
                if audio >= 3:
                    break
        return audio

    assert asyncio.run(main()) >= 3


def test_kame_run_compares_weights(tiny_kame_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real CLI entry point, in this process (a subprocess would only add its imports' seconds)."""
    from kame.audio.files import read_audio, write_wav
    from kame.cli import main

    wav, out, report = tmp_path / "in.wav", tmp_path / "out.wav", tmp_path / "agreement.json"
    write_wav(wav, (0.1 * np.random.default_rng(3).standard_normal(24000)).astype(np.float32))
    code = main(["run", "--checkpoint", str(tiny_kame_ckpt), "--input", str(wav), "--output", str(out),
                 "--compare-weights", "bf16,int8", "--compare-out", str(report), "--seed", "4",
                 "--oracle", "The capital of France is Paris.@0.2"])
    stdout = capsys.readouterr().out
    assert code == 0
    got = json.loads(report.read_text())
    a, b = got["text_ids"]["a"], got["text_ids"]["b"]
    assert got["loaded"] == ["bf16", "int8"] and len(a) == len(b) == got["agreement"]["steps"] == 13
    assert got["agreement"] == agreement(a, b).to_json()  # the CLI's figure is the pure function's
    assert "text tokens agree" in stdout and "speak/silence agrees" in stdout
    assert read_audio(out).size == 24000
