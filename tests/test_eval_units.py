"""kame eval, the pure parts: data, judge prompts and ratings, VAD latency, timeline, results, summary, sweep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kame.audio.media import SAMPLE_RATE
from kame.errors import UserError
from kame.eval import judge as judge_mod
from kame.eval.questions import Question, load_judge_prompts, load_questions
from kame.eval.results import ResultsFile, check_run_file
from kame.eval.summary import build_summary, render_markdown, write_summary
from kame.eval.sweep import parse_sweep, write_sweep
from kame.eval.timeline import SessionTimeline
from kame.eval.tts import make_tts
from kame.eval.vad import (
    Segment,
    SpeechTracker,
    VadConfig,
    speech_segments,
    turn_latency,
)

RATE = SAMPLE_RATE
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- data


def test_bundled_questions_are_the_30_of_the_paper_with_attribution() -> None:
    qs = load_questions()
    assert len(qs) == 30
    assert {q.category for q in qs} == {"reasoning", "stem", "humanities"}
    assert sum(q.category == "reasoning" for q in qs) == 10
    assert all(len(q.turns) == 2 for q in qs)
    assert [q.question_id for q in load_questions(limit=3)] == [101, 102, 103]
    notice = (REPO / "kame/data/mt_bench/NOTICE.md").read_text()
    assert "FastChat" in notice and "Apache" in notice
    assert (REPO / "kame/data/mt_bench/LICENSE-Apache-2.0.txt").read_text().lstrip().startswith("Apache License")
    for src in (REPO / "kame/eval").glob("*.py"):
        assert "shared/" not in src.read_text(), f"{src} must not read ../shared"


def test_question_file_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_questions(tmp_path / "nope.jsonl")
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "category": "stem", "turns": []}\n')
    with pytest.raises(UserError, match="turns"):
        load_questions(bad)
    bad.write_text('{"question_id": 1, "category": "stem", "turns": ["a"]}\n{"question_id": 1, "category": "stem", "turns": ["b"]}\n')
    with pytest.raises(UserError, match="duplicate"):
        load_questions(bad)
    with pytest.raises(UserError, match="limit"):
        load_questions(limit=0)


# --------------------------------------------------------------------------- judge prompts and ratings


@pytest.mark.parametrize(
    ("category", "turn", "has_ref", "expected"),
    [
        ("reasoning", 1, True, "single-math-v1"),
        ("reasoning", 2, True, "single-math-v1-multi-turn"),
        ("math", 1, True, "single-math-v1"),
        ("coding", 2, True, "single-math-v1-multi-turn"),
        ("stem", 1, True, "single-v1"),  # a reference exists, MT-Bench does not use it for STEM
        ("stem", 2, True, "single-v1-multi-turn"),
        ("humanities", 1, False, "single-v1"),
        ("humanities", 2, False, "single-v1-multi-turn"),
        ("math", 1, False, "single-v1"),  # guided category without a reference: general prompt
    ],
)
def test_judge_prompt_by_category_and_turn(category: str, turn: int, has_ref: bool, expected: str) -> None:
    assert judge_mod.prompt_name(category, turn, has_ref) == expected


def test_judge_messages_use_the_reference_only_where_mt_bench_does() -> None:
    prompts = load_judge_prompts()
    qs = {q.question_id: q for q in load_questions()}
    reasoning, stem = qs[104], qs[142]
    assert stem.reference  # STEM question with a reference answer
    m1 = judge_mod.build_messages(prompts["single-math-v1"], reasoning, 1, ["He has none."])
    assert reasoning.reference and reasoning.reference[0] in m1[1]["content"]
    assert "He has none." in m1[1]["content"] and reasoning.turns[0] in m1[1]["content"]
    m2 = judge_mod.build_messages(prompts["single-math-v1-multi-turn"], reasoning, 2, ["A {x}", "B"])
    body = m2[1]["content"]
    assert reasoning.reference[1] in body and reasoning.turns[1] in body and "A {x}" in body
    assert m2[0]["content"].startswith("Please act as an impartial judge")
    name = judge_mod.prompt_name(stem.category, 1, bool(stem.reference))
    m3 = judge_mod.build_messages(prompts[name], stem, 1, ["an answer"])
    assert stem.reference[0] not in m3[1]["content"]
    assert m3[0]["content"] == "You are a helpful assistant."


@pytest.mark.parametrize(
    ("text", "rating"),
    [
        ("The answer is right. Rating: [[7]]", 7.0),
        ("Rating: [[8.5]]", 8.5),
        ("Rating: [ 6 ]", 6.0),  # MT-Bench's single-bracket fallback
        ("[3] is a citation... final: [[9]]", 9.0),  # double brackets win
        ("Rating: [[10]]", 10.0),
        ("I cannot rate this.", None),
        ("Rating: [[11]]", None),
        ("Rating: [[0]]", None),
        ("Rating: [[seven]]", None),
        ("", None),
    ],
)
def test_rating_parsing(text: str, rating: float | None) -> None:
    assert judge_mod.parse_rating(text) == rating


# --------------------------------------------------------------------------- VAD and latency


def _tone_burst(seconds: float, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    x = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 700, 1100), 1))
    return (amp * x / np.max(np.abs(x))).astype(np.float32)


def _place(total_s: float, parts: list[tuple[float, np.ndarray]]) -> np.ndarray:
    out = np.zeros(int(total_s * RATE), np.float32)
    for at, pcm in parts:
        i = int(at * RATE)
        out[i : i + len(pcm)] += pcm
    return out


def test_energy_vad_finds_known_onsets_and_merges_short_pauses() -> None:
    x = _place(6.0, [(1.0, _tone_burst(1.0)), (2.15, _tone_burst(0.5)), (4.0, _tone_burst(0.04)), (4.5, _tone_burst(0.6))])
    segs = speech_segments(x, VadConfig(kind="energy"))
    # 1.0-2.0 and 2.15-2.65 merge (150 ms pause < 300 ms hangover); the 40 ms click is not speech
    assert len(segs) == 2
    assert segs[0].start_s == pytest.approx(1.0, abs=0.031) and segs[0].end_s == pytest.approx(2.65, abs=0.031)
    assert segs[1].start_s == pytest.approx(4.5, abs=0.031) and segs[1].end_s == pytest.approx(5.1, abs=0.031)
    quiet = _place(3.0, [(1.0, _tone_burst(1.0, amp=0.004))])  # about -52 dBFS RMS: below the threshold
    assert speech_segments(quiet, VadConfig(kind="energy")) == []


def test_webrtc_vad_on_speech_matches_the_known_placement() -> None:
    speech = make_tts("espeak").synthesize("How many brothers does David have")
    lead = int(np.argmax(np.abs(speech) > 0.01)) / RATE  # espeak's own leading silence
    x = _place(1.5 + len(speech) / RATE + 1.0, [(1.5, speech)])
    segs = speech_segments(x)
    assert segs and segs[0].start_s == pytest.approx(1.5 + lead, abs=0.07)
    end = 1.5 + (len(speech) - int(np.argmax(np.abs(speech[::-1]) > 0.01))) / RATE
    assert segs[-1].end_s == pytest.approx(end, abs=0.1)
    assert speech_segments(np.zeros(RATE * 2, np.float32)) == []


def test_streaming_tracker_agrees_with_offline_segmentation() -> None:
    x = _place(5.0, [(0.5, _tone_burst(1.2)), (3.0, _tone_burst(1.0))])
    for kind in ("energy", "webrtc"):
        cfg = VadConfig(kind=kind)  # type: ignore[arg-type]
        tr = SpeechTracker(cfg)
        for i in range(0, len(x), 1000):
            tr.push(x[i : i + 1000])
            if i == 30_000:  # inside the first burst
                assert tr.in_speech and tr.open_start_s is not None
        assert tr.finish() == speech_segments(x, cfg)


def test_latency_positive_negative_and_carry_over() -> None:
    cfg = VadConfig(kind="energy")
    user = _place(10.0, [(1.0, _tone_burst(2.0))])  # user speaks 1.0-3.0
    # the assistant answers 0.6 s after the user ended
    late = _place(10.0, [(3.6, _tone_burst(1.5))])
    lat = turn_latency(speech_segments(user, cfg), speech_segments(late, cfg), 0.0, 10.0)
    assert lat.user_end_s == pytest.approx(3.0, abs=0.031)
    assert lat.latency_s == pytest.approx(0.6, abs=0.061)
    # it starts 0.5 s before the user ended (full duplex): negative latency
    early = _place(10.0, [(2.5, _tone_burst(2.0))])
    lat = turn_latency(speech_segments(user, cfg), speech_segments(early, cfg), 0.0, 10.0)
    assert lat.latency_s == pytest.approx(-0.5, abs=0.061)
    # a greeting running when the user starts is not the answer
    greet = _place(10.0, [(0.2, _tone_burst(1.0)), (3.3, _tone_burst(1.0))])
    lat = turn_latency(speech_segments(user, cfg), speech_segments(greet, cfg), 0.0, 10.0)
    assert lat.assistant_start_s == pytest.approx(3.3, abs=0.031) and lat.latency_s == pytest.approx(0.3, abs=0.061)
    # no answer within the window
    lat = turn_latency(speech_segments(user, cfg), [Segment(8.0, 9.0)], 0.0, 7.0)
    assert lat.latency_s is None and "did not start" in lat.note
    assert turn_latency([], [], 0.0, 5.0).note == "no user speech found in the turn"


# --------------------------------------------------------------------------- timeline


def test_timeline_places_assistant_audio_as_a_player_hears_it() -> None:
    tl = SessionTimeline()
    one = np.full(1920, 0.5, np.float32)
    assert tl.add_user(np.ones(4800, np.float32)) == 0.0
    assert tl.add_user(np.ones(4800, np.float32)) == pytest.approx(0.2)
    tl.add_assistant(one, 0.1)  # plays 0.1-0.18
    tl.add_assistant(one, 0.12)  # arrived while the first plays: right after it, 0.18-0.26
    tl.add_assistant(one, 0.33)  # 70 ms late: the jitter buffer hides it, 0.26-0.34
    written = tl.add_assistant(one, 0.5)  # 160 ms late: a stall, 0.34-0.5 is a gap
    assert len(written) == int(0.5 * RATE) - int(0.34 * RATE) + 1920
    st = tl.stereo()
    assert st.shape[1] == 2 and len(st) == int(0.5 * RATE) + 1920
    a = st[:, 1]
    assert a[int(0.1 * RATE)] == 0.5 and a[int(0.25 * RATE)] == 0.5 and a[int(0.3 * RATE)] == 0.5
    assert a[int(0.4 * RATE)] == 0.0 and a[int(0.55 * RATE)] == 0.5
    assert tl.late_chunks == 1
    part = tl.stereo(0.2, 0.3)
    assert len(part) == int(0.1 * RATE) and part[0, 0] == 1.0


# --------------------------------------------------------------------------- results and resume


def _row(qid: int, turn: int, cat: str = "reasoning", score: float | None = 5.0, lat: float | None = 0.2) -> dict:
    return {"question_id": qid, "category": cat, "turn": turn, "score": score, "latency_s": lat}


def test_resume_bookkeeping(tmp_path: Path) -> None:
    rf = ResultsFile(tmp_path)
    assert rf.load() == [] and rf.finished({"1": 2}) == set()
    rf.append([_row(1, 1), _row(1, 2)])
    rf.append([_row(2, 1)])  # only one of two turns: not finished
    with open(rf.path, "a") as f:
        f.write('{"question_id": 3, "turn"')  # torn last line of an interrupted run
    assert rf.finished({"1": 2, "2": 2, "3": 2}) == {"1"}
    assert rf.path.read_text().endswith("}\n")  # the torn line is cut off
    rf.append([_row(3, 1), _row(3, 2)])
    assert rf.finished({"1": 2, "2": 2, "3": 2}) == {"1", "3"}
    assert len(rf.load()) == 5
    check_run_file(tmp_path, {"tts": "espeak", "settings": {"oracle_delay_s": 0.0}})
    check_run_file(tmp_path, {"tts": "espeak", "settings": {"oracle_delay_s": 0.0}})
    with pytest.raises(UserError, match="other settings.*settings"):
        check_run_file(tmp_path, {"tts": "espeak", "settings": {"oracle_delay_s": 1.0}})


# --------------------------------------------------------------------------- summary


def test_summary_layout_and_markdown(tmp_path: Path) -> None:
    rows = [
        _row(101, 1, "reasoning", 4.0, -0.3), _row(101, 2, "reasoning", 6.0, 0.1),
        _row(141, 1, "stem", 8.0, 0.2), _row(141, 2, "stem", None, None),
        _row(151, 1, "humanities", 7.0, 1.0), _row(151, 2, "humanities", 9.0, 0.4),
    ]
    s = build_summary(rows, config={"server": "ws://x", "score_from": "text"}, versions={"local": {"kame": "0.1"}},
                      judge="gpt-4", wall={"wall_s": 10.0, "audio_s": 19.0, "concurrency": 2, "ideal_s": 9.5,
                                            "overhead_pct": 5.3})
    sc = s["scores"]
    assert sc["by_category"] == {"reasoning": 5.0, "stem": 8.0, "humanities": 8.0}
    assert sc["overall"] == pytest.approx(7.0) and sc["overall_all_turns"] == pytest.approx(6.8)
    assert sc["unscored"] == 1 and "unscored" in sc["note"]
    assert sc["by_category_turn"]["reasoning"] == {"turn1": 4.0, "turn2": 6.0}
    lat = s["latency"]
    assert lat["median_s"] == pytest.approx(0.2) and lat["p90_s"] == pytest.approx(0.76) and lat["missing"] == 1
    assert lat["negative_share"] == pytest.approx(0.2)
    md = render_markdown(s)
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table[0] == "| system | reasoning | STEM | humanities | avg | median latency |"
    assert table[2] == "| Moshi (published) | 1.32 | 1.94 | 2.88 | 2.05 | ~0 s |"
    assert table[3].startswith("| KAME + GPT-4.1 (published) | 5.44 | 6.65 | 7.19 | 6.43")
    assert table[5].startswith("| Unmute (cascade, GPT-4.1) (published) | 7.08 | 8.35 | 7.67 | 7.70 | 2.1 s")
    assert table[6] == "| **this run** | 5.00 | 8.00 | 8.00 | 7.00 | 0.20 s |"
    write_summary(tmp_path, s)
    assert json.loads((tmp_path / "summary.json").read_text())["scores"]["overall"] == pytest.approx(7.0)
    none = build_summary([_row(1, 1, score=None)], config={}, versions={}, judge=None)
    assert none["scores"]["overall"] is None and "no judge configured" in none["scores"]["note"]
    assert "| **this run** | – | – | – | – | 0.20 s |" in render_markdown(none)
    assert "no judge configured" in render_markdown(none)


# --------------------------------------------------------------------------- sweep


def test_sweep_parsing() -> None:
    sw = parse_sweep("oracle_delay_s=0,0.5,1,2")
    assert sw.key == "oracle_delay_s" and [p.value for p in sw.points] == [0.0, 0.5, 1.0, 2.0]
    assert [p.dirname for p in sw.points][1] == "oracle_delay_s=0.5"
    pol = parse_sweep("oracle_policy=reset,keep_if_same_start,freeze_when_speaking")
    assert [p.value for p in pol.points] == ["reset", "keep_if_same_start", "freeze_when_speaking"]
    for bad, msg in [
        ("oracle_delay_s", "KEY=V1"),
        ("nope=1,2", "unknown key"),
        ("oracle_delay_s=0,11", "within"),
        ("oracle_delay_s=0,x", "oracle_delay_s=x"),
        ("oracle_policy=reset,maybe", "expected one of"),
        ("oracle_delay_s=1,1", "repeated"),
        ("oracle_delay_s=1,,2", "empty"),
        ("text_topk=0", "within"),
    ]:
        with pytest.raises(UserError, match=msg):
            parse_sweep(bad)


def test_sweep_outputs(tmp_path: Path) -> None:
    sw = parse_sweep("oracle_delay_s=0,1")
    s0 = build_summary([_row(1, 1, score=6.0, lat=-0.1), _row(1, 2, score=7.0, lat=0.1)], config={}, versions={}, judge="j")
    s1 = build_summary([_row(1, 1, score=5.0, lat=0.8), _row(1, 2, score=5.0, lat=1.2)], config={}, versions={}, judge="j")
    rows = write_sweep(tmp_path, sw, {"oracle_delay_s=0": s0, "oracle_delay_s=1": s1})
    assert [r["value"] for r in rows] == [0.0, 1.0] and rows[1]["score"] == 5.0
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert data["key"] == "oracle_delay_s" and data["points"][0]["latency_median_s"] == pytest.approx(0.0)
    md = (tmp_path / "sweep.md").read_text()
    assert "| `0` | 6.50 |" in md and "| `1` | 5.00 |" in md
    png = (tmp_path / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # without a judge the plot still appears
    write_sweep(tmp_path, sw, {"oracle_delay_s=0": build_summary([_row(1, 1, score=None)], config={}, versions={}, judge=None)})
    assert (tmp_path / "sweep.png").stat().st_size > 1000


# --------------------------------------------------------------------------- tts


def test_tts_specs_and_output_format() -> None:
    tts = make_tts("espeak")
    pcm = tts.synthesize("Hello there.\n* A list item.")
    assert pcm.dtype == np.float32 and pcm.ndim == 1 and 0.8 < len(pcm) / RATE < 4 and np.abs(pcm).max() > 0.1
    assert make_tts("espeak:en-gb:200").name == "espeak:en-gb:200"
    cmd = make_tts("command:espeak-ng --stdin --stdout")
    assert abs(len(cmd.synthesize("Hello there.")) / RATE - len(tts.synthesize("Hello there.")) / RATE) < 0.3
    for bad, msg in [("festival", "unknown engine"), ("espeak:en:fast", "integer"), ("command:", "needs a program")]:
        with pytest.raises(UserError, match=msg):
            make_tts(bad)
    with pytest.raises(UserError, match="not found"):
        make_tts("command:/nonexistent/tts").synthesize("x")


def test_espeak_is_reproducible_for_a_user_who_never_ran_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A breathy voice (``+f3``) spoken for a user with no PulseAudio state yet (a new machine, a new container)
    equals the same words spoken again: PulseAudio's first run draws its runtime directory's name from
    ``rand()``, espeak-ng's breath noise from the same sequence (kame.eval.tts.espeak_env). Without the
    private ``PULSE_RUNTIME_PATH`` the first run differs by a least significant bit here and there."""
    words = "The thing I never understood about trains is"
    runs = []
    for n in range(2):
        home = tmp_path / f"home{n}"  # a new user each time: the first-run path twice
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
        first = make_tts("espeak:en-us+f3:140").synthesize(words)
        again = make_tts("espeak:en-us+f3:140").synthesize(words)
        runs += [first.tobytes(), again.tobytes()]
    assert len(set(runs)) == 1
    assert not list((tmp_path / "home0").rglob("*runtime"))  # PulseAudio wrote nothing into the user's home


def test_question_key() -> None:
    assert Question(101, "reasoning", ("a", "b")).key == "101"
