"""Everything the front-end needs from a checkpoint, loaded once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from kame.errors import CheckpointError
from kame.frontend.checkpoint import CheckpointFiles, resolve_checkpoint, resolve_lora_file
from kame.frontend.config import FrontendConfig
from kame.frontend.loading import (
    lm_num_codebooks,
    load_lm,
    load_mimi,
    load_tokenizer,
    resolve_dtype,
)
from kame.vocab import TextVocab


@dataclass
class FrontendModels:
    """Mimi, the LM (oracle input not yet installed), its oracle table and the tokenizer."""

    files: CheckpointFiles
    device: torch.device
    lm: Any
    mimi: Any
    tokenizer: Any
    oracle_weight: torch.Tensor
    has_oracle: bool

    @cached_property
    def vocab(self) -> TextVocab:
        """Pad and end-of-padding ids and the word-start symbol of this checkpoint's LM and tokenizer."""
        return TextVocab.from_model(self.lm, self.tokenizer)

    @property
    def start_id(self) -> int:
        return int(self.lm.text_initial_token_id)

    def idle_id(self, policy: str = "auto") -> int:
        """pad (3) for KAME weights, -1 (exact vanilla Moshi) for plain Moshi ones."""
        if policy == "pad":
            return int(self.lm.text_padding_token_id)
        if policy == "zero":
            return -1
        return int(self.lm.text_padding_token_id) if self.has_oracle else -1

    @property
    def frame_size(self) -> int:
        return int(self.mimi.sample_rate / self.mimi.frame_rate)

    @property
    def sample_rate(self) -> int:
        return int(self.mimi.sample_rate)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))


def runnable_mismatch(
    *, dep_q: int, n_q: int, card: int, text_card: int, mimi_cardinality: int, mimi_codebooks: int, tokenizer_pieces: int
) -> str | None:
    """Why an LM, Mimi and tokenizer that loaded cannot drive the engine together (None: they can). Each would
    otherwise fail at the first step or in the middle of a session (an index out of range)."""
    if dep_q <= 0:
        return "its LM generates no audio (dep_q 0: a speech-to-text model?); the front-end needs a Moshi-type LM"
    if card != mimi_cardinality:
        return f"the LM's audio tokens have {card} values but Mimi's codebooks {mimi_cardinality} entries"
    if max(dep_q, n_q - dep_q) > mimi_codebooks:
        return f"the LM reads {max(dep_q, n_q - dep_q)} audio codebooks but Mimi has {mimi_codebooks}"
    if tokenizer_pieces > text_card:
        return (f"the tokenizer has {tokenizer_pieces} pieces but the LM's text (and oracle) table {text_card} rows: "
                f"an oracle answer's tokens would be out of range")
    return None


def check_runnable(files: CheckpointFiles, lm: Any, mimi: Any, tokenizer: Any) -> None:
    """:func:`runnable_mismatch` for loaded models: one sentence naming the checkpoint and the mismatch."""
    why = runnable_mismatch(
        dep_q=int(lm.dep_q), n_q=int(lm.n_q), card=int(lm.card), text_card=int(lm.text_card),
        mimi_cardinality=int(mimi.cardinality), mimi_codebooks=int(mimi.total_codebooks),
        tokenizer_pieces=int(tokenizer.vocab_size()),
    )
    if why is not None:
        raise CheckpointError(f"checkpoint {files.source}: the engine cannot run it: {why}")


def load_frontend(
    cfg: FrontendConfig,
    device: torch.device,
    *,
    mimi_codebooks: int | None = None,
    cache_dir: str | Path | None = None,
) -> FrontendModels:
    """Resolve ``cfg.checkpoint`` (``tiny:SEED`` in ``cache_dir``, local dir or Hub id) and load its three parts."""
    files = resolve_checkpoint(cfg.checkpoint, cfg.revision, cache_dir=cache_dir)
    dtype = resolve_dtype(cfg.dtype, device)
    lora = resolve_lora_file(cfg.lora_weights) if cfg.lora_weights else None
    loaded = load_lm(files, device, dtype, lora_weights=lora, fuse_lora=cfg.fuse_lora)
    mimi = load_mimi(files, device, mimi_codebooks or lm_num_codebooks(files))
    tokenizer = load_tokenizer(files)
    check_runnable(files, loaded.lm, mimi, tokenizer)
    return FrontendModels(
        files=files,
        device=device,
        lm=loaded.lm,
        mimi=mimi,
        tokenizer=tokenizer,
        oracle_weight=loaded.oracle_weight,
        has_oracle=loaded.has_oracle,
    )
