"""``output.json``: the model's words with their times, in the benchmark's layout.

``{"text": "...", "chunks": [{"text": word, "timestamp": [start_s, end_s]}, ...]}``,
times in seconds on the input's clock (full duplex: output time = input
time). The benchmark's own scoring scripts read exactly this file, and its
v1.5 behaviour script the same layout in ``input.json``, ``clean_input.json``
and ``clean_output.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Word:
    text: str
    start_s: float
    end_s: float


def words_to_json(words: Sequence[Word], text: str | None = None) -> dict[str, Any]:
    return {
        "text": text if text is not None else " ".join(w.text for w in words),
        "chunks": [{"text": w.text, "timestamp": [round(w.start_s, 3), round(w.end_s, 3)]} for w in words],
    }


def write_words(path: Path, words: Sequence[Word], text: str | None = None) -> None:
    path.write_text(json.dumps(words_to_json(words, text), indent=1) + "\n", encoding="utf-8")


def parse_words(data: Any) -> list[Word]:
    """The chunks of an ``output.json``; ``ValueError`` if it is not in the layout. A chunk whose end is
    null (some ASRs leave the last one open) ends where it starts, as the benchmark's scoring reads it."""
    if not isinstance(data, dict) or not isinstance(data.get("chunks"), list):
        raise ValueError("not an object with a \"chunks\" list")
    out: list[Word] = []
    for i, c in enumerate(data["chunks"]):
        ts = c.get("timestamp") if isinstance(c, dict) else None
        if not isinstance(ts, list) or len(ts) != 2 or not isinstance(ts[0], (int, float)):
            raise ValueError(f"chunk {i} has no [start, end] timestamp")
        end = ts[1] if isinstance(ts[1], (int, float)) else ts[0]
        out.append(Word(str(c.get("text", "")).strip(), float(ts[0]), float(end)))
    return out


def read_words(path: Path) -> list[Word]:
    return parse_words(json.loads(path.read_text(encoding="utf-8")))
