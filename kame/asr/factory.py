"""``create_recognizer``: the one place that maps ``asr.kind`` to a recogniser."""

from __future__ import annotations

from kame.asr.config import AsrConfig
from kame.asr.recognizer import AsrUnavailableError, Recognizer


def create_recognizer(cfg: AsrConfig) -> Recognizer | None:
    """Load the configured recogniser; None for ``kind: none``.

    Raises :class:`~kame.errors.UserError` (one sentence) when it cannot run
    here: unknown model, download impossible, package missing. Heavy imports
    happen only for the kind asked for. Threading: Whisper runs a worker
    thread per stream, pocketsphinx a worker process per stream, Kyutai one
    batched engine thread for all streams.
    """
    if cfg.kind == "none":
        return None
    if cfg.kind == "whisper":
        from kame.asr.whisper import WhisperRecognizer

        return WhisperRecognizer(cfg)
    if cfg.kind == "pocketsphinx":
        from kame.asr.sphinx import PocketsphinxRecognizer

        return PocketsphinxRecognizer(cfg)
    if cfg.kind == "kyutai":
        try:
            from kame.asr.kyutai_recognizer import KyutaiRecognizer
        except ImportError as exc:  # torch / moshi missing
            raise AsrUnavailableError(f"asr.kind 'kyutai' needs {exc.name or 'torch and moshi'}, which is not installed") from None
        return KyutaiRecognizer(cfg)
    raise ValueError(f"unknown asr.kind {cfg.kind!r}")
