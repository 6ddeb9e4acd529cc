"""`kame run` end to end: any wav in, same-length 24 kHz reply out, reproducible for a seed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from kame.frontend.runner import OracleInjection


def kame(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kame.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def input_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 22.05 kHz stereo 16-bit wav (not what the engine wants: the runner must convert)."""
    path = tmp_path_factory.mktemp("run") / "in.wav"
    t = np.arange(int(22050 * 2.0)) / 22050
    left = 0.3 * np.sin(2 * np.pi * 220 * t)
    right = 0.3 * np.sin(2 * np.pi * 330 * t)
    data = (np.stack([left, right], axis=1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(data.tobytes())
    return path


def read_wav(path: Path) -> tuple[int, np.ndarray]:
    with wave.open(str(path)) as w:
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def test_oracle_spec_parsing() -> None:
    inj = OracleInjection.parse("Email me at a@b.com@1.2")
    assert inj.text == "Email me at a@b.com" and inj.step == 15
    for bad in ("no seconds", "@1", "text@soon", "text@-1"):
        with pytest.raises(ValueError):
            OracleInjection.parse(bad)


def test_kame_run_end_to_end_reproducible(tiny_kame_ckpt: Path, input_wav: Path, tmp_path: Path) -> None:
    def go(name: str, *extra: str) -> tuple[np.ndarray, list[dict]]:
        out, txt = tmp_path / f"{name}.wav", tmp_path / f"{name}.jsonl"
        res = kame("run", "--checkpoint", str(tiny_kame_ckpt), "--input", str(input_wav), "--output", str(out),
                   "--text-out", str(txt), "--fast", *extra)
        assert res.returncode == 0, res.stderr
        rate, pcm = read_wav(out)
        assert rate == 24000
        assert abs(pcm.size - 48000) <= 1  # same duration as the input
        return pcm, [json.loads(line) for line in txt.read_text().splitlines()]

    oracle = ["--oracle", "The answer is Paris, the capital of France.@0.4"]
    a_pcm, a_txt = go("a", "--seed", "3", *oracle)
    b_pcm, b_txt = go("b", "--seed", "3", *oracle)
    c_pcm, c_txt = go("c", "--seed", "3")
    assert np.array_equal(a_pcm, b_pcm) and a_txt == b_txt
    assert a_txt != c_txt
    assert set(a_txt[0]) == {"step", "t_s", "id", "piece"}
    assert all(abs(line["t_s"] - line["step"] * 0.08) < 1e-6 for line in a_txt)
    assert np.abs(a_pcm).max() > 0  # the reply is audio, not silence


def test_kame_run_streams_the_reply_to_the_file(tiny_kame_ckpt: Path, input_wav: Path, tmp_path: Path) -> None:
    """Without --text-out the reply is written as it comes (an hour of input in flat memory): the same file."""
    def go(name: str, *extra: str) -> tuple[bytes, str]:
        out = tmp_path / f"{name}.wav"
        res = kame("run", "--checkpoint", str(tiny_kame_ckpt), "--input", str(input_wav), "--output", str(out),
                   "--seed", "5", "--fast", *extra)
        assert res.returncode == 0, res.stderr
        return out.read_bytes(), res.stdout.split(",")[0]  # "kame run: N steps"

    kept, kept_steps = go("kept", "--text-out", str(tmp_path / "t.jsonl"))
    streamed, streamed_steps = go("streamed")
    assert streamed == kept and len(streamed) > 48000 * 2
    assert streamed_steps == kept_steps == "kame run: 25 steps"


def test_kame_run_real_time_pacing(tiny_kame_ckpt: Path, input_wav: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = kame("run", "--checkpoint", str(tiny_kame_ckpt), "--input", str(input_wav), "--output", str(tmp_path / "o.wav"))
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - t0 >= 1.9  # 2 s of audio streamed at real time


def test_kame_run_errors_are_one_line(tiny_kame_ckpt: Path, tmp_path: Path) -> None:
    res = kame("run", "--checkpoint", str(tiny_kame_ckpt), "--input", str(tmp_path / "nope.wav"), "--output", str(tmp_path / "o.wav"))
    assert res.returncode == 2 and "nope.wav: not found" in res.stderr and "Traceback" not in res.stderr
    res = kame("run", "--checkpoint", str(tmp_path / "nockpt"), "--input", str(tmp_path / "x.wav"), "--output", str(tmp_path / "o.wav"))
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_kame_run_with_the_cpu_demo_config(kame_cache_dir: Path, input_wav: Path, tmp_path: Path) -> None:
    """`tiny:0` (the cpu-demo checkpoint) resolves for `kame run` as it does for `kame serve`."""
    import os

    out = tmp_path / "demo.wav"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAME_")}
    env.update({"KAME_CACHE_DIR": str(kame_cache_dir), "NO_TORCH_COMPILE": "1", "HF_HUB_OFFLINE": "1"})
    res = subprocess.run(
        [sys.executable, "-m", "kame.cli", "run", "--config", "cpu-demo", "--input", str(input_wav), "--output", str(out), "--fast"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert res.returncode == 0, res.stderr
    rate, pcm = read_wav(out)
    assert rate == 24000 and abs(pcm.size - 48000) <= 1
    assert (kame_cache_dir / "tiny").is_dir()  # made in the config's cache directory
