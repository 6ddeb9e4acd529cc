"""Full-Duplex-Bench v1 scoring on recorded outputs whose answers are known (no server, no ASR).

Each sample folder is written by hand: an ``input.wav`` at 16 kHz, the
task's label, an ``output.wav`` and an ``output.json`` with chosen word
times, so every TOR, latency and backchannel count below is known in
advance. ``kame eval duplex --score-only`` scores them through the CLI, as
it would score outputs recorded by any client; bad folders are skipped with
one sentence each.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kame.cli import main as kame_main
from kame.eval.duplex.align import align_output
from kame.eval.duplex.relevance import parse_relevance
from kame.eval.duplex.samples import Labels, SampleProblem, load_sample, write_wav
from kame.eval.duplex.scoring import (
    Span,
    after_interruption,
    backchannels,
    human_for,
    js_distance,
    score_backchannel,
    score_interruption,
    score_turn_taking,
    timing_histogram,
    took_over,
)
from kame.eval.duplex.words import Word, read_words, write_words

W = Word


def words(*spec: tuple[str, float, float]) -> list[Word]:
    return [Word(t, a, b) for t, a, b in spec]


def test_take_over_definition() -> None:
    assert not took_over([])
    assert not took_over(words(("yes", 0.0, 0.3), ("sure", 0.3, 0.6), ("okay", 0.6, 0.9)))  # 3 words, 0.9 s
    assert took_over(words(("a", 0.0, 0.1), ("b", 0.1, 0.2), ("c", 0.2, 0.3), ("d", 0.3, 0.4)))  # 4 words
    assert took_over(words(("hmm", 0.0, 0.5), ("right", 0.6, 1.0)))  # exactly 1 s
    assert not took_over(words(("hmm", 0.0, 0.5), ("right", 0.6, 0.99)))


def test_turn_taking_latency_and_negative_as_zero() -> None:
    lab = Labels(turn_end_s=2.0)
    late = score_turn_taking("s", words(("the", 2.7, 2.9), ("answer", 2.9, 3.5), ("is", 3.5, 3.8)), lab)
    assert late.take_over and late.latency_s == pytest.approx(0.7)
    early = score_turn_taking("s", words(("i", 1.5, 1.6), ("think", 1.6, 2.0), ("so", 2.0, 2.6)), lab)
    assert early.take_over and early.latency_s == 0.0
    none = score_turn_taking("s", words(("mm", 3.0, 3.2)), lab)
    assert not none.take_over and none.latency_s is None


def test_interruption_scores_only_words_after_its_end() -> None:
    lab = Labels(interrupt_start_s=4.0, interrupt_end_s=6.0, context="c", interrupt="i")
    ws = words(("talking", 1.0, 1.5), ("over", 1.5, 2.0), ("you", 4.5, 5.0), ("still", 5.0, 6.2),
               ("ok", 6.4, 6.6), ("tokyo", 6.6, 7.2), ("time", 7.2, 7.6))
    after = after_interruption(ws, 6.0)
    assert [w.text for w in after] == ["ok", "tokyo", "time"] and after[0].start_s == pytest.approx(0.4)
    sc = score_interruption("s", ws, lab)
    assert sc.take_over and sc.latency_s == pytest.approx(0.4) and sc.text == "ok tokyo time"
    # everything before the end: not a take-over, whatever was said
    assert not score_interruption("s", ws[:4], lab).take_over


def test_backchannel_rules_and_jsd() -> None:
    # two short segments (1 word each, < 1 s): backchannels, no take-over
    segs = [Span(1.0, 1.4), Span(5.0, 5.5)]
    ws = words(("mhm", 1.0, 1.3), ("yeah", 5.0, 5.4))
    tor, found = backchannels(segs, ws)
    assert not tor and found == segs
    # a segment over 3 s: take-over, counting stops there
    tor, found = backchannels([Span(1.0, 1.4), Span(2.0, 5.5), Span(7.0, 7.3)], ws)
    assert tor and found == [Span(1.0, 1.4)]
    # 4 words in a short segment: take-over (and still counted, as the scoring code does)
    tor, found = backchannels([Span(1.0, 1.9)], words(("a", 1.0, 1.2), ("b", 1.2, 1.4), ("c", 1.4, 1.6), ("d", 1.6, 1.8)))
    assert tor and len(found) == 1
    hist = timing_histogram(segs, 10.0)
    assert len(hist) == 51 and math.isclose(float(hist.sum()), 1.0)
    assert js_distance(hist, hist) == pytest.approx(0.0, abs=1e-6)
    p, q = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    assert js_distance(p, q) == pytest.approx(math.sqrt(math.log(2)))  # disjoint: the maximum (natural log)
    sc = score_backchannel("3", ws, segs, 10.0, {"2": list(hist)})  # folder 3 -> distribution "2"
    assert sc.extra["backchannels"] == 2 and sc.extra["frequency_hz"] == pytest.approx(0.2)
    assert sc.extra["jsd"] == pytest.approx(0.0, abs=1e-3)
    assert score_backchannel("1", [], [], 10.0, {"0": [1.0]}).extra["jsd"] == 1.0  # no backchannel: 1
    assert score_backchannel("1", ws, segs, 10.0, None).extra["jsd"] is None  # no human data: no JSD
    assert human_for("sample_7", {"6": [1.0], "0": [2.0]}) == [1.0] and human_for("x", {"0": [2.0]}) == [2.0]


def test_alignment_arrival_and_frame() -> None:
    a, b = np.full(1920, 0.1, np.float32), np.full(1920, 0.2, np.float32)
    arr = align_output([a, b], 1920 * 4, "arrival")
    assert np.all(arr[:1920] == 0) and np.all(arr[1920:3840] == np.float32(0.1)) and np.all(arr[5760:] == 0)
    fr = align_output([a, b], 1920 * 2 + 5, "frame")
    assert fr.size == 3845 and np.all(fr[:1920] == np.float32(0.1)) and np.all(fr[3840:] == 0)
    cut = align_output([a, b, b], 1920 * 2, "arrival")
    assert cut.size == 3840 and np.all(cut[1920:] == np.float32(0.1))


def test_relevance_rating_parse() -> None:
    assert parse_relevance("Analysis... Rating: [[4]]") == 4
    assert parse_relevance("[[2]] at first, then Rating: [[0]]") == 0
    assert parse_relevance("Rating: [[7]]") is None and parse_relevance("four") is None


# --------------------------------------------------------------------------- folders and the CLI


def _tone(seconds: float, rate: int, at: list[tuple[float, float]] | None = None) -> np.ndarray:
    """Silence with a 220 Hz tone (speech-loud) in the given spans."""
    x = np.zeros(round(seconds * rate), np.float32)
    for a, b in at or []:
        i, j = round(a * rate), round(b * rate)
        t = np.arange(j - i) / rate
        x[i:j] = 0.3 * np.sin(2 * np.pi * 220 * t)
    return x


def _sample(root: Path, name: str, label: tuple[str, Any] | None, out_words: list[Word] | None,
            seconds: float = 6.0, in_rate: int = 16000, out_pcm: np.ndarray | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    write_wav(d / "input.wav", _tone(seconds, in_rate, [(0.2, 1.5)]), in_rate)
    if label is not None:
        (d / label[0]).write_text(json.dumps(label[1]))
    if out_words is not None:
        write_words(d / "output.json", out_words)
        write_wav(d / "output.wav", _tone(seconds, 24000) if out_pcm is None else out_pcm, 24000)
    return d


def test_score_only_turn_taking_known_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "smooth_turn_taking"
    lab = ("turn_taking.json", [{"text": "q", "timestamp": [2.0, 6.0]}])
    _sample(root, "1", lab, words(("the", 2.5, 2.7), ("answer", 2.7, 3.2), ("is", 3.2, 3.4), ("four", 3.4, 3.9)))
    _sample(root, "2", lab, words(("sure", 2.0, 2.3), ("thing", 2.3, 3.3)))  # 1.3 s: take-over, latency 0
    _sample(root, "3", lab, words(("mm", 4.0, 4.2)))  # no take-over
    _sample(root, "4", lab, [])  # silent output: no take-over
    _sample(root, "6", lab, words(("x", 1.0, 2.0)), in_rate=48000)  # any input rate (48 kHz): take-over, latency 0
    # bad folders: each one sentence, skipped
    _sample(root, "5", None, words(("x", 1.0, 2.0)))  # missing label
    _sample(root, "7", lab, words(("x", 1.0, 2.0)), out_pcm=np.zeros(0, np.float32))  # empty output
    _sample(root, "8", lab, None)  # no output at all
    (root / "9").mkdir()  # empty folder
    before = sorted(p.name for p in root.iterdir())
    rc = kame_main(["eval", "duplex", str(root), "--task", "smooth_turn_taking", "--score-only"])
    assert rc == 0
    # kame's own files go beside the data folder, named for the run; the data folder gains nothing
    results = tmp_path / "smooth_turn_taking.kame-oracle-on"
    assert sorted(p.name for p in root.iterdir()) == before and all(p.is_dir() for p in root.iterdir())
    doc = json.loads((results / "results.json").read_text())
    row = doc["rows"][0]
    assert row["samples"] == 5 and row["tor"] == pytest.approx(0.6)
    assert row["latency_mean_s"] == pytest.approx(0.1667)  # (0.5 + 0 + 0) / 3
    per = {s["sample"]: s for s in row["per_sample"]}
    assert per["1"]["latency_s"] == pytest.approx(0.5) and per["2"]["latency_s"] == 0.0
    assert not per["3"]["take_over"] and not per["4"]["take_over"]
    assert per["6"]["take_over"] and per["6"]["latency_s"] == 0.0  # the 48 kHz input's sample, scored
    assert row["dataset"] == "smooth_turn_taking" and row["alignment"] == "arrival" and row["wire"] == "recorded"
    skipped = doc["skipped"]
    assert len(skipped) == 4, skipped
    text = "\n".join(skipped)
    for needle in ("sample 5: no turn_taking.json", "sample 7: output.wav is empty",
                   "sample 8: no output.json", "sample 9: no input.wav"):
        assert needle in text
    assert all(s.count(".") <= 1 and "\n" not in s for s in skipped)
    md = (results / "results.md").read_text()
    assert "| smooth_turn_taking | smooth_turn_taking |" in md and "not shown" in md and "Moshi" not in md
    assert (results / "results.png").stat().st_size > 5000
    out = capsys.readouterr().out
    assert "sample 7: output.wav is empty" in out


def test_published_figures_only_beside_released_data(tmp_path: Path) -> None:
    root = tmp_path / "candor_turn_taking"
    lab = ("turn_taking.json", [{"timestamp": [2.0, 6.0]}])
    _sample(root, "1", lab, words(("yes", 2.1, 3.5)))
    assert kame_main(["eval", "duplex", str(root), "--task", "smooth_turn_taking", "--score-only",
                      "--dataset", "released-v1-candor", "--results", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "results.md").read_text()
    assert "| Moshi | 0.985 / 0.980 | 0.941 | 0.265 s | 1.000 | 0.765 | 0.257 s |" in md
    assert "| PersonaPlex |" in md and "released-v1-candor" in md


def test_interruption_and_backchannel_folders(tmp_path: Path) -> None:
    root = tmp_path / "user_interruption"
    lab = ("interrupt.json", [{"context": "tell me about bikes", "interrupt": "what time is it", "timestamp": [3.0, 4.0]}])
    _sample(root, "1", lab, words(("bikes", 1.0, 1.5), ("were", 1.5, 2.0), ("invented", 2.0, 2.8),
                                  ("it", 4.3, 4.5), ("is", 4.5, 4.7), ("noon", 4.7, 5.4)))
    _sample(root, "2", lab, words(("bikes", 1.0, 1.5), ("were", 1.5, 2.0), ("invented", 2.0, 3.5)))
    assert kame_main(["eval", "duplex", str(root), "--task", "user_interruption", "--score-only",
                      "--results", str(tmp_path / "ri")]) == 0
    row = json.loads((tmp_path / "ri" / "results.json").read_text())["rows"][0]
    assert row["tor"] == 0.5 and row["latency_mean_s"] == pytest.approx(0.3)
    assert row["per_sample"][0]["text"] == "it is noon"
    bc = tmp_path / "backchannel"
    d = bc / "1"
    d.mkdir(parents=True)
    write_wav(d / "input.wav", _tone(10.0, 16000, [(0.5, 9.5)]), 16000)
    write_wav(d / "output.wav", _tone(10.0, 24000, [(2.0, 2.5), (6.0, 6.6)]), 24000)
    write_words(d / "output.json", words(("mhm", 2.0, 2.4), ("yeah", 6.0, 6.5)))
    human = tmp_path / "human.json"
    human.write_text(json.dumps({"0": [0.0] * 10 + [1.0] * 3 + [0.0] * 37}))
    assert kame_main(["eval", "duplex", str(bc), "--task", "backchannel", "--score-only",
                      "--human-timing", str(human), "--vad", "energy", "--results", str(tmp_path / "rb")]) == 0
    row = json.loads((tmp_path / "rb" / "results.json").read_text())["rows"][0]
    s = row["per_sample"][0]
    assert row["tor"] == 0.0 and s["backchannels"] == 2 and s["frequency_hz"] == pytest.approx(0.2)
    assert 0.0 < s["jsd"] < 1.0


def test_words_round_trip_and_null_end(tmp_path: Path) -> None:
    p = tmp_path / "output.json"
    p.write_text(json.dumps({"text": "a b", "chunks": [{"text": "a", "timestamp": [0.5, 0.9]},
                                                       {"text": "b", "timestamp": [1.0, None]}]}))
    assert read_words(p) == [Word("a", 0.5, 0.9), Word("b", 1.0, 1.0)]
    with pytest.raises(SampleProblem, match="no input.wav"):
        load_sample(tmp_path, "pause_handling")


# --------------------------------------------------------------------------- v1.5, results folder, kept outputs


def test_v15_timing_definitions() -> None:
    from kame.eval.duplex.overlap import merge, response_intervals, stop_intervals, timing

    assert merge([Span(0.0, 1.0), Span(1.5, 2.0), Span(3.0, 4.0)], 0.6) == [Span(0.0, 2.0), Span(3.0, 4.0)]
    user, model = [Span(0.5, 3.0), Span(7.0, 8.0)], [Span(2.0, 3.5), Span(5.0, 6.0), Span(7.5, 9.0)]
    assert stop_intervals(user, model) == [Span(2.0, 3.0), Span(7.5, 8.0)]  # both speaking
    assert response_intervals(user, model) == [Span(3.0, 5.0)]  # 8.0: no model start after it
    # two user stretches before one model start: the later end counts
    assert response_intervals([Span(0.0, 1.0), Span(2.0, 3.0)], [Span(4.0, 5.0)]) == [Span(3.0, 4.0)]
    t = timing(user, model)
    assert t["stop_latency_s"] == pytest.approx(0.75) and t["response_latency_s"] == pytest.approx(2.0)
    assert timing([Span(0.0, 1.0)], [])["stop_latency_s"] is None


def test_v15_score_only_with_behaviour_judge(tmp_path: Path) -> None:
    """A v1.5 folder whose outputs were recorded by any client: timing from the audio (energy VAD), the
    behaviour from the judge; a garbled judgement is asked again, at most twice more, then marked."""
    from tests.support.llm_server import LlmServer, Reply

    root = tmp_path / "v1.5" / "user_interruption"
    for name in ("1", "2"):
        d = root / name
        d.mkdir(parents=True)
        write_wav(d / "input.wav", _tone(8.0, 16000, [(0.5, 3.0)]), 16000)
        write_wav(d / "clean_input.wav", _tone(8.0, 16000, [(0.5, 2.0)]), 16000)
        write_wav(d / "output.wav", _tone(8.0, 24000, [(2.0, 3.5), (5.0, 6.0)]), 24000)
        write_wav(d / "clean_output.wav", _tone(8.0, 24000, [(3.0, 4.0)]), 24000)
        (d / "metadata.json").write_text(json.dumps({"context_text": "c", "current_turn_text": "t",
                                                     "timestamps": [2.0, 3.0]}))
        write_words(d / "input.json", words(("tell", 0.5, 1.0), ("me", 2.0, 3.0)))
        write_words(d / "clean_input.json", words(("tell", 0.5, 1.0)))
        write_words(d / "output.json", words(("sure", 5.0, 5.5)))
        write_words(d / "clean_output.json", words(("ok", 3.0, 3.5)))
    write_words(root / "2" / "output.json", words(("what", 5.0, 5.5)))  # the two samples ask differently
    llm = LlmServer(["j"]).start()
    try:
        llm.push(Reply("I think C_RESPOND."), Reply('{"behaviour": ["C_RESPOND"]}'))
        llm.set_default(Reply("no idea"))
        rc = kame_main(["eval", "duplex", str(root), "--task", "v1.5/user_interruption", "--score-only", "--vad",
                        "energy", "--judge-model", "j", "--judge-base-url", llm.base_url, "--concurrency", "1"])
        asked = len(llm.chat_requests())
    finally:
        llm.stop()
    assert rc == 0 and asked == 2 + 3  # sample 1: garbled then labelled; sample 2: three garbled answers
    results = root.parent / "user_interruption.kame-oracle-on"
    doc = json.loads((results / "results.json").read_text())
    row = doc["rows"][0]
    assert row["task"] == "v1.5/user_interruption" and row["samples"] == 2 and row["labelled"] == 1
    assert row["behaviour"]["C_RESPOND"] == 1.0
    per = {s["sample"]: s for s in row["per_sample"]}
    assert per["1"]["behaviour"] == "C_RESPOND" and per["2"]["behaviour"] is None and per["2"]["judge_error"]
    assert per["1"]["stop_latency_s"] == pytest.approx(1.0, abs=0.35)  # [2.0, 3.0] both speaking
    assert per["1"]["response_latency_s"] == pytest.approx(2.0, abs=0.35)  # 3.0 -> 5.0
    md = (results / "results.md").read_text()
    assert "| v1.5/user_interruption |" in md and "respond" in md and "Full-Duplex-Bench v1.5" in md
    assert (results / "behaviour_cache.json").is_file() and not (root / "1" / "content_tag.json").exists()


def test_v15_labels_and_layout_rules(tmp_path: Path) -> None:
    d = tmp_path / "7"
    d.mkdir()
    write_wav(d / "input.wav", _tone(2.0, 16000, [(0.2, 1.0)]), 16000)
    (d / "metadata.json").write_text(json.dumps({"context_text": "c", "current_turn_text": "t", "timestamps": [1, 2]}))
    with pytest.raises(SampleProblem, match="sample 7: no clean_input.wav"):
        load_sample(d, "v1.5/background_speech")
    write_wav(d / "clean_input.wav", _tone(2.0, 16000, [(0.2, 1.0)]), 16000)
    s = load_sample(d, "v1.5/background_speech")
    assert s.labels.overlap_start_s == 1.0 and s.labels.overlap_end_s == 2.0 and s.labels.interrupt == "t"
    (d / "metadata.json").write_text(json.dumps({"context_text": "c"}))
    with pytest.raises(SampleProblem, match="metadata.json is unusable"):
        load_sample(d, "v1.5/background_speech")
    # v1's interruption label is interrupt.json, v1.5's metadata.json: the two tasks never mix
    with pytest.raises(SampleProblem, match="no interrupt.json"):
        load_sample(d, "user_interruption")


def test_results_never_inside_the_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "pause"
    _sample(root, "1", ("pause.json", []), words(("a", 1.0, 1.2)))
    for bad in (root, root / "r"):
        assert kame_main(["eval", "duplex", str(root), "--task", "pause_handling", "--score-only",
                          "--results", str(bad)]) == 2
        assert "inside the data folder" in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == ["1"]


def test_existing_output_kept_unless_overwrite(tmp_path: Path) -> None:
    """An output.wav already there is not recorded again (no session: the server below does not exist) and
    gets its transcript; with ``overwrite`` the sample is run again (and here fails to connect)."""
    import asyncio

    from kame.eval.duplex.client import Target
    from kame.eval.duplex.runner import DuplexConfig, Variant, run_duplex

    class Asr:
        name = "fixed"
        calls: list[float] = []

        async def words_async(self, pcm: np.ndarray, rate: int) -> list[Word]:
            self.calls.append(pcm.size / rate)
            return [Word("hello", 0.5, 0.9)]

    root = tmp_path / "user_interruption"
    lab = ("interrupt.json", [{"context": "c", "interrupt": "i", "timestamp": [3.0, 4.0]}])
    d = _sample(root, "1", lab, None)
    write_wav(d / "output.wav", _tone(6.0, 24000, [(4.5, 5.5)]), 24000)
    before = (d / "output.wav").read_bytes()
    said: list[str] = []

    def cfg(overwrite: bool) -> DuplexConfig:
        return DuplexConfig(task="user_interruption", data_dir=root, variants=[Variant("v")], dataset="t",
                            target=Target.parse("http://127.0.0.1:9"), asr=Asr(), say=said.append,
                            overwrite=overwrite, retries=0)

    doc = asyncio.run(run_duplex(cfg(False), tmp_path / "r1"))
    assert (d / "output.wav").read_bytes() == before and doc["rows"][0]["per_sample"][0]["kept"] is True
    # the benchmark's ASR step for this task: the output from the interruption's end, times on the input's clock
    assert Asr.calls == [pytest.approx(2.0)] and read_words(d / "output.json") == [Word("hello", 4.5, 4.9)]
    doc = asyncio.run(run_duplex(cfg(True), tmp_path / "r2"))
    assert doc["rows"][0]["samples"] == 0 and "cannot connect" in doc["skipped"][0]
    assert (d / "output.wav").read_bytes() == before
