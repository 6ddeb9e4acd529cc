"""A complete answer as oracle token ids: ``encode(sanitize(text))`` in one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kame.oracle.sanitize import SanitizeOptions, sanitize


def encode_answer_text(
    text: str, encode: Callable[[str], Sequence[int]], options: SanitizeOptions | None = None
) -> list[int]:
    """Ids for a complete answer, exactly as the word-stable tokenizer yields them after flush()."""
    return list(encode(sanitize(text, options)))
