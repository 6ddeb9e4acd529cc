"""Tiny random KAME-format checkpoints, for tests and the CPU demo.

They are written in exactly the on-disk layout of a real checkpoint
(``config.json`` read by moshi's ``CheckpointInfo``, LM and Mimi safetensors,
Mimi config, SentencePiece model) -- by default with attention weights in
Kyutai's fused release layout (``self_attn.in_proj_weight``,
``self_attn.out_proj.weight``), as the published files have them; ``layout=
"split"`` keeps moshi's ``state_dict()`` names -- and load through the same code path, but
step far faster than real time on one CPU core. The same seed always gives
the same files. Creation is atomic: a temporary directory renamed into place,
so concurrent test processes can race for one cache directory.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

#: Bump when the tiny layout changes, so stale cached copies are not reused.
TINY_FORMAT = 4
#: ``release``: fused attention weights as Kyutai ships them; ``split``: moshi's state_dict names.
LAYOUTS = ("release", "split")
TEXT_CARD = 200

LM_OVERRIDES: dict[str, Any] = {
    "dim": 64,
    "num_heads": 4,
    "num_layers": 2,
    "text_card": TEXT_CARD,
    "card": 64,
    "context": 100,
    "depformer_dim": 32,
    "depformer_num_heads": 2,
    "depformer_num_layers": 1,
    "depformer_dim_feedforward": 128,
}
#: Kyutai-STT-shaped LM: 32 input codebooks, no audio output, no delays.
STT_LM_OVERRIDES: dict[str, Any] = {
    **LM_OVERRIDES,
    "n_q": 32,
    "dep_q": 0,
    "delays": [0] * 33,
    "extra_heads_num_heads": 4,
    "extra_heads_dim": 6,
}
LM_GEN_CONFIG = {"temp": 0.8, "temp_text": 0.7, "top_k": 250, "top_k_text": 25}


def tiny_lm_kwargs(stt: bool = False) -> dict[str, Any]:
    from moshi.models import loaders

    kwargs = copy.deepcopy(loaders._lm_kwargs)
    kwargs.update(copy.deepcopy(STT_LM_OVERRIDES if stt else LM_OVERRIDES))
    return kwargs


def tiny_mimi_config() -> dict[str, Any]:
    from moshi.models import loaders

    cfg = copy.deepcopy(loaders._mimi_config)
    cfg["seanet"].update({"dimension": 32, "n_filters": 4})
    cfg["quantizer"].update({"dimension": 16, "n_q": 32, "bins": 64, "input_dimension": 32, "output_dimension": 32})
    cfg["transformer"].update(
        {
            "d_model": 32,
            "num_heads": 2,
            "num_layers": 1,
            "dim_feedforward": 64,
            "input_dimension": 32,
            "output_dimensions": [32],
        }
    )
    return cfg


def corpus_lines() -> list[str]:
    text = resources.files("kame.data").joinpath("tiny_corpus.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


def train_tokenizer(out_path: Path, vocab_size: int = TEXT_CARD, model_type: str = "unigram") -> None:
    """A SentencePiece model on the built-in corpus: unk 0, bos 1, eos 2, pad 3."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        hard_vocab_limit=False,
        num_threads=1,
        character_coverage=1.0,
        minloglevel=2,
    )
    out_path.write_bytes(buf.getvalue())


def _init_mimi_codebooks(mimi: Any, generator: Any) -> None:
    """Give the random Mimi's codebooks centroids drawn from its own latents.

    Random Mimi codebooks are all zero until initialised. Centroids drawn
    from N(0, 1) are far larger than a random encoder's latents (std ~0.07),
    so every frame would map to the same codes whatever the audio. Real Mimi
    training initialises codebooks from data (k-means); here each layer of
    each residual quantizer takes its centroids from the residuals of a few
    seconds of noise and tones, so codes depend on the audio and on the
    encoder's streaming state, as with the real model.
    """
    import torch
    from moshi.quantization.core_vq import EuclideanCodebook

    frame = int(mimi.sample_rate / mimi.frame_rate)
    n = 64
    t = torch.arange(frame * n) / mimi.sample_rate
    tones = torch.stack([0.3 * torch.sin(2 * torch.pi * f * t) for f in (110.0, 220.0, 440.0, 880.0)])
    noise = 0.1 * torch.randn(4, frame * n, generator=generator)
    audio = torch.cat([tones, noise, tones * (noise * 5).clamp(-1, 1)])[:, None, :]
    with torch.no_grad():
        latent = mimi._encode_to_unquantized_latent(audio)  # [B, D, T]
        quantizer = mimi.quantizer
        rvqs = [quantizer.rvq_first, quantizer.rvq_rest] if hasattr(quantizer, "rvq_first") else [quantizer]
        for rvq in rvqs:
            residual = rvq.input_proj(latent)
            for layer in rvq.vq.layers:
                codebook: EuclideanCodebook = layer._codebook
                vectors = layer.project_in(layer._rearrange_input(residual)).reshape(-1, codebook.dim)
                pick = torch.randint(0, vectors.shape[0], (codebook.codebook_size,), generator=generator)
                jitter = 0.05 * vectors.std() * torch.randn(codebook.codebook_size, codebook.dim, generator=generator)
                codebook.embedding_sum.copy_(vectors[pick] + jitter)
                codebook.cluster_usage.fill_(1.0)
                codebook._initialized.fill_(1)
                codebook._embedding = None  # drop moshi's cached embedding
                codebook._cached_initialized = False
                residual = residual - layer.decode(layer.encode(residual))
    for module in mimi.modules():  # any codebook outside the quantizers above
        if isinstance(module, EuclideanCodebook) and not bool(module._initialized.item()):
            module.embedding_sum.normal_(generator=generator)
            module.cluster_usage.fill_(1.0)
            module._initialized.fill_(1)


def _layout_state(module: Any, layout: str) -> dict[str, Any]:
    from kame.frontend.release_layout import fuse_state_dict

    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    return fuse_state_dict(module, state) if layout == "release" else state


def write_tiny_checkpoint(
    directory: Path,
    seed: int = 0,
    *,
    stt: bool = False,
    with_oracle: bool = True,
    layout: str = "release",
    silence_prefix_s: float = 0.0,
) -> Path:
    """Write a tiny checkpoint into ``directory`` (which must not exist yet)."""
    import torch

    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    # One thread: the same seed must give the same bytes whatever the caller's thread count
    # (the Mimi codebook initialisation runs convolutions, whose float sums depend on it).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _write(Path(directory), seed, stt=stt, with_oracle=with_oracle, layout=layout,
                      silence_prefix_s=silence_prefix_s)
    finally:
        torch.set_num_threads(threads)


def _write(directory: Path, seed: int, *, stt: bool, with_oracle: bool, layout: str, silence_prefix_s: float) -> Path:
    import torch
    from moshi.models import loaders
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)

    lm_kwargs = tiny_lm_kwargs(stt=stt)
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device="cpu", dtype=torch.float32)
    state = _layout_state(lm, layout)
    if with_oracle and not stt:
        weight = state["text_emb.weight"]
        state["oracle_emb.weight"] = torch.randn(weight.shape, generator=gen, dtype=weight.dtype)
    save_file(state, str(directory / "model.safetensors"))

    # Mimi depends on the seed only, not on the LM shape: like the real models,
    # the tiny front-end and the tiny STT of one seed share one Mimi.
    torch.manual_seed(seed + 1_000_003)
    mimi_cfg = tiny_mimi_config()
    mimi = loaders.get_mimi(None, mimi_cfg, device="cpu", num_codebooks=32)
    _init_mimi_codebooks(mimi, torch.Generator().manual_seed(seed + 1_000_003))
    save_file(_layout_state(mimi, layout), str(directory / "mimi.safetensors"))
    (directory / "mimi_config.json").write_text(json.dumps(mimi_cfg, indent=1))

    train_tokenizer(directory / "tokenizer.model")
    config: dict[str, Any] = {
        "moshi_name": "model.safetensors",
        "mimi_name": "mimi.safetensors",
        "mimi_config_name": "mimi_config.json",
        "tokenizer_name": "tokenizer.model",
        "model_type": "stt" if stt else "moshi",
        "lm_gen_config": dict(LM_GEN_CONFIG),
        **lm_kwargs,
    }
    if stt:
        config["stt_config"] = {"audio_silence_prefix_seconds": silence_prefix_s, "audio_delay_seconds": 0.5}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def make_tiny_checkpoint(
    directory: Path,
    seed: int = 0,
    *,
    stt: bool = False,
    with_oracle: bool = True,
    layout: str = "release",
    silence_prefix_s: float = 0.0,
) -> Path:
    """Create ``directory`` atomically; if it already exists it is left as is."""
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        write_tiny_checkpoint(
            tmp / "ckpt", seed, stt=stt, with_oracle=with_oracle, layout=layout, silence_prefix_s=silence_prefix_s
        )
        try:
            os.rename(tmp / "ckpt", directory)
        except OSError:
            if not (directory / "config.json").is_file():  # lost the race to a broken dir
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def tiny_checkpoint_dir(
    cache_dir: Path, seed: int = 0, *, stt: bool = False, with_oracle: bool = True, layout: str = "release"
) -> Path:
    kind = "stt" if stt else ("kame" if with_oracle else "moshi")
    suffix = "" if layout == "release" else f"-{layout}"
    return Path(cache_dir) / "tiny" / f"{kind}-v{TINY_FORMAT}{suffix}-seed{seed}"


def ensure_tiny_checkpoint(
    cache_dir: Path, seed: int = 0, *, stt: bool = False, with_oracle: bool = True, layout: str = "release"
) -> Path:
    """The cached tiny checkpoint for ``seed``, created on first use."""
    return make_tiny_checkpoint(
        tiny_checkpoint_dir(cache_dir, seed, stt=stt, with_oracle=with_oracle, layout=layout),
        seed,
        stt=stt,
        with_oracle=with_oracle,
        layout=layout,
    )
