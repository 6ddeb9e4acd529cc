"""Real speech for tests and benches, made by espeak-ng and resampled by sox.

``synthesize(text, voice, speed)`` returns 24 kHz mono float32 (the rate
sessions feed), cached on disk per (text, voice, speed) so a test run pays
for each sentence once. ``word_end_times`` estimates when each word ends by
synthesizing every prefix of the sentence: espeak is rule-based, so a
prefix is spoken like the start of the whole sentence, only its last word
is a little longer (sentence-final lengthening; the estimate errs late by
a few tens of ms, which makes measured lags slightly optimistic).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.eval.tts import run_espeak

RATE = SAMPLE_RATE

#: Words that carry little content; accuracy checks count the others.
STOPWORDS = frozenset(
    "a an the of to in on at for and or but is are was were be been am do does did i you he she it we they "
    "me my your his her its our their this that these those there here with as by from up so if then than "
    "can could would should will shall may might must not no".split()
)


def cache_dir() -> Path:
    d = Path(os.environ.get("PYTEST_KAME_SPEECH_CACHE") or Path(tempfile.gettempdir()) / "kame-speech-cache")
    d.mkdir(parents=True, exist_ok=True)
    return d


def synthesize(text: str, voice: str = "en-us", speed: int = 160) -> np.ndarray:
    """``text`` spoken by espeak-ng ``voice`` at ``speed`` words a minute, 24 kHz mono float32."""
    key = hashlib.sha1(f"{voice}|{speed}|{text}".encode()).hexdigest()[:20]
    path = cache_dir() / f"{key}.f32"
    if not path.exists():
        wav = run_espeak(["-v", voice, "-s", str(speed), "--stdout"], text)
        raw = subprocess.run(
            ["sox", "-t", "wav", "-", "-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-r", str(RATE), "-"],
            input=wav,
            capture_output=True,
            check=True,
        ).stdout
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(raw)
        tmp.replace(path)  # atomic: parallel runs never read half a file
    return np.fromfile(path, dtype="<f4").astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * RATE)), np.float32)


def noise(seconds: float, dbfs: float, seed: int = 0) -> np.ndarray:
    """White noise at ``dbfs`` RMS."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(round(seconds * RATE))) * 10 ** (dbfs / 20)).astype(np.float32)


def speech_end(pcm: np.ndarray, floor_db: float = -40.0) -> float:
    """Seconds to the last 10 ms above ``floor_db`` relative to the peak (espeak pads with silence)."""
    hop = RATE // 100
    n = len(pcm) // hop
    if n == 0:
        return 0.0
    rms = np.sqrt(np.mean(np.square(pcm[: n * hop].reshape(n, hop), dtype=np.float64), axis=1))
    loud = np.nonzero(rms > rms.max() * 10 ** (floor_db / 20))[0]
    return float((loud[-1] + 1) * hop / RATE) if loud.size else 0.0


def word_end_times(text: str, voice: str = "en-us", speed: int = 160) -> list[float]:
    """End time (s from the start of ``synthesize(text, ...)``) of each whitespace-separated word."""
    words = text.split()
    return [speech_end(synthesize(" ".join(words[: k + 1]), voice, speed)) for k in range(len(words))]


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def _number_words(n: int) -> list[str]:
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])
    if n < 1000:
        return [_ONES[n // 100], "hundred"] + (_number_words(n % 100) if n % 100 else [])
    return [str(n)]


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, digits spelled out ("20" -> "twenty"), for scoring.

    Whisper writes numbers as digits, espeak is given words: without this a
    right answer would count as an error.
    """
    out: list[str] = []
    for w in re.findall(r"[a-z0-9']+", text.lower()):
        out.extend(_number_words(int(w)) if w.isdigit() else [w])
    return out


def content_words(text: str) -> list[str]:
    return [w for w in words(text) if w not in STOPWORDS]


def content_recall(reference: str, hypothesis: str) -> float:
    """Share of the reference's content words found in the hypothesis (with multiplicity)."""
    ref = content_words(reference)
    hyp = content_words(hypothesis)
    if not ref:
        return 1.0
    found = 0
    for w in ref:
        if w in hyp:
            hyp.remove(w)
            found += 1
    return found / len(ref)
