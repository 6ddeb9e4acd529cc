"""The 8-bit behaviour check: step-by-step agreement of text tokens and of the speak/silence decision
(pure units), and ``kame run --compare-weights bf16,int8`` through the real loader on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kame.frontend.agreement import agreement, speaking

PAD, EPAD = 3, 0


def test_speaking_lasts_idle_steps_after_the_last_piece() -> None:
    trace = [None, PAD, 50, PAD, PAD, PAD, EPAD, 51, PAD, PAD]
    assert speaking(trace, idle_steps=3) == [False, False, True, True, True, False, False, True, True, True]
    assert speaking([-2, -1, PAD], idle_steps=1) == [False, False, False]  # moshi's markers carry no text
    with pytest.raises(ValueError):
        speaking(trace, idle_steps=0)


def test_agreement_counts_text_and_speak_separately() -> None:
    a = [None, PAD, 50, 60, PAD, PAD, PAD, PAD]
    b = [None, PAD, 51, 60, PAD, PAD, 70, PAD, PAD]  # other words, and speaks again at step 6
    got = agreement(a, b, idle_steps=2)
    assert got.steps == 8 and got.lengths == (8, 9)
    assert got.text_same == 6 and got.first_text_difference == 2
    # speak a: F F T T T F F F ; speak b: F F T T T F T T
    assert got.speak_same == 6 and got.first_speak_difference == 6
    assert (got.speaking_a, got.speaking_b) == (3, 5)
    assert got.to_json()["text_rate"] == 0.75 and got.to_json()["speak_rate"] == 0.75
    same = agreement(a, list(a))
    assert same.text_rate == same.speak_rate == 1.0 and same.first_text_difference is None
    assert "never" in same.summary("bf16", "int8") and agreement([], []).text_rate == 1.0


def test_compare_weights_names_two_settings() -> None:
    from kame.commands.run import parse_compare
    from kame.errors import UserError

    assert parse_compare("bf16, int8") == ("bf16", "int8")
    for bad in ("bf16,fp8", "int8", "bf16,int8,bf16"):
        with pytest.raises(UserError, match="expected two of bf16, int8"):
            parse_compare(bad)


def test_kame_run_compares_weights(tiny_kame_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real CLI entry point, in this process (a subprocess would only add its imports' seconds)."""
    from kame.audio.files import read_audio, write_wav
    from kame.cli import main

    wav, out, report = tmp_path / "in.wav", tmp_path / "out.wav", tmp_path / "agreement.json"
    write_wav(wav, (0.1 * np.random.default_rng(3).standard_normal(24000)).astype(np.float32))
    code = main(["run", "--checkpoint", str(tiny_kame_ckpt), "--input", str(wav), "--output", str(out),
                 "--compare-weights", "bf16,int8", "--compare-out", str(report), "--seed", "4",
                 "--oracle", "The capital of France is Paris.@0.2"])
    stdout = capsys.readouterr().out
    assert code == 0
    got = json.loads(report.read_text())
    a, b = got["text_ids"]["a"], got["text_ids"]["b"]
    assert got["loaded"] == ["bf16", "int8"] and len(a) == len(b) == got["agreement"]["steps"] == 13
    assert got["agreement"] == agreement(a, b).to_json()  # the CLI's figure is the pure function's
    assert "text tokens agree" in stdout and "speak/silence agrees" in stdout
    assert read_audio(out).size == 24000
