"""The 8-bit behaviour check: step-by-step agreement of text tokens and of the speak/silence decision
(pure units; ``kame run --compare-weights bf16,int8`` itself runs in tests/test_quantized.py, with the
other tests that import bitsandbytes: its import costs seconds, once a worker)."""

from __future__ import annotations

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
