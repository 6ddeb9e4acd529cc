"""Offline runner: stream a wav through the engine frame by frame, as a session would.

Used by ``kame run``. At real time by default (one frame every 80 ms, so the
timing of oracle injections and, later, of ASR and LLM events is the one a
live session sees), or as fast as possible with ``fast=True``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import torch

from kame.audio.files import frames_of
from kame.audio.media import FRAME_RATE
from kame.frontend.engine import EngineCore, SlotOutput
from kame.frontend.prompts import PromptPlan


@dataclass(frozen=True)
class OracleInjection:
    """Oracle text injected at a fixed step (``TEXT@SECONDS`` on the command line)."""

    text: str
    step: int

    @classmethod
    def parse(cls, spec: str, frame_rate: float = FRAME_RATE) -> OracleInjection:
        """Split on the LAST ``@`` so the text itself may contain ``@``."""
        text, sep, seconds = spec.rpartition("@")
        if not sep or not text.strip():
            raise ValueError(f"oracle {spec!r}: expected TEXT@SECONDS")
        try:
            t = float(seconds)
        except ValueError:
            raise ValueError(f"oracle {spec!r}: {seconds!r} is not a number of seconds") from None
        if t < 0:
            raise ValueError(f"oracle {spec!r}: seconds must be >= 0")
        return cls(text=text.strip(), step=round(t * frame_rate))


@dataclass
class RunResult:
    pcm: np.ndarray
    outputs: list[SlotOutput] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)


StepHook = Callable[[int, float], None]


def run_offline(
    core: EngineCore,
    pcm: np.ndarray,
    *,
    injections: list[OracleInjection] = (),  # type: ignore[assignment]
    encode_answer: Callable[[str], list[int]],
    seed: int | None = None,
    fast: bool = False,
    slot: int = 0,
    before_step: StepHook | None = None,
    on_output: Callable[[SlotOutput], None] | None = None,
    prompt: PromptPlan | None = None,
    keep: bool = True,
) -> RunResult:
    """Run ``pcm`` (24 kHz mono) through ``slot``; the reply has the input's length.

    ``prompt``: a PersonaPlex checkpoint's system prompts (voice and role), stepped
    before the first frame (None there: the default voice, no role).

    ``before_step(step, t_s)`` runs before each step (the tandem loop hooks in
    here to apply ASR/LLM results that are due). ``keep`` False: no output is
    kept (``on_output`` sees each step), so an hour of input runs in flat memory.
    """
    if seed is not None:
        torch.manual_seed(seed)
    core.attach(slot, prompt)
    while core.prompting(slot):  # a PersonaPlex session's system prompts, before the input's first frame
        core.prompt_tick()
    frames = frames_of(pcm, core.frame_size)
    by_step: dict[int, list[OracleInjection]] = {}
    for inj in injections:
        by_step.setdefault(inj.step, []).append(inj)
    result = RunResult(pcm=np.zeros(0, np.float32))
    out_frames: list[np.ndarray] = []
    t0 = time.monotonic()
    for step, frame in enumerate(frames):
        if not fast:
            delay = t0 + step / FRAME_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if before_step is not None:
            before_step(step, step / FRAME_RATE)
        for inj in by_step.get(step, []):
            ids = encode_answer(inj.text)
            if ids:
                core.oracle_reset(slot, ids)
        t_step = time.perf_counter()
        out = core.tick({slot: frame})[slot]
        if keep:
            result.step_times_s.append(time.perf_counter() - t_step)
            result.outputs.append(out)
            out_frames.append(out.pcm)
        if on_output is not None:
            on_output(out)
    core.detach(slot)
    reply = np.concatenate(out_frames) if out_frames else np.zeros(0, np.float32)
    result.pcm = reply[: pcm.size]
    return result


def piece_of(tokenizer: Any, token_id: int) -> str:
    if 0 <= token_id < tokenizer.vocab_size():
        return str(tokenizer.id_to_piece(token_id))
    return f"<{token_id}>"


class SteppedText(Protocol):
    """An output step with its text token (:class:`SlotOutput`, or a pipeline's ``AssistantFrame``)."""

    @property
    def step(self) -> int: ...

    @property
    def text_id(self) -> int | None: ...


def write_text_jsonl(out: IO[str], outputs: Sequence[SteppedText], tokenizer: Any) -> None:
    """One line per sampled text token: step, t_s, id, piece."""
    for o in outputs:
        if o.text_id is None:
            continue
        line = {"step": o.step, "t_s": round(o.step / FRAME_RATE, 3), "id": o.text_id, "piece": piece_of(tokenizer, o.text_id)}
        out.write(json.dumps(line, ensure_ascii=False) + "\n")


def write_text_file(path: Path, outputs: Sequence[SteppedText], tokenizer: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        write_text_jsonl(f, outputs, tokenizer)
