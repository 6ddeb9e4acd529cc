"""pocketsphinx: the lightest fallback, streaming by nature, run in a worker process.

It needs no download (the English model is inside the wheel) and runs
several times faster than real time on one core, but recalls only about a
quarter of the content words of synthetic speech: a fallback for machines
where nothing else runs. It holds the GIL while decoding, hence the process.
Audio is fed to the decoder incrementally (at each partial check and at the
end of the turn), so nothing is decoded twice.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from kame.asr.config import AsrConfig
from kame.asr.process import ProcessStream
from kame.asr.recognizer import AsrUnavailableError, Recognizer
from kame.asr.stream import AsrStream, EventCallback
from kame.asr.transcriber import SegmentingTranscriber, Utterance
from kame.audio.pcm import float_to_pcm16_bytes
from kame.errors import UserError


def _decoder_kwargs(model: str | None) -> dict[str, Any]:
    """Decoder options for a model directory laid out like pocketsphinx's bundled ``en-us``."""
    if model is None:
        return {}
    d = os.path.expanduser(model)
    if not os.path.isdir(d):
        raise UserError(f"pocketsphinx model directory {model} does not exist")
    name = os.path.basename(os.path.normpath(d))
    kwargs = {"hmm": os.path.join(d, name), "lm": os.path.join(d, f"{name}.lm.bin"), "dict": os.path.join(d, "cmudict-en-us.dict")}
    missing = [p for p in kwargs.values() if not os.path.exists(p)]
    if missing:
        raise UserError(f"pocketsphinx model directory {model} lacks {os.path.basename(missing[0])}")
    return kwargs


class PocketsphinxTranscriber(SegmentingTranscriber):
    """Feeds each turn's audio to one pocketsphinx utterance as it grows."""

    def __init__(self, cfg: AsrConfig) -> None:
        super().__init__(cfg)
        try:
            from pocketsphinx import Decoder
        except ImportError:
            raise AsrUnavailableError("asr.kind 'pocketsphinx' needs the pocketsphinx package, which is not installed") from None
        self._decoder = Decoder(samprate=16000, loglevel="FATAL", **_decoder_kwargs(cfg.model))
        self._active: int | None = None  # utterance index the decoder is inside
        self._fed = 0

    def _catch_up(self, utt: Utterance) -> None:
        if self._active != utt.index:
            if self._active is not None:
                self._decoder.end_utt()
            self._decoder.start_utt()
            self._active, self._fed = utt.index, 0
        audio = utt.audio()
        if len(audio) > self._fed:
            self._decoder.process_raw(float_to_pcm16_bytes(audio[self._fed :]), False, False)
            self._fed = len(audio)

    def _hyp(self) -> str:
        hyp = self._decoder.hyp()
        return " ".join(hyp.hypstr.split()) if hyp is not None else ""

    def partial_text(self, utt: Utterance) -> str:
        self._catch_up(utt)
        return self._hyp()

    def final_text(self, utt: Utterance) -> str:
        self._catch_up(utt)
        self._decoder.end_utt()
        self._active = None
        return self._hyp()

    def close(self) -> None:
        if self._active is not None:
            self._decoder.end_utt()
            self._active = None


def build_transcriber(cfg_json: str) -> PocketsphinxTranscriber:
    """Worker-process entry: rebuild the config from JSON (cheap to pickle) and the transcriber."""
    return PocketsphinxTranscriber(AsrConfig.model_validate(json.loads(cfg_json)))


class PocketsphinxRecognizer(Recognizer):
    """No shared model: each session's worker process loads its own (about 0.4 s)."""

    kind = "pocketsphinx"

    def __init__(self, cfg: AsrConfig) -> None:
        super().__init__(cfg)
        try:
            import pocketsphinx  # noqa: F401
        except ImportError:
            raise AsrUnavailableError(
                "asr.kind 'pocketsphinx' needs the pocketsphinx package, which is not installed (pip install pocketsphinx)"
            ) from None
        _decoder_kwargs(cfg.model)  # fail here, in one line, rather than in every worker

    def new_transcriber(self) -> PocketsphinxTranscriber:
        return PocketsphinxTranscriber(self.cfg)

    def open_stream(self, *, on_event: EventCallback | None = None) -> AsrStream:
        return ProcessStream(
            functools.partial(build_transcriber, self.cfg.model_dump_json()),
            self._stream_name(),
            max_queued_s=self.cfg.max_queued_s,
            max_events=self.cfg.max_events,
            on_event=on_event,
        )
