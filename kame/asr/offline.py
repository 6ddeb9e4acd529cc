"""Run a transcriber over a whole recording in the caller's thread (CLI, benches, tests).

Two paces:

* ``lockstep``: after each frame, do every decode that is due. Deterministic
  (every partial check happens; ``audio_s`` = position in the file) and
  independent of the machine's speed.
* ``simulated``: what a live stream on this machine would do, without
  waiting: a virtual clock where audio arrives in real time and each decode
  takes the wall time it really took, during which more audio arrives and
  is handed over at once (so slow decoders skip ahead as they do live).
  ``audio_s`` is the virtual clock, so lags measured on it are real lags.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Literal

import numpy as np

from kame.asr.events import AsrEvent, Emission
from kame.asr.resample import INPUT_RATE, as_mono_float32
from kame.asr.transcriber import Transcriber
from kame.audio.media import FRAME_SIZE

Pace = Literal["lockstep", "simulated"]
FRAME = FRAME_SIZE  #: fed in Mimi frames, as sessions feed


def _stamp(ems: Iterable[Emission], audio_s: float) -> Iterator[AsrEvent]:
    for em in ems:
        yield AsrEvent.stamp(em, audio_s, time.time())


def transcribe_offline(
    transcriber: Transcriber, pcm: np.ndarray, *, frame: int = FRAME, pace: Pace = "lockstep"
) -> Iterator[AsrEvent]:
    """Events for 24 kHz mono audio, fed in ``frame``-sample chunks, flushed at the end."""
    x = as_mono_float32(pcm)
    total = len(x)
    if pace == "lockstep":
        for pos in range(0, total, frame):
            end = min(total, pos + frame)
            yield from _stamp(transcriber.push(x[pos:end]), end / INPUT_RATE)
            while transcriber.pending():
                yield from _stamp(transcriber.work(), end / INPUT_RATE)
        yield from _stamp(transcriber.finish(), total / INPUT_RATE)
        return
    if pace != "simulated":
        raise ValueError(f"pace must be lockstep or simulated, not {pace!r}")
    now = 0.0  # virtual seconds since the first sample
    pos = 0
    while True:
        arrived = int(now * INPUT_RATE + 1e-6)
        arrived = total if arrived >= total else arrived // frame * frame
        while pos < arrived:
            end = min(arrived, pos + frame)
            yield from _stamp(transcriber.push(x[pos:end]), arrived / INPUT_RATE)
            pos = end
        if transcriber.pending():
            t0 = time.perf_counter()
            ems = transcriber.work()
            now += time.perf_counter() - t0
            yield from _stamp(ems, min(now, total / INPUT_RATE))
        elif pos < total:
            now = max(now, min(total, pos + frame) / INPUT_RATE)
        else:
            break
    t0 = time.perf_counter()
    ems = transcriber.finish()
    now += time.perf_counter() - t0
    yield from _stamp(ems, total / INPUT_RATE)
