"""An LLM answer as oracle token ids: ``encode(sanitize(text))`` in one call."""

from __future__ import annotations

from collections.abc import Callable


def encode_answer_text(text: str, encode: Callable[[str], list[int]]) -> list[int]:
    """Ids for a complete answer, exactly as the word-stable tokenizer would yield them."""
    try:
        from kame.oracle.sanitize import sanitize
    except ImportError:  # pragma: no cover - sanitizer lands with the oracle module
        return list(encode(" ".join(text.split())))
    return list(encode(sanitize(text)))
