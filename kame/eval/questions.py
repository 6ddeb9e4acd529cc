"""The question set and the judge prompts: MT-Bench data bundled in ``kame/data/mt_bench``.

The files are FastChat's (Apache-2.0, see ``kame/data/mt_bench/NOTICE.md``);
they are read from the installed package, never from outside it, so an
installed ``kame`` evaluates the same questions as a checkout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kame.errors import UserError

QUESTIONS_FILE = "mt_bench_kame_subset.jsonl"
JUDGE_PROMPTS_FILE = "mt_bench_judge_prompts.jsonl"


@dataclass(frozen=True)
class Question:
    """One MT-Bench question: two turns spoken in one session."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]
    reference: tuple[str, ...] | None = None

    @property
    def key(self) -> str:
        """The id as a string: how ``results.jsonl`` and resume identify the question."""
        return str(self.question_id)


@dataclass(frozen=True)
class JudgePrompt:
    """One of MT-Bench's judge prompts (``single-v1``, ``single-math-v1-multi-turn``, ...)."""

    name: str
    system_prompt: str
    prompt_template: str
    output_format: str


def _data_text(name: str) -> str:
    return (resources.files("kame.data") / "mt_bench" / name).read_text(encoding="utf-8")


def _jsonl(text: str, origin: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{origin} line {n}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{origin} line {n}: expected a JSON object")
        out.append(obj)
    return out


def parse_question(obj: dict[str, Any], origin: str = "questions") -> Question:
    """A :class:`Question` from MT-Bench's JSON layout, or a UserError naming what is wrong."""
    qid = obj.get("question_id")
    if not isinstance(qid, (int, str)) or isinstance(qid, bool) or str(qid) == "":
        raise UserError(f"{origin}: question without a question_id")
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise UserError(f"{origin}: question {qid}: 'turns' must be a list of non-empty strings")
    category = obj.get("category")
    if not isinstance(category, str) or not category:
        raise UserError(f"{origin}: question {qid}: missing 'category'")
    ref = obj.get("reference")
    if ref is not None and (not isinstance(ref, list) or not all(isinstance(r, str) for r in ref)):
        raise UserError(f"{origin}: question {qid}: 'reference' must be a list of strings")
    return Question(qid, category, tuple(turns), tuple(ref) if ref is not None else None)


def load_questions(path: str | Path | None = None, limit: int | None = None) -> list[Question]:
    """The bundled 30-question subset, or ``path`` (same JSONL layout); the first ``limit`` of them."""
    if path is None:
        origin, text = f"kame/data/mt_bench/{QUESTIONS_FILE}", _data_text(QUESTIONS_FILE)
    else:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"questions file {p} does not exist")
        origin, text = str(p), p.read_text(encoding="utf-8")
    questions = [parse_question(obj, origin) for obj in _jsonl(text, origin)]
    if not questions:
        raise UserError(f"{origin}: no questions")
    keys = [q.key for q in questions]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise UserError(f"{origin}: duplicate question_id {', '.join(dupes)}")
    if limit is not None:
        if limit < 1:
            raise UserError("--limit must be at least 1")
        questions = questions[:limit]
    return questions


def load_judge_prompts() -> dict[str, JudgePrompt]:
    """MT-Bench's judge prompts by name (bundled, unchanged)."""
    origin = f"kame/data/mt_bench/{JUDGE_PROMPTS_FILE}"
    return {
        obj["name"]: JudgePrompt(obj["name"], obj["system_prompt"], obj["prompt_template"], obj["output_format"])
        for obj in _jsonl(_data_text(JUDGE_PROMPTS_FILE), origin)
    }
