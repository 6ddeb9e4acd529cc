"""`kame mic --input-wav --echo-path IR.wav` against the CPU demo server: the echo of the reply is
cancelled in the audio actually sent (``--record-wav``: the simulated microphone and what was sent,
side by side), and not with ``--no-aec``; bad input (an unreadable impulse response, ``--echo-path``
without ``--input-wav``) is one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from kame.audio.files import read_audio, write_wav
from tests.support.moshi_client import ServerProcess
from tests.support.speech import silence, synthesize

RATE = 24000
FRAME = 1920


def room_ir(delay_s: float = 0.12, gain: float = 0.5, seed: int = 1) -> np.ndarray:
    """A synthetic laptop in a room: ``delay_s`` of silence (playback, capture and flight), a direct path at
    ``gain``, then 150 ms of exponentially decaying reflections 10 dB under it (RT60 about 0.2 s)."""
    rng = np.random.default_rng(seed)
    d = int(delay_s * RATE)
    tau = 0.03 * RATE
    tail = rng.standard_normal(int(0.15 * RATE)) * np.exp(-np.arange(int(0.15 * RATE)) / tau) * gain * np.sqrt(0.1 * 2 / tau)
    ir = np.zeros(d + 1 + tail.size)
    ir[d] = gain
    ir[d + 1 :] = tail
    return ir.astype(np.float32)


def read_stereo(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with wave.open(str(path)) as w:
        assert w.getnchannels() == 2 and w.getframerate() == RATE
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    return x[0::2], x[1::2]


def erle_after(mic: np.ndarray, sent: np.ndarray, start: int) -> tuple[float, float]:
    """(ERLE in dB, the microphone's level in dBFS) over ``start:`` where the microphone had echo."""
    m, s = mic[start:], sent[start:]
    active = np.repeat([np.mean(m[i : i + FRAME] ** 2) > 1e-6 for i in range(0, m.size - FRAME + 1, FRAME)], FRAME)
    m, s = m[: active.size][active], s[: active.size][active]
    assert m.size >= RATE, "under 1 s of echo reached the simulated microphone"
    return float(10 * np.log10(np.mean(m**2) / max(np.mean(s**2), 1e-12))), float(10 * np.log10(np.mean(m**2)))


@pytest.fixture(scope="module")
def server(demo_server: ServerProcess) -> ServerProcess:
    return demo_server


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("echoin")
    question, ir = d / "q.wav", d / "ir.wav"
    write_wav(question, np.concatenate([synthesize("What is the capital of France?"), silence(0.2)]))
    write_wav(ir, room_ir())
    return question, ir


def run_mic(server: ServerProcess, question: Path, ir: Path, record: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "kame.cli", "mic", "--server", server.http_url, "--input-wav", str(question),
         "--echo-path", str(ir), "--record-wav", str(record), "--tail", "5", "--retries", "0", *extra],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def test_echo_is_cancelled_in_what_is_sent(server: ServerProcess, files: tuple[Path, Path], tmp_path: Path) -> None:
    question, ir = files
    n_user = wave.open(str(question)).getnframes()
    user = read_audio(question).astype(np.float64)
    results = {}
    for aec, extra in (("on", ()), ("off", ("--no-aec",))):
        rec = tmp_path / f"rec-{aec}.wav"
        res = run_mic(server, question, ir, rec, *extra)
        mic, sent = read_stereo(rec)
        # the echo alone: the simulated microphone minus the file (mixed linearly, far from clipping)
        echo = mic.copy()
        echo[:n_user] -= user[: min(n_user, mic.size)]
        loud = [i for i in range(0, echo.size - FRAME + 1, FRAME) if np.mean(echo[i : i + FRAME] ** 2) > 1e-7]
        assert loud, "no reply reached the simulated microphone"
        # after 2 s of reply (AEC3 converges) and after the file (no double talk)
        erle, level = erle_after(mic, sent, max(loud[0] + 2 * RATE, n_user))
        results[aec] = (erle, level)
        print(f"AEC {aec}: echo at the microphone {level:.1f} dBFS, ERLE {erle:.1f} dB; {res.stdout.splitlines()[-1]}")
        assert "echo return loss enhancement" in res.stdout  # the summary line
    assert results["off"][1] > -45  # there was an echo to cancel
    assert abs(results["off"][0]) < 1.0  # --no-aec sends the microphone as it is
    # The CPU demo's far end is the tiny random model's stationary noise babble, not speech: AEC3 gives it
    # 12-44 dB over runs here (its residual suppressor treats stationary echo variably); without the
    # reference it is under 3 dB. The 25 dB target is for speech, measured by bench/echo.py.
    assert results["on"][0] >= 10


def test_bad_impulse_response_is_one_line(files: tuple[Path, Path], tmp_path: Path) -> None:
    question, _ = files
    bad = tmp_path / "ir.wav"
    bad.write_bytes(b"not a wav at all")
    stereo = tmp_path / "stereo.wav"
    with wave.open(str(stereo), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.ones(200, "<i2").tobytes())
    cases = [
        (["--input-wav", str(question), "--echo-path", str(bad)], "not a readable wav"),
        (["--input-wav", str(question), "--echo-path", str(tmp_path / "missing.wav")], "no such file"),
        (["--input-wav", str(question), "--echo-path", str(stereo)], "2 channels"),
        (["--echo-path", str(stereo)], "--input-wav"),
    ]
    for args, words in cases:
        # a server that is not there: the impulse response is checked before connecting
        res = subprocess.run([sys.executable, "-m", "kame.cli", "mic", "--server", "http://127.0.0.1:9", *args],
                             capture_output=True, text=True, timeout=60)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and words in lines[0], (args, res.stderr)
