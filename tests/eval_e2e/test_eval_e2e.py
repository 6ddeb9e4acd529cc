"""``kame eval`` end to end: the CPU demo server in a subprocess, a real HTTP judge, resume and a sweep.

The demo's front-end is a tiny random model: it babbles text and emits
noise, which no VAD takes for speech, so its turns have no measurable
assistant start (``latency_s`` null with a note) and every reply runs to
``--max-reply-s``. What is checked here is the harness: files and fields,
the user's speech found on the recordings where the TTS put it, judging
with retries, resume after a crash, and that sweep values reach the
server. Latency values themselves are checked against a peer that
answers at known times (tests/test_eval_session.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kame.cli import main as kame_main
from kame.eval.analysis import read_stereo_wav
from kame.eval.results import FIELDS
from kame.eval.runner import trim_silence
from kame.eval.tts import make_tts
from kame.eval.vad import speech_segments, turn_latency
from tests.support.llm_server import LlmServer, Reply
from tests.support.moshi_client import ServerProcess

MAX_REPLY_S = 3.0
Q104 = "David has three sisters. Each of them has one brother. How many brothers does David have?"
Q104_2 = "What if each sister had two brothers?"
Q151 = "Name two benefits of reading books every day, and explain them briefly."
Q151_2 = "Which of the two matters most to you?"
QUESTIONS = [
    {"question_id": 104, "category": "reasoning", "turns": [Q104, Q104_2],
     "reference": ["David has no brother. He is the one brother of his three sisters.", "David has one brother."]},
    {"question_id": 151, "category": "humanities", "turns": [Q151, Q151_2]},
    {"question_id": 160, "category": "stem", "turns": ["Not used: --limit 2.", "No."]},
]


class JudgeServer(LlmServer):
    """Judges by content: q151's turn 2 always gets a judgement without a rating (so it is retried,
    then marked); q104's turn 1 gets one such judgement first (retried, then scored); the rest [[7]]."""

    def __init__(self) -> None:
        super().__init__(["judge-model"])
        self._garbled_once: set[str] = set()
        self._mu = threading.Lock()

    def _pick_reply(self, rec: Any) -> Reply:  # a RecordedRequest
        content = rec.body["messages"][-1]["content"]
        if Q151_2 in content:
            return Reply("The assistant rambles; I would give it a low mark.")
        with self._mu:
            if Q104 in content and Q104_2 not in content and "q104t1" not in self._garbled_once:
                self._garbled_once.add("q104t1")
                return Reply("Rating: seven")
        return Reply("The response is adequate. Rating: [[7]]")


@pytest.fixture(scope="module")
def server(demo_server: ServerProcess) -> ServerProcess:
    """The shared CPU demo (tests/conftest.py)."""
    return demo_server


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeServer]:
    srv = JudgeServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def questions_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("eval-questions") / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAME_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("EVAL_JUDGE_KEY", "sk-eval-test")


def _args(server: ServerProcess, out: Path, questions: Path, *extra: str) -> list[str]:
    return ["eval", "--server", server.http_url, "--out", str(out), "--questions", str(questions), "--limit", "2",
            "--max-reply-s", str(MAX_REPLY_S), *extra]


def _judge_args(judge: JudgeServer) -> list[str]:
    return ["--judge-base-url", judge.base_url, "--judge-model", "judge-model", "--judge-api-key-env", "EVAL_JUDGE_KEY"]


def _rows(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]


def _speech_s(text: str) -> float:
    return len(trim_silence(make_tts("espeak").synthesize(text))) / 24000


def _check_question_audio(directory: Path, rows: list[dict[str, Any]]) -> None:
    """The rows' timing facts are what a VAD finds on the recorded wavs (left: user, right: assistant).

    The turn wavs of a question tile its session (turn 2 starts where turn 1 ends), so their
    concatenation is the session's recording, on which the turns' windows are applied.
    """
    rows = sorted(rows, key=lambda r: r["turn"])
    wavs = [read_stereo_wav(directory / r["audio"]) for r in rows]
    for r, st in zip(rows, wavs):
        assert len(st) / 24000 == pytest.approx(r["turn_end_s"] - r["turn_start_s"], abs=0.01)
    session = np.concatenate(wavs)
    user, assistant = speech_segments(session[:, 0]), speech_segments(session[:, 1])
    for r in rows:
        lat = turn_latency(user, assistant, r["turn_start_s"], r["turn_end_s"])
        assert lat.user_end_s is not None and r["user_end_s"] == pytest.approx(lat.user_end_s, abs=0.031)
        if r["latency_s"] is None:
            assert lat.latency_s is None and r["latency_note"]
        else:
            assert lat.latency_s == pytest.approx(r["latency_s"], abs=0.031)
        # and the question is where the TTS put it: lead-in (turn 1), then the speech
        lead = 0.5 if r["turn"] == 1 else 0.0
        assert r["user_end_s"] == pytest.approx(r["turn_start_s"] + lead + _speech_s(r["user_text"]), abs=0.1)
    assert np.abs(session[:, 1]).max() > 0.01  # the assistant's audio was recorded


def test_eval_records_judges_and_summarizes(
    server: ServerProcess, judge: JudgeServer, questions_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    rc = kame_main(_args(server, out, questions_file, "--concurrency", "2", *_judge_args(judge)))
    printed = capsys.readouterr().out
    assert rc == 0, printed
    for name in ("results.jsonl", "summary.json", "summary.md", "run.json"):
        assert (out / name).is_file(), name
    for q in (104, 151):
        for f in ("turn1.wav", "turn2.wav", "events.jsonl"):
            assert (out / "questions" / f"q{q}" / f).is_file()

    rows = sorted(_rows(out), key=lambda r: (r["question_id"], r["turn"]))
    assert [(r["question_id"], r["turn"]) for r in rows] == [(104, 1), (104, 2), (151, 1), (151, 2)]
    by = {(r["question_id"], r["turn"]): r for r in rows}
    for r in rows:
        assert set(r) == set(FIELDS), set(r) ^ set(FIELDS)
        assert r["user_text"] == QUESTIONS[0 if r["question_id"] == 104 else 1]["turns"][r["turn"] - 1]
        assert r["assistant_text"] and r["answer_judged"] == r["assistant_text"] and r["score_from"] == "text"
        assert r["reply_end"] in ("silence", "max_reply")
        assert r["turn_end_s"] - r["turn_start_s"] <= (0.5 if r["turn"] == 1 else 0) + _speech_s(r["user_text"]) \
            + MAX_REPLY_S + 0.4
        assert r["server_settings"]["oracle_policy"] == "reset" and "server" not in r["server_settings"]
        assert r["session_id"].startswith("sess_")
        for oa in r["oracle_answers"]:
            assert oa["text"] and r["turn_start_s"] <= oa["first_s"] <= oa["last_s"] <= r["turn_end_s"] + 0.5
    for q in (104, 151):
        _check_question_audio(out, [r for r in rows if r["question_id"] == q])
    assert any(r["oracle_answers"] for r in rows)  # the scripted back-end's answers reached the oracle
    events = [json.loads(x) for x in (out / "questions/q104/events.jsonl").read_text().splitlines()]
    types = {e["type"] for e in events}
    assert {"kame.oracle.reset", "kame.backend.request_started", "response.output_audio_transcript.delta"} <= types
    assert not types & {"response.output_audio.delta", "kame.output_audio.delta"}  # audio is in the wavs

    # judging: prompts per category/turn, a garbled judgement retried, one marked after the retries
    assert [by[k]["judge_prompt"] for k in sorted(by)] == [
        "single-math-v1", "single-math-v1-multi-turn", "single-v1", "single-v1-multi-turn"]
    assert (by[104, 1]["score"], by[104, 1]["judge_attempts"], by[104, 1]["judge_error"]) == (7.0, 2, None)
    assert (by[104, 2]["score"], by[104, 2]["judge_attempts"]) == (7.0, 1)
    assert by[151, 1]["score"] == 7.0
    marked = by[151, 2]
    assert marked["score"] is None and marked["judge_attempts"] == 3 and "no [[rating]]" in marked["judge_error"]
    assert marked["judge_explanation"].startswith("The assistant rambles")
    reqs = judge.chat_requests()
    assert len(reqs) == 2 + 1 + 1 + 3
    assert all(r.headers["authorization"] == "Bearer sk-eval-test" for r in reqs)
    assert all(r.model == "judge-model" for r in reqs)
    t1 = next(r for r in reqs if Q104 in r.body["messages"][1]["content"] and Q104_2 not in r.body["messages"][1]["content"])
    assert by[104, 1]["assistant_text"] in t1.body["messages"][1]["content"]

    s = json.loads((out / "summary.json").read_text())
    assert s["scores"]["by_category"] == {"reasoning": 7.0, "humanities": 7.0}
    assert s["scores"]["overall"] == 7.0 and s["scores"]["unscored"] == 1 and s["scores"]["judge"] == "judge-model"
    assert set(s["latency"]) >= {"median_s", "p90_s", "n", "missing"}
    assert s["latency"]["n"] + s["latency"]["missing"] == 4
    assert s["versions"]["server"]["kame"] and s["versions"]["local"]["kame"]
    assert s["config"]["max_reply_s"] == MAX_REPLY_S and s["config"]["concurrency"] == 2
    assert s["wall"]["sessions"] == 2 and s["wall"]["audio_s"] > 0
    md = (out / "summary.md").read_text()
    assert "| KAME + GPT-4.1 (published) | 5.44 | 6.65 | 7.19 | 6.43 | ~0 s |" in md
    assert "| **this run** | 7.00 | – | 7.00 | 7.00 |" in md
    assert "wall time" in printed and "overhead" in printed and "ideal" in printed


def test_interrupted_run_resumes_without_redoing_finished_questions(
    server: ServerProcess, questions_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "resume"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kame.cli", *_args(server, out, questions_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for the first question's lines, then crash the run
            if (out / "results.jsonl").exists() and len((out / "results.jsonl").read_text().splitlines()) >= 2:
                break
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = _rows(out)
    assert [(r["question_id"], r["turn"]) for r in first] == [(104, 1), (104, 2)]

    rc = kame_main(_args(server, out, questions_file))
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "1 question(s) already finished" in printed
    rows = _rows(out)
    assert rows[:2] == first  # untouched, not redone
    assert [(r["question_id"], r["turn"]) for r in rows[2:]] == [(151, 1), (151, 2)]
    assert rows[2]["session_id"] != first[0]["session_id"]
    s = json.loads((out / "summary.json").read_text())
    assert s["questions"] == 2 and s["turns"] == 4 and s["wall"]["sessions"] == 1
    assert "no judge configured" in s["scores"]["note"] and s["scores"]["overall"] is None
    # one session at a time: the set took the session's own duration plus little
    assert s["wall"]["overhead_pct"] <= 10.0, s["wall"]

    assert kame_main(_args(server, out, questions_file)) == 0
    assert "nothing to record" in capsys.readouterr().out
    assert _rows(out) == rows
    # other settings in the same directory are refused, not mixed
    assert kame_main(_args(server, out, questions_file, "--reply-silence-s", "1.0")) == 2
    assert "other settings" in capsys.readouterr().err


def test_sweep_runs_each_value_and_plots(
    server: ServerProcess, judge: JudgeServer, questions_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    rc = kame_main(_args(server, out, questions_file, "--concurrency", "2", "--sweep", "oracle_delay_s=0,1",
                         *_judge_args(judge)))
    printed = capsys.readouterr().out
    assert rc == 0, printed
    gaps: dict[float, list[float]] = {}
    for value in (0.0, 1.0):
        d = out / f"oracle_delay_s={value:g}"
        rows = _rows(d)
        assert len(rows) == 4
        assert all(r["settings"] == {"oracle_delay_s": value} for r in rows)
        assert all(r["server_settings"]["oracle_delay_s"] == value for r in rows)  # the server applied it
        assert (d / "summary.json").is_file() and (d / "summary.md").is_file()
        gaps[value] = []
        for q in (104, 151):
            events = [json.loads(x) for x in (d / "questions" / f"q{q}" / "events.jsonl").read_text().splitlines()]
            first = {e["request_id"]: e["t_s"] for e in events if e["type"] == "kame.backend.first_token"}
            gaps[value] += [e["t_s"] - first[e["request_id"]] for e in events
                            if e["type"] == "kame.oracle.reset" and e["request_id"] in first]
    # the delay shows in the events: answers reach the oracle a second after their first token. The gap is
    # measured where the events arrive (kame eval's timeline), so its first event's delivery jitter counts:
    # the server waits the full second between the two (kame/oracle/loop.py), and a loaded CI run measured
    # 0.887 s for one of six; without the delay the gaps stay under 0.9 s (below)
    assert gaps[1.0] and min(gaps[1.0]) >= 0.8, gaps[1.0]
    assert gaps[0.0] and max(gaps[0.0]) < 0.9
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["key"] == "oracle_delay_s" and sweep["values"] == [0.0, 1.0]
    assert [p["dir"] for p in sweep["points"]] == ["oracle_delay_s=0", "oracle_delay_s=1"]
    assert all(p["score"] == 7.0 for p in sweep["points"])
    assert "| `0` |" in (out / "sweep.md").read_text() and "| `1` |" in (out / "sweep.md").read_text()
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert printed.count("wall time") == 1
