"""Hub details: hf:// names in local copies, the revision of the checkpoint's own repo only, and
gated or private repos answered by a real HTTP server on 127.0.0.1 (HF_ENDPOINT points at it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from kame.errors import CheckpointError
from kame.frontend.checkpoint import parse_hf_name, resolve_checkpoint
from kame.frontend.config import FrontendConfig
from kame.frontend.models import load_frontend


class FakeHub(BaseHTTPRequestHandler):
    """Answers like the Hub for a gated repo (401 + X-Error-Code: GatedRepo), a private one the token
    may not see (403, no error code) and records every request's path and revision."""

    requests: list[str] = []

    def _answer(self) -> None:
        FakeHub.requests.append(self.path)
        if self.path.startswith("/owner/gated/"):
            self.send_response(401)
            self.send_header("X-Error-Code", "GatedRepo")
            self.send_header("X-Error-Message", "Access to model owner/gated is restricted.")
        elif self.path.startswith("/owner/private/"):
            self.send_response(403)
            self.send_header("X-Error-Message", "Forbidden")
        else:
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _answer
    do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def fake_hub() -> Iterator[str]:
    FakeHub.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _resolve_in_subprocess(endpoint: str, spec: str, tmp_path: Path, revision: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_TOKEN", None)
    code = (
        "import sys; from kame.frontend.checkpoint import resolve_checkpoint\n"
        "from kame.errors import CheckpointError\n"
        "try:\n    resolve_checkpoint(sys.argv[1], sys.argv[2] or None)\n"
        "except CheckpointError as exc:\n    print(exc); sys.exit(2)\n"
    )
    return subprocess.run([sys.executable, "-c", code, spec, revision or ""], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize(("repo", "status", "what"), [
    ("owner/gated", 401, "is gated"), ("owner/private", 403, "is private, gated or does not exist"),
])
def test_gated_or_private_repo_is_one_sentence_naming_hf_token(
    fake_hub: str, tmp_path: Path, repo: str, status: int, what: str
) -> None:
    res = _resolve_in_subprocess(fake_hub, repo, tmp_path)
    assert res.returncode == 2, res.stderr
    message = res.stdout.strip()
    assert "\n" not in message and "Traceback" not in res.stderr
    assert message.startswith(f"model {repo} {what} (HTTP {status})")
    assert "HF_TOKEN" in message and f"https://huggingface.co/{repo}" in message and "terms" in message
    assert any(p.startswith(f"/{repo}/") for p in FakeHub.requests)  # it really asked the server


def test_kame_download_of_a_gated_repo_says_the_same(fake_hub: str, tmp_path: Path) -> None:
    env = dict(os.environ, HF_ENDPOINT=fake_hub, HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    res = subprocess.run([sys.executable, "-m", "kame.cli", "download", "--checkpoint", "owner/gated", "--asr", "none"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "HF_TOKEN" in res.stderr and "accept its terms" in res.stderr


def test_hf_names_resolve_in_a_local_copy(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    """config.json naming another repo's files (moshi's hf:// names) loads from a local copy holding them."""
    d = tmp_path / "copy"
    shutil.copytree(tiny_kame_ckpt, d)
    (d / "kyutai" / "mimi-repo").mkdir(parents=True)
    shutil.move(str(d / "mimi.safetensors"), d / "kyutai" / "mimi-repo" / "mimi.safetensors")
    shutil.move(str(d / "tokenizer.model"), d / "tok.model")
    cfg = json.loads((d / "config.json").read_text())
    cfg["mimi_name"] = "hf://kyutai/mimi-repo/mimi.safetensors"  # found as OWNER/REPO/FILE in the copy
    cfg["tokenizer_name"] = "hf://kyutai/other-repo/sub/tok.model"  # found by its base name
    (d / "config.json").write_text(json.dumps(cfg))
    files = resolve_checkpoint(str(d))
    assert files.mimi_weights == d / "kyutai" / "mimi-repo" / "mimi.safetensors"
    assert files.tokenizer == d / "tok.model"
    load_frontend(FrontendConfig(checkpoint=str(d)), torch.device("cpu"))


def test_hf_name_missing_from_a_local_copy_and_offline(tiny_kame_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    d = tmp_path / "copy"
    shutil.copytree(tiny_kame_ckpt, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["mimi_name"] = "hf://kyutai/moshiko-pytorch-bf16/tokenizer-e351c8d8-checkpoint125.safetensors"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"^model kyutai/moshiko-pytorch-bf16 "
                       r"\(tokenizer-e351c8d8-checkpoint125.safetensors\) is not in the local cache"):
        resolve_checkpoint(str(d))
    with pytest.raises(CheckpointError, match="expected hf://OWNER/REPO/FILE"):
        parse_hf_name("hf://kyutai/file.safetensors")


class RevisionHub(BaseHTTPRequestHandler):
    """Records the revision asked for each repo, and answers every file as 404 (entry not found)."""

    seen: list[str] = []

    def _answer(self) -> None:
        RevisionHub.seen.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "EntryNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _answer
    do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


SEED_CACHE = """
import json, sys
from pathlib import Path
from huggingface_hub import constants
from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision

def seed(repo, revision, files):
    root = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    sha = (repo.replace("/", "") * 40)[:40].encode().hex()[:40]
    (root / "snapshots" / sha).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / "snapshots" / sha / name).write_text(text)
    _cache_commit_hash_for_specific_revision(str(root), revision, sha)

config = {"moshi_name": "model.safetensors", "mimi_name": "hf://kyutai/mimi/mimi.safetensors",
          "tokenizer_name": "tokenizer.model"}
own = {"config.json": json.dumps(config), "model.safetensors": "x"}
if sys.argv[1] == "mimi-cached":
    seed("kyutai/mimi", "main", {"mimi.safetensors": "x"})
else:
    own["tokenizer.model"] = "x"
seed("me/ckpt", "v1.0", own)
from kame.frontend.checkpoint import resolve_checkpoint
from kame.errors import CheckpointError
try:
    resolve_checkpoint("me/ckpt", "v1.0")
except CheckpointError as exc:
    print(exc)
"""


@pytest.mark.parametrize("case", ["mimi-fetched", "mimi-cached"])
def test_revision_applies_to_the_checkpoints_own_repo_only(tmp_path: Path, case: str) -> None:
    """A pinned revision is the checkpoint's own repo's: the repo its hf:// name points at is read at
    its default revision, from the cache or the Hub; the checkpoint's own files at the pinned one."""
    RevisionHub.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), RevisionHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    try:
        res = subprocess.run([sys.executable, "-c", SEED_CACHE, case], capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.shutdown()
    assert "Traceback" not in res.stderr, res.stderr
    if case == "mimi-fetched":  # the other repo, not cached: asked at main, not at v1.0
        assert RevisionHub.seen and all(p.startswith("/kyutai/mimi/resolve/main/") for p in RevisionHub.seen)
        assert "kyutai/mimi" in res.stdout
    else:  # the other repo found in the cache at main; the own repo's missing file asked at v1.0
        assert RevisionHub.seen and all(p == "/me/ckpt/resolve/v1.0/tokenizer.model" for p in RevisionHub.seen)
