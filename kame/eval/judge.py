"""MT-Bench's single-answer grading through any OpenAI-compatible chat model.

What MT-Bench does, reimplemented (the prompts are its data, bundled):

- reference-guided prompts (``single-math-v1``) only for the categories
  MT-Bench grades against a reference: math, reasoning, coding. STEM and
  humanities get ``single-v1`` even where a reference exists;
- turn 2 is graded with the ``-multi-turn`` variant, which shows the whole
  conversation and asks about the second answer;
- temperature 0, the rating read from ``[[N]]`` (``[N]`` as a fallback).

Different from MT-Bench, on purpose: a judgement without a rating in
1..10 is asked again up to ``retries`` times and then recorded as
unscored (``score`` None, ``judge_error`` set) instead of silently
becoming -1; transport errors are retried the same way.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kame.eval.questions import JudgePrompt, Question

#: MT-Bench grades these categories against the reference answer.
REFERENCE_CATEGORIES = frozenset({"math", "reasoning", "coding"})
MAX_TOKENS = 2048

_DOUBLE = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]")
_SINGLE = re.compile(r"\[\s*(\d+(?:\.\d+)?)\s*\]")


def prompt_name(category: str, turn: int, has_reference: bool) -> str:
    """The judge prompt for a turn (1 or 2) of a question of ``category``.

    A reference-guided category without a reference falls back to the
    general prompt (the bundled set has a reference for every one).
    """
    guided = category in REFERENCE_CATEGORIES and has_reference
    base = "single-math-v1" if guided else "single-v1"
    return f"{base}-multi-turn" if turn >= 2 else base


def parse_rating(text: str) -> float | None:
    """The rating of a judgement: the first ``[[N]]``, else the first ``[N]``; None if absent or outside 1..10."""
    m = _DOUBLE.search(text) or _SINGLE.search(text)
    if m is None:
        return None
    value = float(m.group(1))
    return value if 1.0 <= value <= 10.0 else None


def build_messages(
    prompt: JudgePrompt, question: Question, turn: int, answers: Sequence[str]
) -> list[dict[str, str]]:
    """The chat messages MT-Bench sends for ``turn`` (1-based), given the assistant's answers so far."""
    ref = question.reference or ()
    fields: dict[str, str] = {}
    if turn >= 2:
        for i in (1, 2):
            fields[f"question_{i}"] = question.turns[i - 1]
            fields[f"answer_{i}"] = answers[i - 1]
            fields[f"ref_answer_{i}"] = ref[i - 1] if len(ref) >= i else ""
    else:
        fields = {"question": question.turns[0], "answer": answers[0], "ref_answer_1": ref[0] if ref else ""}
    return [
        {"role": "system", "content": prompt.system_prompt},
        {"role": "user", "content": prompt.prompt_template.format(**fields)},
    ]


@dataclass(frozen=True)
class Judgement:
    """The outcome of grading one turn."""

    prompt: str
    score: float | None
    explanation: str | None
    error: str | None
    attempts: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "judge_prompt": self.prompt,
            "score": self.score,
            "judge_explanation": self.explanation,
            "judge_error": self.error,
            "judge_attempts": self.attempts,
        }


@dataclass(frozen=True)
class JudgeConfig:
    """Where the judge is and how hard to try."""

    model: str
    base_url: str | None = None
    api_key: str | None = None
    retries: int = 2
    timeout_s: float = 120.0
    backoff_s: float = 1.0
    concurrency: int = 4


class Judge:
    """Grades turns with one OpenAI-compatible model; at most ``concurrency`` requests at once."""

    def __init__(self, cfg: JudgeConfig, prompts: Mapping[str, JudgePrompt]) -> None:
        from openai import AsyncOpenAI

        self.cfg = cfg
        self.prompts = prompts
        self._client = AsyncOpenAI(
            base_url=cfg.base_url, api_key=cfg.api_key or "none", max_retries=0, timeout=cfg.timeout_s
        )
        self._gate = asyncio.Semaphore(max(1, cfg.concurrency))

    async def aclose(self) -> None:
        await self._client.close()

    async def grade(self, question: Question, turn: int, answers: Sequence[str]) -> Judgement:
        name = prompt_name(question.category, turn, bool(question.reference))
        messages = build_messages(self.prompts[name], question, turn, answers)
        last_error = ""
        last_text: str | None = None
        attempts = 0
        for _ in range(self.cfg.retries + 1):
            attempts += 1
            try:
                async with self._gate:
                    text = await self._complete(messages)
            except Exception as exc:  # noqa: BLE001 - any transport or API failure is retried, then recorded
                last_error = f"judge request failed: {type(exc).__name__}: {_one_line(str(exc))}"
                if attempts <= self.cfg.retries:
                    await asyncio.sleep(self.cfg.backoff_s * attempts)  # a garbled answer is asked again at once
                continue
            last_text = text
            score = parse_rating(text)
            if score is not None:
                return Judgement(name, score, text, None, attempts)
            last_error = f"no [[rating]] within 1-10 in the judgement after {attempts} attempt(s)"
        return Judgement(name, None, last_text, last_error, attempts)

    async def complete(self, messages: list[dict[str, str]]) -> str:
        """One completion with this judge's model and settings (other prompts: ``kame eval duplex``)."""
        async with self._gate:
            return await self._complete(messages)

    async def _complete(self, messages: list[dict[str, str]]) -> str:
        resp = await self._client.chat.completions.create(
            model=self.cfg.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=0.0,
            max_tokens=MAX_TOKENS,
        )
        content = resp.choices[0].message.content if resp.choices else None
        return content or ""


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
