"""The GPU cards ``kame plan --gpu`` knows: the memory a server really finds free on each (no torch).

A card's nominal size is not what a plan may fill: the driver reserves part of
it (``memory.total`` in ``nvidia-smi`` and ``torch.cuda.mem_get_info()[1]``),
and the CUDA context a process creates takes about 1.1 GiB more before any
tensor exists (measured on an H100 80GB HBM3: 79.6 GiB total, about 78.5 GiB
free once the context exists). The plan and the server's refusal both use the
free figure (:func:`kame.frontend.memory_plan.largest_batch`), so they agree on
the largest batch. Sources: the H100's figures from issue 61; the others are the
``memory.total`` values published for those cards, not measured by this project.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3
#: What a process's CUDA context takes before its first tensor (H100: 79.6 GiB total, ~78.5 GiB free).
CONTEXT_BYTES = int(1.1 * GIB)


@dataclass(frozen=True)
class Card:
    """One card: what ``nvidia-smi --query-gpu=memory.total`` reports, and where the figure comes from."""

    key: str
    name: str
    total_mib: int
    source: str

    @property
    def total_bytes(self) -> int:
        return self.total_mib * MIB

    @property
    def usable_bytes(self) -> int:
        """Free for kame once its CUDA context exists, on an otherwise idle headless card."""
        return self.total_bytes - CONTEXT_BYTES


CARDS: dict[str, Card] = {
    c.key: c
    for c in (
        Card("h100", "NVIDIA H100 80GB HBM3", 81559,
             "nvidia-smi memory.total of an H100 SXM5 80GB (79.6 GiB; ~78.5 GiB free after the CUDA context)"),
        Card("h200", "NVIDIA H200 141GB HBM3e", 143771, "nvidia-smi memory.total of an H200 SXM 141GB (140.4 GiB)"),
        Card("l40s", "NVIDIA L40S 48GB", 46068, "nvidia-smi memory.total of an L40S with ECC on (45.0 GiB)"),
        Card("l4", "NVIDIA L4 24GB", 23034, "nvidia-smi memory.total of an L4 with ECC on (22.5 GiB)"),
        Card("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 24564,
             "nvidia-smi memory.total of an RTX 4090 (24.0 GiB; a desktop on the same card takes more)"),
    )
}


def card(key: str) -> Card:
    """The card named ``key`` (case-insensitive); a ValueError names the known ones."""
    found = CARDS.get(key.lower().replace("-", "").replace(" ", ""))
    if found is None:
        raise ValueError(f"unknown GPU {key!r}: kame plan knows {', '.join(CARDS)}")
    return found
