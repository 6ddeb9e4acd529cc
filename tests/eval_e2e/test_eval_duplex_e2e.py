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
from kame.eval.duplex.samples import read_wav, write_wav
from kame.eval.judge import Judge, JudgeConfig
from tests.support.duplex_sets import generate_set, make_v15_set, sample_dirs
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
    return generate_set(tmp_path_factory.mktemp("duplex-set"))


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAME_AUTH_TOKEN", raising=False)


def _frames(path: Path) -> tuple[int, int]:
    with wave.open(str(path)) as w:
        return w.getnframes(), w.getframerate()


def test_generated_set_is_reproducible(generated: Path, tmp_path: Path) -> None:
    """Sample n depends only on the seed (not on the count): the first two of a second, smaller set are the
    module's first two, byte for byte. Other tests of this file write their outputs into the module's sample
    folders (as the benchmark's clients do) and may run first on this worker: only inputs are compared."""
    assert kame_main(["eval", "duplex", str(tmp_path), "--generate", "--per-task", "2", "--seed", "3"]) == 0
    for task in ("pause_handling", "smooth_turn_taking", "user_interruption", "backchannel"):
        again = sample_dirs(tmp_path / task)
        assert [d.name for d in again] == ["001", "002"]
        for d in again:
            assert (d / "input.wav").read_bytes() == (generated / task / d.name / "input.wav").read_bytes()
            assert _frames(d / "input.wav")[1] == 16000
    voices = {json.loads((d / "meta.json").read_text())["voice"] for d in sample_dirs(generated / "backchannel")}
    rates = {json.loads((d / "meta.json").read_text())["wpm"] for t in ("pause_handling", "user_interruption")
             for d in sample_dirs(generated / t)}
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
    longest = max(_frames(d / "input.wav")[0] / 16000 for d in sample_dirs(data))
    assert wall < longest + 60, wall  # 4 at once: about one sample's length, plus ASR
    # the data folder holds its sample folders only; each gained exactly what the benchmark's inference and ASR
    # steps write (output.wav, output.json); kame's results are beside it, named for the run
    assert all(p.is_dir() for p in data.iterdir())
    for d in sample_dirs(data):
        assert sorted(p.name for p in d.iterdir()) == ["input.wav", "meta.json", "output.json", "output.wav",
                                                       "turn_taking.json"]
        n_in, _ = _frames(d / "input.wav")
        n_out, rate = _frames(d / "output.wav")
        assert rate == 24000 and abs(n_out / rate - n_in / 16000) < 1e-3
        out = json.loads((d / "output.json").read_text())
        assert isinstance(out["text"], str) and isinstance(out["chunks"], list)
        for c in out["chunks"]:
            assert set(c) == {"text", "timestamp"} and c["timestamp"][0] <= c["timestamp"][1]
    results = generated / "smooth_turn_taking.kame-oracle-on"
    doc = json.loads((results / "results.json").read_text())
    row = doc["rows"][0]
    assert row["samples"] == 4 and 0.0 <= row["tor"] <= 1.0 and row["wire"] == "chat"
    assert row["dataset"] == "kame-generated (seed 3)" and row["alignment"] == "arrival"
    assert row["asr"].startswith("faster-whisper")
    assert all(s["received_s"] > 0.8 * longest / 2 for s in row["per_sample"])  # audio came back all along
    assert "not shown" in (results / "results.md").read_text() and (results / "results.png").is_file()


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
            assert sorted(p.name for p in d.iterdir()) == ["input.wav", "interrupt.json", "output.json", "output.wav"]
            # the output's transcript starts where the benchmark's ASR step crops it: at the interruption's end
            end = json.loads((d / "interrupt.json").read_text())[0]["timestamp"][1]
            assert all(c["timestamp"][0] >= end for c in json.loads((d / "output.json").read_text())["chunks"])
            log = out / "events" / variant / f"{d.name}.jsonl"  # kame's own event log: with the results
            evs += [json.loads(line) for line in log.read_text().splitlines()]
        return evs

    off, on = events("oracle-off"), events("oracle-on")
    updated_off = [e for e in off if e["type"] == "session.updated"]
    assert updated_off and all(e["session"]["kame"]["llm"] is False for e in updated_off)
    assert not [e for e in off if e["type"].startswith("kame.oracle.") or e["type"].startswith("kame.backend.")]
    # with the oracle on, the scripted back-end answers the transcribed speech and its answer reaches Moshi
    assert [e for e in on if e["type"] == "kame.oracle.reset"]


def test_v15_both_runs_and_behaviour(server: ServerProcess, generated: Path, tmp_path: Path) -> None:
    """A v1.5 folder as the benchmark ships it: each sample runs twice (input.wav and clean_input.wav, both
    sessions at once), gains exactly the files its inference and ASR steps write, and is labelled by the
    judge through an OpenAI-compatible endpoint that answers for the benchmark's model name."""
    data = make_v15_set(generated, tmp_path / "v1.5" / "background_speech")
    llm = LlmServer(["gpt-4o-2024-08-06"]).start()
    try:
        llm.set_default(Reply('{"behaviour": ["C_RESUME"]}'))
        rc = kame_main(["eval", "duplex", str(data), "--task", "v1.5/background_speech", "--server", server.http_url,
                        "--concurrency", "4", "--judge-model", "gpt-4o-2024-08-06", "--judge-base-url", llm.base_url])
        sent = [r.body["messages"][-1]["content"] for r in llm.chat_requests()]
    finally:
        llm.stop()
    assert rc == 0
    for d in sample_dirs(data):
        assert sorted(p.name for p in d.iterdir()) == [
            "clean_input.json", "clean_input.wav", "clean_output.json", "clean_output.wav", "input.json",
            "input.wav", "metadata.json", "output.json", "output.wav"]
        for out, inp in (("output.wav", "input.wav"), ("clean_output.wav", "clean_input.wav")):
            n_out, rate = _frames(d / out)
            n_in, in_rate = _frames(d / inp)
            assert rate == 24000 and abs(n_out / rate - n_in / in_rate) < 1e-3
        for js in ("input.json", "clean_input.json", "output.json", "clean_output.json"):
            doc = json.loads((d / js).read_text())
            assert set(doc) == {"text", "chunks"}
        assert json.loads((d / "clean_input.json").read_text())["chunks"]  # the espeak question is heard
    doc = json.loads((tmp_path / "v1.5" / "background_speech.kame-oracle-on" / "results.json").read_text())
    row = doc["rows"][0]
    assert row["task"] == "v1.5/background_speech" and row["samples"] == 1 and row["labelled"] == 1
    assert row["behaviour"] == {"C_RESPOND": 0.0, "C_RESUME": 1.0, "C_UNCERTAIN_HANDLING": 0.0, "C_UNKNOWN": 0.0}
    assert len(sent) == 1 and all('"input_clean"' in m and '"output_noisy"' in m for m in sent)
    assert all(s["received_s"] > 1.0 and s["clean_received_s"] > 1.0 for s in row["per_sample"])


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
    slots): the second is refused (1013) and tried again once the first is over; both samples (cut to 2.5 s:
    their length is not what is tested) are scored."""
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
        pcm, rate = read_wav(src / "input.wav")
        write_wav(data / name / "input.wav", pcm[: round(2.5 * rate)], rate)
        (data / name / "turn_taking.json").write_bytes((src / "turn_taking.json").read_bytes())
    cfg = DuplexConfig(task="smooth_turn_taking", data_dir=data, variants=[Variant("v")], dataset="t",
                       concurrency=2, target=Target.parse(browser_server.http_url), asr=Asr(), say=said.append)
    doc = asyncio.run(run_duplex(cfg, tmp_path / "results"))
    assert doc["skipped"] == [] and doc["rows"][0]["samples"] == 2, doc["skipped"]
    assert any("1013" in s or "full" in s for s in said), said
