"""``--score-from asr``: judge what the assistant *said*, transcribed from its recorded audio.

By default the judged answer is Moshi's own text stream, which leads its
audio and can differ from what is audible. Transcribing the reply with
Whisper (faster-whisper; the bundled tiny.en unless ``--asr-model`` names
another CTranslate2 model) judges the speech itself, as a listener hears
it. One model serves the whole run; decodes run in a worker thread, one at
a time, so they never stall the real-time sessions' event loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.errors import UserError

_WHISPER_RATE = 16000


class ReplyTranscriber:
    """Whisper on CPU (int8) or GPU, offline decode of whole replies."""

    def __init__(self, model: str | None = None, device: str = "auto", cpu_threads: int = 2) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise UserError("--score-from asr needs faster-whisper (pip install faster-whisper)") from None
        from kame.asr.whisper import (
            default_whisper_model,
            model_directory,
            resolve_device,
        )

        directory = model_directory(model or default_whisper_model())
        dev, index = resolve_device(device)
        compute = "float16" if dev == "cuda" else "int8"
        self.name = model or "tiny.en (bundled)"
        self._model: Any = WhisperModel(directory, device=dev, device_index=index, compute_type=compute,
                                        cpu_threads=cpu_threads)
        self._lock = threading.Lock()

    def transcribe(self, pcm24k: np.ndarray) -> str:
        import soxr

        x = np.asarray(pcm24k, np.float32).reshape(-1)
        if x.size < 2400 or float(np.max(np.abs(x))) < 1e-4:
            return ""
        x16 = soxr.resample(x, SAMPLE_RATE, _WHISPER_RATE, quality="HQ").astype(np.float32)
        with self._lock:
            segments, _ = self._model.transcribe(x16, language="en", beam_size=5, vad_filter=False,
                                                 condition_on_previous_text=False)
            return " ".join(s.text.strip() for s in segments).strip()

    async def transcribe_async(self, pcm24k: np.ndarray) -> str:
        return await asyncio.to_thread(self.transcribe, pcm24k)
