"""Streaming 24 kHz -> 16 kHz conversion for recognisers trained at 16 kHz."""

from __future__ import annotations

from kame.audio.media import SAMPLE_RATE
from kame.audio.pcm import StreamResampler as _PcmStreamResampler
from kame.audio.pcm import as_mono_float32 as as_mono_float32

#: Sample rate of the audio sessions feed (Mimi / Moshi frames).
INPUT_RATE = SAMPLE_RATE
#: Sample rate Whisper, pocketsphinx and WebRTC VAD work at.
ASR_RATE = 16000


class StreamResampler(_PcmStreamResampler):
    """:class:`kame.audio.pcm.StreamResampler` from the sessions' rate to the recognisers' by default."""

    def __init__(self, in_rate: int = INPUT_RATE, out_rate: int = ASR_RATE) -> None:
        super().__init__(in_rate, out_rate)
