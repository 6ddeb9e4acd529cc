"""Speaking the questions: a small TTS interface, espeak-ng by default.

MT-Bench is text; KAME's paper evaluates it in speech, so each turn is
synthesized and streamed to the server like a user's voice. Any engine
that maps text to 24 kHz mono float32 fits :class:`Tts`. Two come with
``kame``:

- ``espeak`` (default): espeak-ng, rule-based, deterministic, installed
  everywhere (``espeak`` / ``espeak:VOICE`` / ``espeak:VOICE:WPM``);
- ``command:PROGRAM ARGS...``: any program that reads the text on stdin and
  writes a WAV file (any rate, mono or stereo) to stdout, e.g. a Piper or
  Coqui wrapper script, so better voices need no code here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.audio.pcm import pcm16_to_float
from kame.errors import UserError

RATE = SAMPLE_RATE


class Tts(Protocol):
    """Text -> speech at 24 kHz mono float32 in [-1, 1]."""

    @property
    def name(self) -> str: ...

    def synthesize(self, text: str) -> np.ndarray: ...


def wav_bytes_to_pcm(data: bytes, rate: int = RATE) -> np.ndarray:
    """A 16-bit PCM WAV file's bytes as mono float32 at ``rate`` (resampled with soxr).

    Streaming writers (espeak-ng --stdout) put 0x7fffffff sizes in the header;
    the data chunk is then simply the rest of the file.
    """
    pos, fmt, pcm = 12, None, None
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise UserError("TTS output is not a WAV file")
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        if cid == b"fmt ":
            body = data[pos + 8 : pos + 8 + size]
            fmt = (int.from_bytes(body[0:2], "little"), int.from_bytes(body[2:4], "little"),
                   int.from_bytes(body[4:8], "little"), int.from_bytes(body[14:16], "little"))
        elif cid == b"data":
            pcm = data[pos + 8 : pos + 8 + size]
            break
        pos += 8 + size + (size & 1)
    if fmt is None or pcm is None:
        raise UserError("TTS output: WAV file without fmt or data chunk")
    tag, channels, file_rate, bits = fmt
    if tag != 1 or bits != 16 or channels < 1:
        raise UserError(f"TTS output: expected 16-bit PCM WAV, got format {tag} with {bits} bits")
    x = pcm16_to_float(pcm[: len(pcm) // (2 * channels) * 2 * channels])
    x = x.reshape(-1, channels).mean(axis=1)
    if file_rate != rate:
        import soxr

        x = soxr.resample(x, file_rate, rate, quality="HQ")
    return np.ascontiguousarray(x, dtype=np.float32)


def espeak_env() -> dict[str, str]:
    """The environment for an espeak-ng run whose output depends only on its text, voice and rate.

    espeak-ng opens a PulseAudio client even with ``--stdout``. The first time a user runs it (no
    ``~/.config/pulse/<machine-id>-runtime`` link yet, as on a new machine or in a new container),
    PulseAudio names its runtime directory with ``rand()``, which shifts the process's ``rand()`` sequence;
    espeak-ng draws the breath noise of voices with ``breath`` (``+f2``, ``+f3``...) from that same
    sequence, so that run's audio differs from every later one by a least significant bit here and there.
    A private ``PULSE_RUNTIME_PATH`` (an empty directory of its own for each run) keeps PulseAudio off
    ``rand()``. Call it inside a ``tempfile.TemporaryDirectory`` (:func:`run_espeak` does).
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}


def run_espeak(args: list[str], text: str) -> bytes:
    """``espeak-ng ARGS`` with ``text`` on stdin, reproducible byte for byte (:func:`espeak_env` says why)."""
    with tempfile.TemporaryDirectory(prefix="kame-espeak-") as pulse:
        env = {**espeak_env(), "PULSE_RUNTIME_PATH": pulse}
        return _run(["espeak-ng", *args], text, "espeak-ng", env)


def _run(cmd: list[str], text: str, what: str, env: dict[str, str] | None = None) -> bytes:
    try:
        out = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, timeout=120, check=False,
                             env=env)
    except FileNotFoundError:
        raise UserError(f"TTS {what}: program {cmd[0]!r} not found") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"TTS {what}: no output within 120 s") from None
    if out.returncode != 0:
        err = out.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UserError(f"TTS {what} failed (exit {out.returncode}): {err[-1] if err else 'no message'}")
    return out.stdout


@dataclass(frozen=True)
class EspeakTts:
    """espeak-ng: ``voice`` (e.g. en-us) at ``wpm`` words a minute."""

    voice: str = "en-us"
    wpm: int = 160

    @property
    def name(self) -> str:
        return f"espeak:{self.voice}:{self.wpm}"

    def synthesize(self, text: str) -> np.ndarray:
        # --stdin keeps newlines and list markers of MT-Bench questions out of the command line
        data = run_espeak(["-v", self.voice, "-s", str(self.wpm), "--stdin", "--stdout"], text)
        return wav_bytes_to_pcm(data)


@dataclass(frozen=True)
class CommandTts:
    """An external program: text on stdin, a WAV file on stdout."""

    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return "command:" + shlex.join(self.argv)

    def synthesize(self, text: str) -> np.ndarray:
        return wav_bytes_to_pcm(_run(list(self.argv), text, self.argv[0]))


def make_tts(spec: str) -> Tts:
    """``espeak``, ``espeak:VOICE``, ``espeak:VOICE:WPM`` or ``command:PROGRAM ARGS...``."""
    kind, _, rest = spec.partition(":")
    if kind == "espeak":
        if shutil.which("espeak-ng") is None:
            raise UserError("--tts espeak needs espeak-ng (apt-get install espeak-ng)")
        parts = [p for p in rest.split(":") if p] if rest else []
        if len(parts) > 2:
            raise UserError(f"--tts {spec!r}: expected espeak[:VOICE[:WPM]]")
        voice = parts[0] if parts else "en-us"
        try:
            wpm = int(parts[1]) if len(parts) > 1 else 160
        except ValueError:
            raise UserError(f"--tts {spec!r}: WPM must be an integer") from None
        if not 80 <= wpm <= 450:
            raise UserError(f"--tts {spec!r}: WPM must be within 80-450")
        return EspeakTts(voice, wpm)
    if kind == "command":
        argv = tuple(shlex.split(rest))
        if not argv:
            raise UserError("--tts command:PROGRAM ARGS... needs a program")
        return CommandTts(argv)
    raise UserError(f"--tts {spec!r}: unknown engine (known: espeak, command:PROGRAM)")
