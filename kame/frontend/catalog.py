"""The published checkpoints kame knows by name: layout, licence, and whether the Hub gates them.

What ``kame download`` says before fetching a repo, and what a refused (401/403) download adds to its
sentence; docs/models.md lists the same table with each one's memory a session (``kame plan``).
Architectures a plan needs without a download are :data:`kame.frontend.plan_models.KNOWN_ARCHITECTURES`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownCheckpoint:
    repo: str
    layout: str  #: "kame", "moshi", "moshi-q8" or "personaplex": how kame loads it
    licence: str
    gated: bool = False  #: the Hub asks each account to accept the licence before it serves the files

    @property
    def url(self) -> str:
        return f"https://huggingface.co/{self.repo}"


CC_BY = "CC BY 4.0"
CC_BY_NC = "CC BY-NC 4.0"
NVIDIA_OPEN = "NVIDIA Open Model License"

KNOWN_CHECKPOINTS: dict[str, KnownCheckpoint] = {c.repo: c for c in (
    KnownCheckpoint("SakanaAI/kame", "kame", "as its model card states"),
    KnownCheckpoint("kyutai/moshiko-pytorch-bf16", "moshi", CC_BY),
    KnownCheckpoint("kyutai/moshika-pytorch-bf16", "moshi", CC_BY),
    KnownCheckpoint("kyutai/moshiko-pytorch-q8", "moshi-q8", CC_BY),
    KnownCheckpoint("kyutai/moshika-pytorch-q8", "moshi-q8", CC_BY),
    KnownCheckpoint("kyutai/moshika-rl-seamless", "moshi", CC_BY_NC, gated=True),
    KnownCheckpoint("nvidia/personaplex-7b-v1", "personaplex", NVIDIA_OPEN, gated=True),
    KnownCheckpoint("kyutai/personaplex-rl-seamless", "personaplex", CC_BY_NC, gated=True),
)}


def licence_note(repo: str) -> str | None:
    """One line on a known repo's licence (and how to get access when the Hub gates it); None if unknown."""
    known = KNOWN_CHECKPOINTS.get(repo)
    if known is None:
        return None
    if not known.gated:
        return f"{repo}: licence {known.licence}"
    return (f"{repo}: licence {known.licence}, gated on the Hub: accept it on {known.url} with your account, "
            f"then `huggingface-cli login` or set HF_TOKEN")
