"""``create_recognizer``: the one place that maps ``asr.kind`` to a recogniser."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kame.asr.config import AsrConfig
from kame.asr.recognizer import AsrUnavailableError, Recognizer

if TYPE_CHECKING:
    from kame.frontend.moshi_gate import MoshiMode


def create_recognizer(
    cfg: AsrConfig,
    *,
    sessions: int = 1,
    cache_dir: str | Path | None = None,
    mode: MoshiMode | None = None,
    warmup_steps: int = 0,
) -> Recognizer | None:
    """Load the configured recogniser; None for ``kind: none``.

    ``sessions``: how many streams may be open at once (Kyutai STT batches
    that many slots; the server passes ``frontend.batch_size``).
    ``cache_dir``: where ``tiny:SEED`` models are made.
    ``mode``, ``warmup_steps``: a Kyutai STT's compile and CUDA-graph mode
    (the front-end's settings) and its silent warm-up steps.

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
        return KyutaiRecognizer(
            cfg, batch_size=max(1, int(sessions)), cache_dir=cache_dir, mode=mode, warmup_steps=warmup_steps
        )
    raise ValueError(f"unknown asr.kind {cfg.kind!r}")
