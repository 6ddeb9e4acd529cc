"""Tiny checkpoints in the layouts Kyutai releases, under their Hub ids in a Hugging Face cache.

* :func:`write_q8` does what moshi's ``scripts/export_quantized.py`` does to a
  bf16 repo: moshi's own loader builds the LM (bf16), moshi's
  ``replace_linear_with_qlinear`` quantizes it, ``state_dict()`` is saved as
  ``model.q8.safetensors`` (int8 ``weight`` + float32 ``weight_scb``, moshi's
  split attention names), and config.json gets ``quantize: true`` and
  ``hf://`` names for the files left in the bf16 repo. One liberty: the tiny
  Mimi needs ``mimi_config_name``, which the released configs lack; it points
  into the bf16 repo the same way.
* :func:`moshi_release` copies a tiny plain-Moshi checkpoint under the file names of Kyutai's bf16
  repos (what ``kyutai/moshika-rl-seamless`` ships, run by ``moshi.server --hf-repo``);
  :func:`personaplex_release` a tiny PersonaPlex one with its voices packed as ``voices.tgz``.
* :func:`seed_hub_cache` puts a directory's files into ``HF_HOME``'s cache as
  a repo at ``main``, so ``HF_HUB_OFFLINE=1`` resolves the real repo ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def write_q8(base: Path, out: Path, base_repo: str) -> Path:
    """A q8 repo made from the bf16 checkpoint ``base`` (published as ``base_repo``), written into ``out``."""
    import torch
    from moshi.models import loaders
    from moshi.utils.quantize import replace_linear_with_qlinear
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    lm_kwargs = {k: v for k, v in config.items() if k not in (
        "moshi_name", "mimi_name", "mimi_config_name", "tokenizer_name", "model_type", "lm_gen_config")}
    model = loaders.get_moshi_lm(base / config["moshi_name"], lm_kwargs=lm_kwargs, device="cpu", dtype=torch.bfloat16)
    replace_linear_with_qlinear(model)
    out.mkdir(parents=True, exist_ok=True)
    old_name, old_ext = config["moshi_name"].rsplit(".", 1)
    new_name = f"{old_name}.q8.{old_ext}"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / new_name))
    config["moshi_name"] = new_name
    config["quantize"] = True
    for key in ("mimi_name", "tokenizer_name", "mimi_config_name"):
        if key in config and not str(config[key]).startswith("hf://"):
            config[key] = f"hf://{base_repo}/{config[key]}"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def seed_hub_cache(hf_home: Path, repo: str, directory: Path) -> Path:
    """Copy ``directory``'s files into ``hf_home``'s hub cache as ``repo`` at ``main``; the snapshot path."""
    root = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    sha = (repo.encode().hex() * 4)[:40]
    snapshot = root / "snapshots" / sha
    shutil.copytree(directory, snapshot, dirs_exist_ok=True)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(sha)
    return snapshot


def moshi_release(base: Path, out: Path) -> Path:
    """``base`` (a tiny checkpoint without an oracle table) with Kyutai's released file names."""
    from moshi.models import loaders

    out.mkdir(parents=True)
    config = json.loads((base / "config.json").read_text())
    renames = {"moshi_name": loaders.MOSHI_NAME, "mimi_name": loaders.MIMI_NAME,
               "tokenizer_name": loaders.TEXT_TOKENIZER_NAME}
    for key, name in renames.items():
        shutil.copy(base / config[key], out / name)
        config[key] = name
    shutil.copy(base / config["mimi_config_name"], out / config["mimi_config_name"])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def personaplex_release(base: Path, out: Path) -> Path:
    """A tiny PersonaPlex checkpoint as its Hub repo holds it: ``voices.tgz`` instead of a ``voices/`` folder."""
    import tarfile

    shutil.copytree(base, out, ignore=shutil.ignore_patterns("voices"))
    with tarfile.open(out / "voices.tgz", "w:gz") as tar:
        tar.add(base / "voices", arcname="voices")
    return out
