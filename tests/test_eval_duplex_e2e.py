"""``kame eval duplex`` against the CPU demo server: the CI smoke run, both wires, oracle on and off.

The CPU demo's front-end is a tiny random model: its output is noise, so
the scores here mean nothing; what is checked is the harness: a generated
set (8 samples), 4 sessions at once at real time within 2 minutes, every
output file in the benchmark's layout and of the input's length, the table
and plot, the front-end-alone setting honoured by the server (no oracle
event in its sessions, ``kame.llm`` false in ``session.updated``), and the
relevance judge through a real HTTP server with its cache.
"""

from __future__ import annotations

import asyncio
import json
import time
import wave
from pathlib import Path

import pytest

from kame.cli import main as kame_main
from kame.eval.duplex.relevance import RelevanceJudge
from kame.eval.judge import Judge, JudgeConfig
from tests.support.llm_server import LlmServer, Reply
from tests.support.moshi_client import ServerProcess


@pytest.fixture
def server(demo_server: ServerProcess) -> ServerProcess:
    """The shared CPU demo, once no session of an earlier test holds a slot (the smoke runs open 4 at once
    at real time and time themselves). In the default one-process run this file comes first anyway."""
    deadline = time.monotonic() + 15
    while demo_server.get_json("/health")[1]["sessions"]["active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return demo_server


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("duplex-set")
    assert kame_main(["eval", "duplex", str(root), "--generate", "--per-task", "4", "--seed", "3"]) == 0
    return root


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAME_AUTH_TOKEN", raising=False)


def _frames(path: Path) -> tuple[int, int]:
    with wave.open(str(path)) as w:
        return w.getnframes(), w.getframerate()


def test_generated_set_is_reproducible(generated: Path, tmp_path: Path) -> None:
    assert kame_main(["eval", "duplex", str(tmp_path), "--generate", "--per-task", "4", "--seed", "3"]) == 0
    for task in ("pause_handling", "smooth_turn_taking", "user_interruption", "backchannel"):
        for d in sorted((generated / task).iterdir()):
            assert (d / "input.wav").read_bytes() == (tmp_path / task / d.name / "input.wav").read_bytes()
            assert _frames(d / "input.wav")[1] == 16000
    voices = {json.loads((d / "meta.json").read_text())["voice"] for d in (generated / "backchannel").iterdir()}
    rates = {json.loads((d / "meta.json").read_text())["wpm"] for t in ("pause_handling", "user_interruption")
             for d in (generated / t).iterdir()}
    assert len(voices) >= 2 and len(rates) >= 2
    lab = json.loads((generated / "user_interruption" / "001" / "interrupt.json").read_text())[0]
    assert lab["interrupt"] and lab["context"] and lab["timestamp"][0] < lab["timestamp"][1]


def test_smoke_chat_turn_taking(server: ServerProcess, generated: Path, tmp_path: Path) -> None:
    """The CI smoke run: 4 samples, 4 sessions at once over /api/chat, then outputs and scores."""
    data = generated / "smooth_turn_taking"
    t0 = time.monotonic()
    rc = kame_main(["eval", "duplex", str(data), "--task", "smooth_turn_taking", "--server", server.http_url,
                    "--concurrency", "4"])
    wall = time.monotonic() - t0
    assert rc == 0
    longest = max(_frames(d / "input.wav")[0] / 16000 for d in data.iterdir() if d.is_dir())
    assert wall < longest + 60, wall  # 4 at once: about one sample's length, plus ASR
    for d in sorted(p for p in data.iterdir() if p.is_dir()):
        n_in, _ = _frames(d / "input.wav")
        n_out, rate = _frames(d / "output.wav")
        assert rate == 24000 and abs(n_out / rate - n_in / 16000) < 1e-3
        out = json.loads((d / "output.json").read_text())
        assert isinstance(out["text"], str) and isinstance(out["chunks"], list)
        for c in out["chunks"]:
            assert set(c) == {"text", "timestamp"} and c["timestamp"][0] <= c["timestamp"][1]
    doc = json.loads((data / "results.json").read_text())
    row = doc["rows"][0]
    assert row["samples"] == 4 and 0.0 <= row["tor"] <= 1.0 and row["wire"] == "chat"
    assert row["dataset"] == "kame-generated (seed 3)" and row["alignment"] == "arrival"
    assert row["asr"].startswith("faster-whisper")
    assert all(s["received_s"] > 0.8 * longest / 2 for s in row["per_sample"])  # audio came back all along
    assert "not shown" in (data / "results.md").read_text() and (data / "results.png").is_file()


def test_realtime_oracle_on_and_off(server: ServerProcess, generated: Path, tmp_path: Path) -> None:
    data = generated / "user_interruption"
    out = tmp_path / "cmp"
    rc = kame_main(["eval", "duplex", str(data), "--task", "user_interruption", "--server", server.http_url,
                    "--wire", "realtime", "--concurrency", "4", "--compare", "oracle", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert [r["variant"] for r in doc["rows"]] == ["oracle-off", "oracle-on"]
    assert doc["rows"][0]["settings"] == {"llm": False}

    def events(variant: str) -> list[dict]:
        evs = []
        for d in sorted((out / variant).iterdir()):
            assert (d / "interrupt.json").is_file() and (d / "input.wav").is_file() and (d / "output.json").is_file()
            evs += [json.loads(line) for line in (d / "events.jsonl").read_text().splitlines()]
        return evs

    off, on = events("oracle-off"), events("oracle-on")
    updated_off = [e for e in off if e["type"] == "session.updated"]
    assert updated_off and all(e["session"]["kame"]["llm"] is False for e in updated_off)
    assert not [e for e in off if e["type"].startswith("kame.oracle.") or e["type"].startswith("kame.backend.")]
    # with the oracle on, the scripted back-end answers the transcribed speech and its answer reaches Moshi
    assert [e for e in on if e["type"] == "kame.oracle.reset"]


def test_relevance_judge_and_cache(tmp_path: Path) -> None:
    llm = LlmServer(["judge"]).start()
    try:
        llm.push(Reply("No rating here."), Reply("The reply answers the time question. Rating: [[4]]"))

        async def go() -> tuple[dict, dict, int]:
            judge = Judge(JudgeConfig("judge", llm.base_url, None, backoff_s=0.0), {})
            try:
                rj = RelevanceJudge(judge, tmp_path)
                first = await rj.rate("tell me about bikes", "what time is it", "it is noon")
                again = await RelevanceJudge(judge, tmp_path).rate("tell me about bikes", "what time is it", "it is noon")
                return first, again, rj.asked
            finally:
                await judge.aclose()

        first, again, asked = asyncio.run(go())
        assert first["relevance"] == 4 and asked == 2  # the garbled judgement was asked again
        assert again == first and len(llm.chat_requests()) == 2  # cached: nothing asked the second time
        sent = llm.chat_requests()[0].body["messages"]
        assert "what time is it" in sent[-1]["content"] and "0 to 5" in sent[0]["content"]
    finally:
        llm.stop()


def test_refused_session_is_retried(browser_server: ServerProcess, generated: Path, tmp_path: Path) -> None:
    """One slot (tests/support/servers.py ``BROWSER``), two sessions at once (past the CLI's clamp to the free
    slots): the second is refused (1013) and tried again once the first is over; both samples are scored."""
    from kame.eval.duplex.client import Target
    from kame.eval.duplex.runner import DuplexConfig, Variant, run_duplex

    class Asr:
        name = "none"

        async def words_async(self, pcm: object, rate: int) -> list:
            return []

    said: list[str] = []
    data = tmp_path / "two"
    for name in ("001", "002"):
        src = generated / "smooth_turn_taking" / name
        (data / name).mkdir(parents=True)
        for f in ("input.wav", "turn_taking.json"):
            (data / name / f).write_bytes((src / f).read_bytes())
    cfg = DuplexConfig(task="smooth_turn_taking", data_dir=data, variants=[Variant("v")], dataset="t",
                       concurrency=2, target=Target.parse(browser_server.http_url), asr=Asr(), say=said.append)
    doc = asyncio.run(run_duplex(cfg, data))
    assert doc["skipped"] == [] and doc["rows"][0]["samples"] == 2, doc["skipped"]
    assert any("1013" in s or "full" in s for s in said), said
