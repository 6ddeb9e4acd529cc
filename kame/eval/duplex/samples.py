"""A Full-Duplex-Bench sample folder, loaded and checked. No network.

A sample is a folder holding ``input.wav`` (the user's side, mono, at any
rate: the benchmark's are 16 kHz, its pause-handling example 48 kHz; the
client resamples) and the task's label file. v1:

- ``pause_handling``: ``pause.json`` (the pauses; the metric does not read them),
- ``smooth_turn_taking``: ``turn_taking.json``, ``[{"timestamp": [turn_end_s, ...], ...}]``,
- ``user_interruption``: ``interrupt.json``,
  ``[{"context": text, "interrupt": text, "timestamp": [start_s, end_s]}]``,
- ``backchannel``: no label (the human timing data is separate, :mod:`.scoring`).

v1.5 (overlap behaviour; its tasks named ``v1.5/<subset>`` after the
benchmark's folders, so its ``user_interruption`` never meets v1's): every
sample also holds ``clean_input.wav`` (the same turn without the overlap)
and ``metadata.json``, ``{"context_text", "current_turn_text",
"timestamps": [overlap_start_s, overlap_end_s]}``.

A folder that cannot be used (no ``input.wav``, a missing or malformed
label, no audio) is a :class:`SampleProblem`: one sentence, and the run
goes on without it.
"""

from __future__ import annotations

import json
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kame.audio.pcm import float_to_pcm16_bytes, pcm16_to_float

V1_TASKS = ("pause_handling", "smooth_turn_taking", "user_interruption", "backchannel")
#: v1.5's subsets (the benchmark's folder names), prefixed with the version.
V15_TASKS = ("v1.5/user_interruption", "v1.5/user_backchannel", "v1.5/talking_to_other", "v1.5/background_speech")
TASKS = V1_TASKS + V15_TASKS
INPUT_RATE = 16000  # the benchmark's usual input rate (kame's generated set is written at it)
LABEL_FILE = {
    "pause_handling": "pause.json",
    "smooth_turn_taking": "turn_taking.json",
    "user_interruption": "interrupt.json",
    "backchannel": None,
    **{t: "metadata.json" for t in V15_TASKS},
}
CLEAN_INPUT = "clean_input.wav"


def is_v15(task: str) -> bool:
    return task in V15_TASKS


class SampleProblem(Exception):
    """A sample folder that cannot be run or scored; the message is one sentence naming the folder."""


@dataclass(frozen=True)
class Labels:
    """What the metrics read from the label file (None where the task has no such label)."""

    turn_end_s: float | None = None  # smooth_turn_taking
    interrupt_start_s: float | None = None  # user_interruption
    interrupt_end_s: float | None = None
    context: str = ""
    interrupt: str = ""
    overlap_start_s: float | None = None  # v1.5: the overlap event in input.wav
    overlap_end_s: float | None = None


@dataclass(frozen=True)
class Sample:
    """One sample folder of one task."""

    name: str
    directory: Path
    task: str
    labels: Labels
    input_s: float

    @property
    def input_path(self) -> Path:
        return self.directory / "input.wav"

    @property
    def clean_input_path(self) -> Path:
        return self.directory / CLEAN_INPUT


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 and the rate of a 16-bit PCM WAV (channels averaged)."""
    with wave.open(str(path), "rb") as w:
        rate, channels, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
        raw = w.readframes(n)
    if width != 2:
        raise ValueError(f"{8 * width}-bit samples (expected 16-bit PCM)")
    x = pcm16_to_float(raw)
    return x.reshape(-1, channels).mean(axis=1), rate


def wav_rate(path: Path) -> int:
    with wave.open(str(path), "rb") as w:
        return int(w.getframerate())


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(float_to_pcm16_bytes(pcm))


def _timestamp(entry: Any, where: str, n: int) -> list[float]:
    ts = entry.get("timestamp") if isinstance(entry, dict) else None
    if not isinstance(ts, list) or len(ts) < n or not all(isinstance(t, (int, float)) for t in ts[:n]):
        raise ValueError(f"{where} has no numeric \"timestamp\" list of {n} value(s)")
    return [float(t) for t in ts[:n]]


def parse_labels(task: str, data: Any) -> Labels:
    """The label file's content as :class:`Labels`; ``ValueError`` saying what is wrong."""
    if task == "pause_handling":
        if not isinstance(data, list):
            raise ValueError("pause.json is not a list")
        return Labels()
    if task == "smooth_turn_taking":
        if not isinstance(data, list) or not data:
            raise ValueError("turn_taking.json is not a non-empty list")
        return Labels(turn_end_s=_timestamp(data[0], "turn_taking.json's first entry", 1)[0])
    if task == "user_interruption":
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise ValueError("interrupt.json is not a non-empty list of objects")
        start, end = _timestamp(data[0], "interrupt.json's first entry", 2)
        return Labels(interrupt_start_s=start, interrupt_end_s=end,
                      context=str(data[0].get("context") or ""), interrupt=str(data[0].get("interrupt") or ""))
    if is_v15(task):
        if not isinstance(data, dict):
            raise ValueError("metadata.json is not an object")
        start, end = _timestamp({"timestamp": data.get("timestamps")}, "metadata.json", 2)
        return Labels(context=str(data.get("context_text") or ""), interrupt=str(data.get("current_turn_text") or ""),
                      overlap_start_s=start, overlap_end_s=end)
    return Labels()


def _read_input(directory: Path, file: str) -> np.ndarray:
    name = directory.name
    try:
        pcm, _ = read_wav(directory / file)
    except (OSError, EOFError, ValueError, wave.Error) as exc:
        raise SampleProblem(f"sample {name}: {file} is not a readable 16-bit PCM WAV ({exc}), skipped") from None
    if pcm.size == 0:
        raise SampleProblem(f"sample {name}: {file} holds no audio, skipped")
    return pcm


def load_sample(directory: Path, task: str) -> Sample:
    """The sample in ``directory`` for ``task``; :class:`SampleProblem` if it cannot be used."""
    name = directory.name
    wav = directory / "input.wav"
    if not wav.is_file():
        raise SampleProblem(f"sample {name}: no input.wav, skipped")
    pcm = _read_input(directory, "input.wav")
    rate = wav_rate(wav)
    if is_v15(task):
        if not (directory / CLEAN_INPUT).is_file():
            raise SampleProblem(f"sample {name}: no {CLEAN_INPUT} (v1.5 runs the clean input too), skipped")
        _read_input(directory, CLEAN_INPUT)
    label = LABEL_FILE[task]
    labels = Labels()
    if label is not None:
        path = directory / label
        if not path.is_file():
            raise SampleProblem(f"sample {name}: no {label} (the {task} label), skipped")
        try:
            labels = parse_labels(task, json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise SampleProblem(f"sample {name}: {label} is unusable ({exc}), skipped") from None
    return Sample(name, directory, task, labels, pcm.size / rate)


def sample_dirs(data_dir: Path) -> list[Path]:
    """The sample folders of a task folder, in name order (numeric names numerically)."""
    dirs = [p for p in data_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(dirs, key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))


def load_samples(data_dir: Path, task: str) -> tuple[list[Sample], list[str]]:
    """Every usable sample of ``data_dir``, and one sentence per folder skipped."""
    samples: list[Sample] = []
    problems: list[str] = []
    for d in sample_dirs(data_dir):
        try:
            samples.append(load_sample(d, task))
        except SampleProblem as exc:
            problems.append(str(exc))
    return samples, problems
