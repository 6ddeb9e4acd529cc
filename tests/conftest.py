"""Shared test set-up: no torch.compile, a per-run cache dir, an artifacts dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def kame_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory shared by the whole run (tiny checkpoints live here)."""
    path = Path(os.environ.get("PYTEST_KAME_CACHE_DIR") or tmp_path_factory.mktemp("kame-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests leave files for people to look at (screenshots, wavs)."""
    path = Path(os.environ.get("PYTEST_KAME_ARTIFACTS") or (Path(__file__).resolve().parent.parent / "artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_kame_ckpt(kame_cache_dir: Path) -> Path:
    """A tiny KAME-format checkpoint (with oracle_emb), made once per run."""
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0)


@pytest.fixture(scope="session")
def tiny_moshi_ckpt(kame_cache_dir: Path) -> Path:
    """A tiny plain-Moshi checkpoint (no oracle_emb)."""
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0, with_oracle=False)
