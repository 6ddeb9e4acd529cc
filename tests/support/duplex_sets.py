"""Sample sets for the ``kame eval duplex`` tests: kame's generated v1 set and v1.5 folders in the
benchmark's layout built from it."""

from __future__ import annotations

import json
from pathlib import Path

import soxr

from kame.cli import main as kame_main
from kame.eval.duplex.samples import read_wav, write_wav


def generate_set(root: Path) -> Path:
    """kame's generated set in ``root``, 4 samples per v1 task, seed 3 (a module fixture of the files that use
    it). Tests write their outputs into its sample folders (as the benchmark's clients do): read only the
    inputs, labels and ``meta.json`` of another test's task."""
    assert kame_main(["eval", "duplex", str(root), "--generate", "--per-task", "4", "--seed", "3"]) == 0
    return root


def sample_dirs(task_dir: Path) -> list[Path]:
    return sorted(d for d in task_dir.iterdir() if d.is_dir())


def make_v15_set(generated: Path, root: Path, names: tuple[str, ...] = ("001",), seconds: float = 3.5) -> Path:
    """v1.5 samples in the benchmark's layout, from generated turn-taking inputs cut to ``seconds``:
    ``clean_input.wav`` the question alone, ``input.wav`` the same with 1 s of another voice over it (at
    48 kHz: any rate is taken), ``metadata.json`` the overlap's span."""
    other, _ = read_wav(generated / "pause_handling" / "001" / "input.wav")
    for name in names:
        clean, rate = read_wav(generated / "smooth_turn_taking" / name / "input.wav")
        clean = clean[: round(seconds * rate)]
        noisy = clean.copy()
        a, b = rate, 2 * rate
        noisy[a:b] += 0.8 * other[rate // 2 : rate // 2 + b - a]
        d = root / name
        d.mkdir(parents=True)
        write_wav(d / "clean_input.wav", clean, rate)
        write_wav(d / "input.wav", soxr.resample(noisy, rate, 48000), 48000)
        (d / "metadata.json").write_text(json.dumps({"context_text": "a question", "current_turn_text": "other talk",
                                                     "timestamps": [1.0, 2.0]}))
    return root
