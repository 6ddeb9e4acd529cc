"""One question set end to end: sessions (``concurrency`` at once), judging, results, summary.

Wall time is the point: a run should take the audio's own duration divided
by the concurrency, plus little. So nothing waits in line behind the
sessions: questions are synthesized once, up front, in a thread; each
worker starts its next session the moment the previous one closes; cutting
the recording into turns, transcribing (``--score-from asr``) and judging
happen in background tasks while the next sessions run; a question's lines
are appended to ``results.jsonl`` when it is completely done. With more
than one worker the longest questions go first, so the last minutes are
not one long question running alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from kame.errors import UserError
from kame.eval.analysis import turn_facts
from kame.eval.judge import Judge, Judgement
from kame.eval.questions import Question
from kame.eval.results import ResultsFile, check_run_file
from kame.eval.session import (
    DriveConfig,
    SessionError,
    SessionRecording,
    drive_question,
)
from kame.eval.summary import build_summary, write_summary
from kame.eval.transcribe import ReplyTranscriber
from kame.eval.tts import RATE, Tts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerTarget:
    """Where the server is: its realtime websocket and its ``/health``."""

    ws_url: str
    health_url: str
    token: str | None = None

    @classmethod
    def parse(cls, url: str, token: str | None = None) -> ServerTarget:
        """``http://H:P``, ``ws://H:P/v1/realtime``, ``H:P`` (a path prefix before ``/v1`` is kept)."""
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
            raise UserError(f"--server {url!r}: expected http(s)://HOST:PORT or ws(s)://HOST:PORT/v1/realtime")
        secure = scheme in ("https", "wss")
        path = parts.path.rstrip("/")
        for suffix in ("/v1/realtime", "/v1"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
                break
        ws = urlunsplit(("wss" if secure else "ws", parts.netloc, path + "/v1/realtime", "", ""))
        health = urlunsplit(("https" if secure else "http", parts.netloc, path + "/health", "", ""))
        return cls(ws, health, token)


def fetch_health(target: ServerTarget, starting_timeout_s: float = 600.0, unreachable_timeout_s: float = 5.0,
                 say: Callable[[str], None] = print) -> dict[str, Any]:
    """``GET /health``, waiting while the server says ``starting`` (models load for minutes on a GPU box).

    A server that does not answer at all fails after ``unreachable_timeout_s``; a UserError either way.
    """
    t0 = time.monotonic()
    told = False
    while True:
        try:
            with urllib.request.urlopen(target.health_url, timeout=5.0) as resp:
                body = json.loads(resp.read().decode("utf-8"))
            status = body.get("status")
            if status == "ok":
                return dict(body)
            if status != "starting" or time.monotonic() - t0 >= starting_timeout_s:
                raise UserError(f"server at {target.health_url} is not ready (status {status!r})")
            if not told:
                say(f"kame eval: the server is starting; waiting up to {starting_timeout_s:g} s")
                told = True
        except (OSError, ValueError) as exc:
            if time.monotonic() - t0 >= unreachable_timeout_s:
                why = getattr(exc, "reason", None) or exc
                raise UserError(f"cannot reach the server at {target.health_url} ({why})") from None
        time.sleep(0.5)


def trim_silence(pcm: np.ndarray, floor: float = 1e-3, margin_s: float = 0.02) -> np.ndarray:
    """Cut a TTS engine's leading and trailing silence (keeping ``margin_s``), so a turn ends when its speech does."""
    loud = np.nonzero(np.abs(pcm) > floor)[0]
    if not loud.size:
        return pcm
    m = int(margin_s * RATE)
    return pcm[max(0, loud[0] - m) : loud[-1] + 1 + m].copy()


def synthesize_all(tts: Tts, questions: Sequence[Question]) -> dict[str, list[np.ndarray]]:
    """Every turn of every question, spoken once (sweep points reuse them)."""
    return {q.key: [trim_silence(tts.synthesize(t)) for t in q.turns] for q in questions}


@dataclass(frozen=True)
class EvalConfig:
    """Everything a run needs besides the session settings of a sweep point."""

    target: ServerTarget
    questions: tuple[Question, ...]
    questions_source: str
    tts: Tts
    drive: DriveConfig
    score_from: str = "text"
    concurrency: int = 1
    judge_model: str | None = None
    judge_base_url: str | None = None


@dataclass
class SetOutcome:
    directory: Path
    summary: dict[str, Any]
    audio_s: float = 0.0
    wall_s: float = 0.0
    sessions: int = 0
    skipped: int = 0
    rejudged: int = 0
    failures: list[str] = field(default_factory=list)


class LocalVersions:
    """``kame.versions.runtime_versions()`` of this machine, computed in a child process.

    It imports torch (about 3 s), which would otherwise sit on the run's
    critical path or, in a thread, hold the GIL while sessions stream.
    """

    _CODE = "import json; from kame.versions import runtime_versions; print(json.dumps(runtime_versions()))"

    def __init__(self) -> None:
        self._value: dict[str, str] | None = None
        nice = shutil.which("nice")  # the sessions' real-time streaming wins the CPU over this bookkeeping
        cmd = [*([nice, "-n", "10"] if nice else []), sys.executable, "-c", self._CODE]
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    def get(self) -> dict[str, str]:
        if self._value is None:
            try:
                assert self._proc is not None
                out, _ = self._proc.communicate(timeout=120)
                self._value = dict(json.loads(out))
            except (subprocess.TimeoutExpired, ValueError, TypeError, AssertionError):
                if self._proc is not None and self._proc.poll() is None:
                    self._proc.kill()
                from kame.versions import runtime_versions

                self._value = runtime_versions()
            self._proc = None
        return self._value


@dataclass
class Services:
    """What a run shares across sweep points."""

    judge: Judge | None
    transcriber: ReplyTranscriber | None
    speech: dict[str, list[np.ndarray]]
    server_versions: dict[str, Any]
    local_versions: Callable[[], dict[str, str]]
    say: Callable[[str], None] = print

    def versions(self) -> dict[str, Any]:
        return {"server": self.server_versions, "local": self.local_versions()}


def fingerprint(cfg: EvalConfig, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What makes two runs comparable (resume refuses to mix others)."""
    return {
        "tts": cfg.tts.name,
        "settings": dict(settings),
        "drive": cfg.drive.fingerprint(),
        "score_from": cfg.score_from,
        "questions": cfg.questions_source,
    }


def config_summary(cfg: EvalConfig, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "server": cfg.target.ws_url,
        "questions": cfg.questions_source,
        "n_questions": len(cfg.questions),
        "tts": cfg.tts.name,
        "settings": dict(settings),
        "reply_silence_s": cfg.drive.reply_silence_s,
        "max_reply_s": cfg.drive.max_reply_s,
        "lead_in_s": cfg.drive.lead_in_s,
        "vad": cfg.drive.vad.__dict__,
        "score_from": cfg.score_from,
        "concurrency": cfg.concurrency,
        "judge": {"model": cfg.judge_model, "base_url": cfg.judge_base_url} if cfg.judge_model else None,
    }


async def _grade(judge: Judge | None, q: Question, answers: list[str]) -> list[Judgement | None]:
    if judge is None:
        return [None] * len(answers)
    return list(await asyncio.gather(*[judge.grade(q, t, answers[:t]) for t in range(1, len(answers) + 1)]))


async def _finish_question(
    q: Question, rec: SessionRecording, directory: Path, cfg: EvalConfig, settings: Mapping[str, Any],
    services: Services, results: ResultsFile,
) -> None:
    facts = await asyncio.to_thread(turn_facts, rec, directory / "questions" / f"q{q.key}", directory, cfg.drive.vad)
    texts = [f["assistant_text"] for f in facts]
    asr_texts: list[str | None] = [None] * len(facts)
    if cfg.score_from == "asr":
        assert services.transcriber is not None
        asr_texts = [await services.transcriber.transcribe_async(f["reply_pcm"]) for f in facts]
    judged = [a if a is not None else t for a, t in zip(asr_texts, texts)]
    grades = await _grade(services.judge, q, judged)
    rows = []
    for f, asr, answer, grade in zip(facts, asr_texts, judged, grades):
        f.pop("reply_pcm")
        t = int(f["turn"])
        row: dict[str, Any] = {
            "question_id": q.question_id,
            "category": q.category,
            "turn": t,
            "user_text": q.turns[t - 1],
            "assistant_text": f.pop("assistant_text"),
            "answer_judged": answer,
            "score_from": cfg.score_from,
        }
        if asr is not None:
            row["assistant_asr_text"] = asr
        row["oracle_answers"] = f.pop("oracle_answers")
        row.update(grade.as_dict() if grade is not None else
                   {"score": None, "judge_prompt": None, "judge_explanation": None, "judge_error": None,
                    "judge_attempts": 0})
        row.update(f)
        row["settings"] = dict(settings)
        row["session_id"] = rec.session_id
        row["server_settings"] = {k: v for k, v in ((rec.session or {}).get("kame") or {}).items() if k != "server"}
        row["session_audio_s"] = round(rec.audio_s, 3)
        row["reconnects"] = len(rec.reconnects)
        row["reconnect_reasons"] = list(rec.reconnects)
        row["send_lateness_max_s"] = rec.send_lateness_max_s
        rows.append(row)
    results.append(rows)
    lat = ", ".join("–" if r["latency_s"] is None else f"{r['latency_s']:+.2f} s" for r in rows)
    sc = ", ".join("–" if r["score"] is None else f"{r['score']:g}" for r in rows)
    services.say(f"  q{q.key} ({q.category}): latency {lat}; score {sc}; {rec.audio_s:.1f} s of audio")


async def _rejudge(rows: list[dict[str, Any]], questions: Mapping[str, Question], judge: Judge) -> int:
    """Grade finished turns that have no score (no judge then, or it failed); returns how many changed."""
    by_q: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_q.setdefault(str(r.get("question_id")), []).append(r)
    todo = [(k, rs) for k, rs in by_q.items() if k in questions and any(r.get("score") is None for r in rs)]

    async def one(key: str, rs: list[dict[str, Any]]) -> int:
        q = questions[key]
        rs.sort(key=lambda r: int(r["turn"]))
        answers = [str(r.get("answer_judged") or "") for r in rs]
        changed = 0
        for r in rs:
            if r.get("score") is None:
                r.update((await judge.grade(q, int(r["turn"]), answers[: int(r["turn"])])).as_dict())
                changed += 1
        return changed

    return sum(await asyncio.gather(*[one(k, rs) for k, rs in todo]))


async def _drive_with_retries(
    q: Question, cfg: EvalConfig, settings: Mapping[str, Any], services: Services
) -> SessionRecording:
    """One question's session; a refused or drained one (1013, 1001, HTTP 503) is retried with
    back-off and jitter, the question spoken again from its start in a new session (a new
    conversation: the server keeps nothing across connections). The recording lists the
    reconnects (``reconnects`` in results.jsonl)."""
    from kame.client.reconnect import Backoff, Retrier

    retrier = Retrier(Backoff(attempts=cfg.drive.retries), say=lambda m: services.say(f"  q{q.key}: {m}"))
    reconnects: list[str] = []
    while True:
        try:
            rec = await drive_question(cfg.target.ws_url, services.speech[q.key], settings, cfg.drive)
        except SessionError as exc:
            if exc.retry_reason is None:
                raise
            retrier.started = exc.close_code == 1001  # a drain ended a conversation under way
            if not await retrier.wait(f"{exc.retry_reason}: {exc}"):
                raise SessionError(f"{exc}; gave up after {cfg.drive.retries} retries") from None
            reconnects.append(str(exc))
            continue
        rec.reconnects = reconnects
        return rec


async def run_set(
    cfg: EvalConfig, directory: Path, settings: Mapping[str, Any], services: Services, label: str = "this run"
) -> SetOutcome:
    """Run (or resume) the question set with these session settings into ``directory``."""
    t_start = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    check_run_file(directory, fingerprint(cfg, settings))
    results = ResultsFile(directory)
    outcome = SetOutcome(directory, {})
    qmap = {q.key: q for q in cfg.questions}
    if services.judge is not None:
        rows = results.load()
        outcome.rejudged = await _rejudge(rows, qmap, services.judge)
        if outcome.rejudged:
            results.rewrite(rows)
            services.say(f"  re-judged {outcome.rejudged} finished turn(s) that had no score")
    finished = results.finished({q.key: len(q.turns) for q in cfg.questions})
    todo = [q for q in cfg.questions if q.key not in finished]
    outcome.skipped = len(cfg.questions) - len(todo)
    if outcome.skipped:
        services.say(f"  {outcome.skipped} question(s) already finished in {directory}, skipped")
    if cfg.concurrency > 1:
        todo.sort(key=lambda q: -sum(len(p) for p in services.speech[q.key]))
    queue: asyncio.Queue[Question] = asyncio.Queue()
    for q in todo:
        queue.put_nowait(q)
    finishing: list[asyncio.Task[None]] = []

    async def worker() -> None:
        while True:
            try:
                q = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                rec = await _drive_with_retries(q, cfg, settings, services)
            except SessionError as exc:
                outcome.failures.append(f"question {q.key}: {exc}")
                services.say(f"  q{q.key}: FAILED: {exc}")
                continue
            outcome.sessions += 1
            outcome.audio_s += rec.audio_s
            finishing.append(asyncio.create_task(
                _finish_question(q, rec, directory, cfg, settings, services, results)))

    await asyncio.gather(*[worker() for _ in range(max(1, min(cfg.concurrency, len(todo))))])
    for exc in await asyncio.gather(*finishing, return_exceptions=True):
        if isinstance(exc, BaseException):
            log.error("finishing a question failed", exc_info=exc)
            outcome.failures.append(f"finishing a question failed: {type(exc).__name__}: {exc}")
    outcome.wall_s = time.monotonic() - t_start
    rows = [r for r in results.load() if str(r.get("question_id")) in qmap]
    rows.sort(key=lambda r: (list(qmap).index(str(r["question_id"])), int(r["turn"])))
    outcome.summary = build_summary(
        rows,
        config=config_summary(cfg, settings),
        versions=await asyncio.to_thread(services.versions),
        judge=cfg.judge_model,
        wall=wall_block(outcome.audio_s, cfg.concurrency, outcome.wall_s, outcome.sessions),
    )
    write_summary(directory, outcome.summary, label)
    return outcome


def wall_block(audio_s: float, concurrency: int, wall_s: float, sessions: int) -> dict[str, Any]:
    """The audio's own duration / concurrency (ideal) against the measured wall time."""
    ideal = audio_s / max(1, concurrency)
    return {
        "sessions": sessions,
        "audio_s": round(audio_s, 2),
        "concurrency": concurrency,
        "ideal_s": round(ideal, 2),
        "wall_s": round(wall_s, 2),
        "overhead_pct": round(100.0 * (wall_s / ideal - 1.0), 1) if ideal > 0 else None,
    }
