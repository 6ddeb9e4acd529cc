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

import re
from pathlib import Path
from typing import Any

from kame.eval.duplex.cached_judge import CachedJudge

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


class RelevanceJudge(CachedJudge):
    """Rates through a :class:`kame.eval.judge.Judge`'s client; ratings cached in ``cache_dir``."""

    def __init__(self, judge: Any, cache_dir: Path, retries: int = 2) -> None:
        super().__init__(judge, cache_dir, CACHE_FILE, retries)

    async def rate(self, context: str, interrupt: str, reply: str) -> dict[str, Any]:
        return await self.verdict(self.key(SYSTEM_PROMPT, context, interrupt, reply), messages(context, interrupt, reply),
                                  "relevance", parse_relevance, "no [[rating]] within 0-5 in the judgement")
