"""``create_recognizer``: the one place that maps ``asr.kind`` to a recogniser."""

from __future__ import annotations

from kame.asr.config import AsrConfig
from kame.asr.recognizer import Recognizer


def create_recognizer(cfg: AsrConfig) -> Recognizer | None:
    """Load the configured recogniser; None for ``kind: none``.

    Raises :class:`~kame.errors.UserError` (one sentence) when it cannot run
    here: unknown model, download impossible, package missing, Kyutai not yet
    available. Heavy imports happen only for the kind asked for.
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
        from kame.asr.kyutai import create_kyutai_recognizer

        create_kyutai_recognizer(cfg)
    raise ValueError(f"unknown asr.kind {cfg.kind!r}")
