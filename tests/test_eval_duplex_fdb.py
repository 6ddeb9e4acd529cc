"""Opt-in: Full-Duplex-Bench's own scoring scripts on the sample folders ``kame eval duplex`` wrote.

Set ``FDB_DIR`` to a checkout of github.com/DanielLin94144/Full-Duplex-Bench (its code is CC BY-NC 4.0:
kame neither bundles nor copies it) and give this test's Python the scripts' few imports
(``python-dotenv``, ``openai``, ``tqdm``). Without ``FDB_DIR`` the test is skipped: that is its only skip.

kame streams real sessions into the CPU demo and writes every sample folder through its own recording
path; the words come from a fixed stand-in ASR (the demo's random model says nothing an ASR can hear),
placed near each decoded stretch's end so that every sample takes the turn with a positive latency. Then,
each from a scratch working folder (the scripts write logs there and read ``./instruction``):

- v1: ``evaluate.py --task pause_handling / smooth_turn_taking / user_interruption`` on kame's folders; their
  take-over rate and latency must be kame's own (``results.json``). The interruption's judge is an
  OpenAI-compatible server on 127.0.0.1 reached through ``OPENAI_BASE_URL``, answering for the script's
  fixed model name;
- v1.5: ``evaluate.py --task behavior``: it must find the four transcripts in every folder and write the
  label the endpoint gave (``content_tag.json``). Its retry loop never ends on an unparsable answer; the
  subprocess's timeout turns that into a failure here.

Not run: ``get_timing.py`` and ``--task general_before_after`` (silero-vad, torchaudio, UTMOSv2, Praat).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kame.eval.duplex.client import Target
from kame.eval.duplex.runner import DuplexConfig, Variant, run_duplex
from kame.eval.duplex.words import Word
from tests.support.duplex_sets import generate_set, make_v15_set
from tests.support.llm_server import LlmServer, Reply
from tests.support.moshi_client import ServerProcess

FDB_DIR = os.environ.get("FDB_DIR")
pytestmark = pytest.mark.skipif(not FDB_DIR, reason="FDB_DIR (a checkout of Full-Duplex-Bench) is not set")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_set(tmp_path_factory.mktemp("duplex-set"))


class FixedAsr:
    """Four words, ending 0.5 s before the decoded stretch's end (on that stretch's clock)."""

    name = "fixed words (test)"

    async def words_async(self, pcm: np.ndarray, rate: int) -> list[Word]:
        end = pcm.size / rate - 0.5
        return [Word(t, end - 1.6 + 0.4 * i, end - 1.3 + 0.4 * i) for i, t in enumerate(("sure", "here", "it", "is"))]


def evaluation_dir() -> Path:
    assert FDB_DIR is not None
    d = Path(FDB_DIR) / "v1_v1.5" / "evaluation"
    assert (d / "evaluate.py").is_file(), f"FDB_DIR={FDB_DIR}: no v1_v1.5/evaluation/evaluate.py there"
    return d


def run_script(task: str, root: Path, work: Path, llm: LlmServer) -> str:
    """``evaluate.py --task TASK --root_dir ROOT`` from ``work``; its output (a non-zero exit fails)."""
    ev = evaluation_dir()
    work.mkdir(exist_ok=True)
    if not (work / "instruction").exists():
        (work / "instruction").symlink_to(ev / "instruction")
    env = {**os.environ, "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "local"}
    proc = subprocess.run([sys.executable, str(ev / "evaluate.py"), "--task", task, "--root_dir", str(root)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def average(out: str, what: str) -> float:
    m = re.search(rf"Average {what}:\s+([-0-9.eE]+)", out)
    assert m, out[-1000:]
    return float(m.group(1))


def record(server: ServerProcess, task: str, data: Path, results: Path) -> dict:
    cfg = DuplexConfig(task=task, data_dir=data, variants=[Variant("oracle-on")], dataset="t", concurrency=4,
                       target=Target.parse(server.http_url), asr=FixedAsr(), asr_name=FixedAsr.name, say=lambda s: None)
    doc = asyncio.run(run_duplex(cfg, results))
    assert doc["skipped"] == [], doc["skipped"]
    return dict(doc["rows"][0])


def test_benchmark_scripts_score_kame_folders(demo_server: ServerProcess, generated: Path,
                                               tmp_path: Path) -> None:
    llm = LlmServer(["gpt-4-turbo", "gpt-4o-2024-08-06"]).start()
    try:
        llm.set_for_model("gpt-4-turbo", Reply("Analysis: it answers the new question.\n"
                                               "I would rate the AI's response as 4"))
        llm.set_for_model("gpt-4o-2024-08-06", Reply('{"behaviour": ["C_RESPOND"]}'))
        for task in ("pause_handling", "smooth_turn_taking", "user_interruption"):
            data = tmp_path / "v1" / task
            data.mkdir(parents=True)
            for d in sorted(p for p in (generated / task).iterdir() if p.is_dir())[:2]:
                (data / d.name).mkdir()
                for f in d.iterdir():
                    if f.name not in ("output.wav", "output.json"):  # other tests of the module may have run
                        (data / d.name / f.name).write_bytes(f.read_bytes())
            row = record(demo_server, task, data, tmp_path / "results" / task)
            out = run_script(task, data, tmp_path / "work", llm)
            assert average(out, "take turn") == pytest.approx(row["tor"]) and row["tor"] == 1.0
            if task != "pause_handling":
                assert row["latency_mean_s"] > 0.5
                assert average(out, "latency") == pytest.approx(row["latency_mean_s"], abs=2e-3)
            if task == "user_interruption":
                assert average(out, "rating") == 4.0
        v15 = make_v15_set(generated, tmp_path / "v1.5" / "talking_to_other", ("001", "002"))
        record(demo_server, "v1.5/talking_to_other", v15, tmp_path / "results" / "v15")
        out = run_script("behavior", v15, tmp_path / "work", llm)
        assert "Skipping" not in out
        for d in sorted(v15.iterdir()):
            assert json.loads((d / "content_tag.json").read_text()) == {"behaviour": ["C_RESPOND"]}
        assert (tmp_path / "work" / "talking_to_other_behavior.log").read_text().startswith("Ratios (C-axis)")
    finally:
        llm.stop()
