"""A judge's verdicts asked once: bounded retries, each parsed verdict cached on disk by what was asked.

The duplex scorers (the v1 interruption's relevance, v1.5's behaviour) ask an
OpenAI-compatible judge per sample; a rerun of the same run, model and
prompt reads the cache instead of paying again, and a judge that keeps
failing or answering unparsably marks the sample instead of stalling the run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class CachedJudge:
    """Asks through a :class:`kame.eval.judge.Judge`; verdicts cached in ``cache_dir / cache_file``."""

    def __init__(self, judge: Any, cache_dir: Path, cache_file: str, retries: int = 2) -> None:
        self.judge = judge
        self.model = judge.cfg.model
        self.retries = retries
        self.path = cache_dir / cache_file
        self.cache: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            try:
                self.cache = dict(json.loads(self.path.read_text(encoding="utf-8")))
            except ValueError:
                self.cache = {}
        self.asked = 0

    def key(self, *asked: str) -> str:
        """The cache key of a question: the judge's model and everything it was shown."""
        blob = json.dumps([self.model, *asked])
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]

    async def verdict(self, key: str, messages: list[dict[str, str]], field: str,
                      parse: Callable[[str], Any | None], unparsed: str) -> dict[str, Any]:
        """``{field: verdict, "judge_explanation", "judge_error"}``: cached, else asked up to ``retries + 1``
        times until ``parse`` finds a verdict; ``unparsed`` is the error when none does."""
        if key in self.cache and self.cache[key].get(field) is not None:
            return self.cache[key]
        text, error = "", None
        for _ in range(self.retries + 1):
            self.asked += 1
            try:
                text = await self.judge.complete(messages)
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                error = f"judge request failed: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            found = parse(text)
            if found is not None:
                out = {field: found, "judge_explanation": text, "judge_error": None}
                self.cache[key] = out
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.cache, indent=1), encoding="utf-8")
                tmp.replace(self.path)
                return out
            error = unparsed
        return {field: None, "judge_explanation": text or None, "judge_error": error}
