"""How closely two runs of one input agree, step by step: the figure to compare before switching weights.

An 8-bit model can keep its words and still lose its turn-taking (fp8 with
greedy sampling broke MiniCPM-duplex-rl's idle/speak decision), so two
figures are kept: the share of steps whose text token is the same, and the
share whose speak/silence decision is the same. The assistant counts as
speaking until ``idle_steps`` steps pass without a text piece, the rule the
oracle's barge-in uses (``oracle.barge_in_idle_steps``). Pure: token ids in,
numbers out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Moshi's pad (3) and end-of-padding (0) ids: steps without text (kame.vocab.TextVocab.silent_ids).
MOSHI_SILENT_IDS = frozenset({0, 3})
#: The oracle's default ``barge_in_idle_steps``: 12 steps of 80 ms.
IDLE_STEPS = 12


def speaking(trace: Sequence[int | None], *, silent_ids: Iterable[int] = MOSHI_SILENT_IDS,
             idle_steps: int = IDLE_STEPS) -> list[bool]:
    """Per step: whether the assistant speaks (a text piece within the last ``idle_steps`` steps, this one included).

    ``None`` (the acoustic delay) and negative ids (moshi's markers) carry no text."""
    if idle_steps < 1:
        raise ValueError("idle_steps must be >= 1")
    silent = frozenset(silent_ids)
    out: list[bool] = []
    since: int | None = None
    for token in trace:
        if token is not None and token >= 0 and token not in silent:
            since = 0
        elif since is not None:
            since += 1
        out.append(since is not None and since < idle_steps)
    return out


@dataclass(frozen=True)
class Agreement:
    """Step-by-step agreement of two traces over their common steps."""

    steps: int  #: steps compared (the shorter trace's length)
    text_same: int  #: steps with the same text token
    speak_same: int  #: steps with the same speak/silence decision
    speaking_a: int  #: steps where run A speaks
    speaking_b: int
    first_text_difference: int | None  #: the first step whose text token differs (None: none does)
    first_speak_difference: int | None
    lengths: tuple[int, int]

    @property
    def text_rate(self) -> float:
        return self.text_same / self.steps if self.steps else 1.0

    @property
    def speak_rate(self) -> float:
        return self.speak_same / self.steps if self.steps else 1.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["lengths"] = list(self.lengths)
        out["text_rate"] = round(self.text_rate, 4)
        out["speak_rate"] = round(self.speak_rate, 4)
        return out

    def summary(self, a: str = "A", b: str = "B") -> str:
        def first(step: int | None) -> str:
            return "never" if step is None else f"step {step}"

        return (
            f"{a} vs {b} over {self.steps} steps: text tokens agree {100 * self.text_rate:.1f} % "
            f"(first difference: {first(self.first_text_difference)}), speak/silence agrees "
            f"{100 * self.speak_rate:.1f} % (first difference: {first(self.first_speak_difference)}); "
            f"speaking {self.speaking_a} steps in {a}, {self.speaking_b} in {b}"
        )


def agreement(trace_a: Sequence[int | None], trace_b: Sequence[int | None], *,
              silent_ids: Iterable[int] = MOSHI_SILENT_IDS, idle_steps: int = IDLE_STEPS) -> Agreement:
    """Agreement of two runs' text tokens (one per step, ``None`` inside the acoustic delay)."""
    silent = frozenset(silent_ids)
    n = min(len(trace_a), len(trace_b))
    a, b = list(trace_a[:n]), list(trace_b[:n])
    speak_a = speaking(a, silent_ids=silent, idle_steps=idle_steps)
    speak_b = speaking(b, silent_ids=silent, idle_steps=idle_steps)
    text_diffs = [i for i in range(n) if a[i] != b[i]]
    speak_diffs = [i for i in range(n) if speak_a[i] != speak_b[i]]
    return Agreement(
        steps=n,
        text_same=n - len(text_diffs),
        speak_same=n - len(speak_diffs),
        speaking_a=sum(speak_a),
        speaking_b=sum(speak_b),
        first_text_difference=text_diffs[0] if text_diffs else None,
        first_speak_difference=speak_diffs[0] if speak_diffs else None,
        lengths=(len(trace_a), len(trace_b)),
    )
