"""``kame transcribe`` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from kame.audio.files import write_wav
from tests.support.speech import content_recall, silence, synthesize

TEXT = "Remind me to call my mother after the meeting on Thursday."


def kame(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kame.cli", "transcribe", *args], capture_output=True, text=True, timeout=120
    )


def test_transcribe_json_on_an_espeak_wav(tmp_path: Path) -> None:
    wav = tmp_path / "in.wav"
    mono = np.concatenate([silence(0.4), synthesize(TEXT, "en-gb", 170), silence(0.8)])
    write_wav(wav, mono, 24000)
    stereo = tmp_path / "stereo44k.wav"  # what a user's recorder writes
    subprocess.run(["sox", str(wav), "-c", "2", "-r", "44100", str(stereo)], check=True)
    res = kame(str(stereo), "--json", "--asr", "whisper")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert all(set(e) == {"t_s", "type", "text"} for e in events)
    times = [e["t_s"] for e in events]
    assert times == sorted(times) and times[-1] <= len(mono) / 24000 + 0.01
    types = [e["type"] for e in events]
    assert types[0] == "speech_started" and types[-2:] == ["speech_stopped", "final"]
    assert "partial" in types
    assert content_recall(TEXT, events[-1]["text"]) >= 0.7, events[-1]


def test_transcribe_text_output_realtime_pocketsphinx(tmp_path: Path) -> None:
    wav = tmp_path / "short.wav"
    write_wav(wav, np.concatenate([synthesize("Hello there."), silence(0.7)]), 16000)
    res = kame(str(wav), "--asr", "pocketsphinx", "--realtime")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "speech_started" in lines[0] and "final" in lines[-1]
    assert lines[0].strip().split()[0].endswith("s")  # "   0.40s  speech_started"


def test_transcribe_errors_are_one_line(tmp_path: Path) -> None:
    res = kame(str(tmp_path / "missing.wav"))
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "no such file" in res.stderr
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav at all")
    res = kame(str(bad))
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "not a WAV file" in res.stderr
    res = kame(str(bad), "--asr", "none")
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
