"""``results.jsonl``: one line per question and turn, appended a question at a time, and resume.

A question's lines are written together, in one ``write`` followed by
``fsync``, only once the question is completely done (both turns spoken,
recorded and judged). An interrupted run therefore leaves either all lines
of a question or none, plus at worst a torn last line, which
:meth:`ResultsFile.load` drops. On restart a question whose every turn is
present is skipped.

``run.json`` beside it fingerprints what changes the audio (TTS, session
settings, reply detection); resuming into a directory made with different
settings is refused rather than mixing two experiments in one table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kame.errors import UserError

RESULTS = "results.jsonl"
RUN_FILE = "run.json"

#: Fields of every results.jsonl line (documented in docs/evaluation.md).
FIELDS = (
    "question_id",
    "category",
    "turn",
    "user_text",
    "assistant_text",
    "answer_judged",
    "score_from",
    "oracle_answers",
    "score",
    "judge_prompt",
    "judge_explanation",
    "judge_error",
    "judge_attempts",
    "latency_s",
    "user_start_s",
    "user_end_s",
    "assistant_start_s",
    "latency_note",
    "turn_start_s",
    "turn_end_s",
    "reply_end",
    "user_transcript_server",
    "audio",
    "events",
    "settings",
    "session_id",
    "server_settings",
    "session_audio_s",
    "send_lateness_max_s",
    "reconnects",
    "reconnect_reasons",
)
#: Only with ``--score-from asr``.
OPTIONAL_FIELDS = ("assistant_asr_text",)


class ResultsFile:
    """The results of one run directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / RESULTS

    def load(self) -> list[dict[str, Any]]:
        """Every complete line; a torn last line (interrupted write) is cut off the file."""
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        rows: list[dict[str, Any]] = []
        good = 0
        for line in raw.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                obj = json.loads(line)
            except ValueError:
                break
            if isinstance(obj, dict):
                rows.append(obj)
            good += len(line)
        if good < len(raw):
            with open(self.path, "r+b") as f:
                f.truncate(good)
        return rows

    def finished(self, turns_of: Mapping[str, int]) -> set[str]:
        """Question keys (``str(question_id)``) with a line for each of their ``turns_of[key]`` turns."""
        seen: dict[str, set[int]] = {}
        for row in self.load():
            seen.setdefault(str(row.get("question_id")), set()).add(int(row.get("turn", 0)))
        return {k for k, n in turns_of.items() if seen.get(k, set()) >= set(range(1, n + 1))}

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append one question's lines atomically enough for resume (one write, then fsync)."""
        data = "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows)
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the file (after re-judging), atomically."""
        tmp = self.path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)


def check_run_file(directory: Path, fingerprint: Mapping[str, Any]) -> None:
    """Write ``run.json`` on the first run; refuse to resume a run made with other settings."""
    path = Path(directory) / RUN_FILE
    wanted = json.loads(json.dumps(dict(fingerprint)))
    if path.exists():
        try:
            have = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise UserError(f"{path} is not JSON; remove it or use another --out") from None
        if have != wanted:
            diff = sorted(k for k in set(have) | set(wanted) if have.get(k) != wanted.get(k))
            raise UserError(
                f"{directory} holds a run made with other settings ({', '.join(diff)}); use another --out"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n", encoding="utf-8")
