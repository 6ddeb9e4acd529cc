"""Interruption relevance, 0-5, by any OpenAI-compatible judge (kame's own prompt), cached on disk.

The benchmark asks a judge how related the model's reply (its words after
the interruption ended) is to the user's interrupting turn, 0 (unrelated)
to 5 (perfectly related). The prompt below is kame's own wording of that
scale. The judge is :class:`kame.eval.judge.Judge` (temperature 0, retries);
a sample without a take-over is not rated, as in the benchmark. Ratings are
cached in ``relevance_cache.json`` beside ``results.json`` keyed by the
judge model and the texts, so a re-run asks nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = """You rate one moment of a spoken conversation between a user and a voice assistant.
The user said something (the context), the assistant began to answer, and the user cut in with a new
utterance (the interruption). You see the words the assistant spoke after the interruption ended.

Rate how well those words respond to the interruption itself, from 0 to 5:
0 - nothing to do with the interruption (or no real words);
1 - barely connected to it;
2 - touches it, but mostly continues the earlier answer or drifts;
3 - responds to it, with gaps or errors;
4 - responds to it well;
5 - responds to it directly and completely.
Judge relevance to the interruption, not style; the text is an automatic transcript of speech.

First write one or two sentences of analysis, then end with a line exactly of the form:
Rating: [[N]]"""

USER_TEMPLATE = """Context (what the user said first): {context}
Interruption (what the user said while the assistant spoke): {interrupt}
Assistant's words after the interruption: {reply}"""

_RATING = re.compile(r"\[\[\s*([0-5])\s*\]\]")
CACHE_FILE = "relevance_cache.json"


def parse_relevance(text: str) -> int | None:
    """The last ``[[N]]`` with N in 0..5, else None."""
    found = _RATING.findall(text or "")
    return int(found[-1]) if found else None


def messages(context: str, interrupt: str, reply: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_TEMPLATE.format(context=context, interrupt=interrupt, reply=reply)}]


class RelevanceJudge:
    """Rates through a :class:`kame.eval.judge.Judge`'s client; ratings cached in ``cache_dir``."""

    def __init__(self, judge: Any, cache_dir: Path, retries: int = 2) -> None:
        self.judge = judge
        self.model = judge.cfg.model
        self.retries = retries
        self.path = cache_dir / CACHE_FILE
        self.cache: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            try:
                self.cache = dict(json.loads(self.path.read_text(encoding="utf-8")))
            except ValueError:
                self.cache = {}
        self.asked = 0

    def key(self, context: str, interrupt: str, reply: str) -> str:
        blob = json.dumps([self.model, SYSTEM_PROMPT, context, interrupt, reply])
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]

    async def rate(self, context: str, interrupt: str, reply: str) -> dict[str, Any]:
        k = self.key(context, interrupt, reply)
        if k in self.cache and self.cache[k].get("relevance") is not None:
            return self.cache[k]
        msgs = messages(context, interrupt, reply)
        text, error = "", None
        for _ in range(self.retries + 1):
            self.asked += 1
            try:
                text = await self.judge.complete(msgs)
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                error = f"judge request failed: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            rating = parse_relevance(text)
            if rating is not None:
                out = {"relevance": rating, "judge_explanation": text, "judge_error": None}
                self.cache[k] = out
                self._save()
                return out
            error = "no [[rating]] within 0-5 in the judgement"
        return {"relevance": None, "judge_explanation": text or None, "judge_error": error}

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.cache, indent=1), encoding="utf-8")
        tmp.replace(self.path)
