"""Kyutai's RL-tuned checkpoints as released, under their Hub ids (a Hugging Face cache, offline):
``kyutai/moshika-rl-seamless`` in Moshi's layout (no oracle table: the oracle is off, and /health says
so) and ``kyutai/personaplex-rl-seamless`` in PersonaPlex's (voices.tgz, personas); ``kame plan`` knows
their architecture without a download, and ``kame download`` of a gated one says how to get access."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from kame.frontend.config import FrontendConfig
from kame.frontend.models import load_frontend
from tests.support.inprocess import InProcessServer
from tests.support.release_repos import moshi_release, personaplex_release, seed_hub_cache

MOSHI_RL, PERSONAPLEX_RL = "kyutai/moshika-rl-seamless", "kyutai/personaplex-rl-seamless"


@pytest.fixture(scope="module")
def rl_hub(tiny_moshi_ckpt: Path, tiny_personaplex_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from huggingface_hub import constants

    root = tmp_path_factory.mktemp("rlhub")
    seed_hub_cache(root / "hf", MOSHI_RL, moshi_release(tiny_moshi_ckpt, root / "moshi"))
    seed_hub_cache(root / "hf", PERSONAPLEX_RL, personaplex_release(tiny_personaplex_ckpt, root / "pp"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_CACHE", str(root / "hf" / "hub"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield root


def test_moshi_rl_runs_with_the_oracle_off(rl_hub: Path) -> None:
    """A plain Moshi front-end: an answer pushed to a slot's oracle changes nothing, the idle token is fed."""
    from kame.frontend.engine import EngineCore

    cfg = FrontendConfig(checkpoint=MOSHI_RL, dtype="float32", sampling={"use_sampling": False})
    models = load_frontend(cfg, torch.device("cpu"))
    assert models.files.lm_weights.name == "model.safetensors" and not models.has_oracle
    assert models.oracle_off_reason is not None and "no oracle table" in models.oracle_off_reason
    core = EngineCore(models, cfg, batch_size=2)
    core.attach(0)
    core.attach(1)
    core.oracle_reset(1, models.encode_text("The capital of France is Paris."))  # slot 1 is answered, slot 0 not
    got: dict[int, list[tuple[int | None, int]]] = {0: [], 1: []}
    for i in range(6):
        frame = (0.1 * np.random.default_rng(i).standard_normal(1920)).astype(np.float32)
        for slot, out in core.tick({0: frame, 1: frame}).items():
            got[slot].append((out.text_id, out.oracle_id))
    assert got[1] == got[0] and {oracle for _, oracle in got[1]} == {-1}


@pytest.fixture(scope="module")
def moshi_rl_server(rl_hub: Path, kame_cache_dir: Path) -> Iterator[InProcessServer]:
    srv = InProcessServer(MOSHI_RL, kame_cache_dir).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_moshi_rl_health_says_the_oracle_is_off(moshi_rl_server: InProcessServer) -> None:
    status, body = moshi_rl_server.get("/health")
    frontend = json.loads(body)["models"]["frontend"]
    assert status == 200 and frontend["checkpoint"] == MOSHI_RL
    assert frontend["has_oracle"] is False and frontend["oracle"] == "off"
    assert "plain Moshi" in frontend["oracle_off"] and frontend["weights"] == "bf16"


def test_personaplex_rl_serves_its_voices(rl_hub: Path, kame_cache_dir: Path) -> None:
    srv = InProcessServer(PERSONAPLEX_RL, kame_cache_dir).start()
    try:
        status, body = srv.get("/health")
    finally:
        srv.stop()
    health = json.loads(body)
    assert status == 200 and health["voices"] == {"names": ["NATF2", "VARM1"], "default": "NATF2", "persona": True}
    assert health["models"]["frontend"]["oracle"] == "off"


def test_plan_knows_them_without_a_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from kame.frontend.plan_models import architecture

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    for repo, key, value in ((MOSHI_RL, None, None), (PERSONAPLEX_RL, "dep_q", 16),
                             ("kyutai/moshika-pytorch-q8", "quantize", True),
                             ("kyutai/moshiko-pytorch-q8", "quantize", True)):
        arch = architecture(repo)
        assert arch.origin == "known architecture", repo
        if key is not None:
            assert arch.lm_kwargs is not None and arch.lm_kwargs[key] == value and arch.lm_kwargs["dim"] == 4096


class GatedHub(BaseHTTPRequestHandler):
    """Answers every request as the Hub does for a gated repo the caller has not been granted."""

    def _answer(self) -> None:
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to this model is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _answer
    do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_kame_download_of_a_gated_rl_repo_says_how_to_accept_its_licence(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    try:
        res = subprocess.run([sys.executable, "-m", "kame.cli", "download", "--checkpoint", MOSHI_RL, "--asr", "none"],
                             capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.shutdown()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    url = f"https://huggingface.co/{MOSHI_RL}"
    assert f"{MOSHI_RL}: licence CC BY-NC 4.0, gated on the Hub: accept it on {url}" in res.stdout
    error = res.stderr.strip().splitlines()[-1]
    assert f"model {MOSHI_RL} is gated (HTTP 401)" in error and "licence CC BY-NC 4.0" in error
    assert url in error and "HF_TOKEN" in error and "huggingface-cli login" in error
