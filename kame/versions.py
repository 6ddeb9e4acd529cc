"""Versions of the runtime pieces, printed by /health and every bench."""

from __future__ import annotations

import importlib.metadata
import platform


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def runtime_versions() -> dict[str, str]:
    """kame, python, torch and moshi versions (plus CUDA when torch has it)."""
    from kame import __version__

    out = {
        "kame": __version__,
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "moshi": _dist_version("moshi"),
    }
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda or "none"
    except ImportError:
        pass
    return out


def versions_line() -> str:
    return " ".join(f"{k}={v}" for k, v in runtime_versions().items())
