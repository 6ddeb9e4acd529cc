"""A tiny random checkpoint in PersonaPlex's layout, with voices made by its embedding-saving path.

Released names (``model.safetensors``, ``tokenizer-e351c8d8-checkpoint125.safetensors``,
``tokenizer_spm_32k_3.model``; Kyutai's fused attention layout; a tiny
Mimi needs ``mimi_config.json``, which the released files lack), a
``dep_q`` 16 LM, ``config.json`` saying ``model_type: personaplex`` and
giving silence/sine tokens that fit the tiny audio card (the released ones
are the real Mimi's codes), and ``voices/NAME.pt`` written by
:meth:`tests.support.personaplex_ref.PersonaPlexReference.save_voice` from
short synthetic wavs. Nothing comes from the internet.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

VOICES = ("NATF2", "VARM1")


def voice_pcm(index: int, seconds: float = 0.4, sample_rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    rng = np.random.default_rng(100 + index)
    tone = 0.3 * np.sin(2 * np.pi * (150.0 + 90.0 * index) * t)
    return (tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def write_tiny_personaplex(directory: Path, seed: int = 0, voices: tuple[str, ...] = VOICES) -> Path:
    import torch
    from moshi.models import loaders
    from safetensors.torch import save_file

    from kame.frontend.release_layout import fuse_state_dict
    from kame.frontend.tiny import tiny_lm_kwargs, write_tiny_checkpoint
    from tests.support.personaplex_ref import PersonaPlexReference

    directory = Path(directory)
    write_tiny_checkpoint(directory, seed, with_oracle=False)  # Mimi, tokenizer, config to start from
    torch.manual_seed(seed + 7)
    kwargs = tiny_lm_kwargs()
    kwargs["dep_q"] = 16
    lm = loaders.get_moshi_lm(None, lm_kwargs=kwargs, device="cpu", dtype=torch.float32)
    state = {k: v.contiguous() for k, v in lm.state_dict().items()}
    save_file(fuse_state_dict(lm, state), str(directory / "model.safetensors"))
    # PersonaPlex's (and moshi's) default file names, which its loader uses without a config
    (directory / "mimi.safetensors").rename(directory / loaders.MIMI_NAME)
    (directory / "tokenizer.model").rename(directory / loaders.TEXT_TOKENIZER_NAME)
    config = json.loads((directory / "config.json").read_text())
    for key in ("moshi_name", "mimi_name", "tokenizer_name"):
        config.pop(key)
    config.update(kwargs)
    config["model_type"] = "personaplex"
    rng = np.random.default_rng(seed)
    card = int(kwargs["card"])
    config["personaplex"] = {
        "silence_tokens": [int(x) for x in rng.integers(0, card, 8)],
        "sine_tokens": [int(x) for x in rng.integers(0, card, 8)],
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    (directory / "voices").mkdir()
    ref = PersonaPlexReference(directory, use_sampling=False)
    for i, name in enumerate(voices):
        ref.save_voice(voice_pcm(i), directory / "voices" / f"{name}.pt")
    return directory


def ensure_tiny_personaplex(cache_dir: Path, seed: int = 0) -> Path:
    """The run's tiny PersonaPlex checkpoint in ``cache_dir``, made once (atomically: test workers may race)."""
    directory = Path(cache_dir) / "tiny" / f"personaplex-seed{seed}"
    if (directory / "voices").is_dir():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".personaplex.tmp-", dir=directory.parent))
    try:
        write_tiny_personaplex(tmp / "ckpt", seed)
        try:
            os.rename(tmp / "ckpt", directory)
        except OSError:
            if not (directory / "voices").is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
