"""The LM's fourth input: ``text_emb(text) + oracle_emb(oracle token)`` per batch slot.

``lm.text_emb`` is replaced by :class:`OracleTextEmbedding`, which keeps the
original table as its first parameter (``LMModel.dtype`` reads it) and adds
the oracle table looked up at a persistent ``tokens`` buffer of shape [B].
The buffer is allocated once and only ever updated in place
(:meth:`OracleTextEmbedding.set_tokens`), so CUDA graphs captured around the
LM step see new values without re-capture. Id -1 gives an exact zero vector,
so a plain Moshi checkpoint fed -1 is numerically vanilla Moshi. The table is
the loaded tensor itself (no copy): the oracle table is held once on the device.
"""

from __future__ import annotations

import torch
from torch import nn

ZERO_ID = -1


class OracleTextEmbedding(nn.Module):
    """Wraps moshi's text embedding; install after the weights are loaded."""

    def __init__(self, text_emb: nn.Module, oracle_weight: torch.Tensor, batch_size: int, idle_id: int) -> None:
        super().__init__()
        self.text = text_emb  # registered first: LMModel.dtype = first parameter's dtype
        # The loaded table itself (same storage: held once); id -1 is masked to an exact zero vector.
        self.oracle_table = nn.Parameter(oracle_weight.detach(), requires_grad=False)
        self.register_buffer(
            "tokens", torch.full((batch_size,), idle_id, dtype=torch.long, device=oracle_weight.device), persistent=False
        )
        self.idle_id = idle_id

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    def set_tokens(self, values: torch.Tensor) -> None:
        """Write this step's oracle ids (shape [B]) into the persistent buffer."""
        self.tokens.copy_(values, non_blocking=True)

    def oracle_embedding(self) -> torch.Tensor:
        rows = nn.functional.embedding(self.tokens.clamp(min=0), self.oracle_table)
        return rows * (self.tokens >= 0).unsqueeze(-1).to(rows.dtype)

    def forward(self, text_tokens: torch.Tensor) -> torch.Tensor:
        text = self.text(text_tokens)  # [B, S, D]
        return text + self.oracle_embedding()[:, None, :]


def install_oracle_input(lm: nn.Module, oracle_weight: torch.Tensor, batch_size: int, idle_id: int) -> OracleTextEmbedding:
    """Replace ``lm.text_emb`` by the oracle wrapper (refuses to wrap twice; :func:`remove_oracle_input` undoes it)."""
    if isinstance(lm.text_emb, OracleTextEmbedding):
        raise RuntimeError("this LM already has an oracle input installed")
    wrapper = OracleTextEmbedding(lm.text_emb, oracle_weight.to(lm.text_emb.weight.dtype), batch_size, idle_id)
    lm.text_emb = wrapper
    return wrapper


def remove_oracle_input(lm: nn.Module) -> None:
    """Put moshi's own text embedding back (an engine of another batch size installs its own wrapper)."""
    if isinstance(lm.text_emb, OracleTextEmbedding):
        lm.text_emb = lm.text_emb.text
