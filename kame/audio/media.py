"""The media clock every part of kame shares: Mimi's audio, 24 kHz mono, in 80 ms frames.

Moshi's codec (Mimi) encodes one frame of 1920 samples at 24 kHz into one set of
codes, 12.5 times a second; the front-end engine ticks once per frame, both wires
carry 24 kHz audio, the ASR and the clients pace themselves by these frames. The
numbers live here, once; everything else imports them.
"""

from __future__ import annotations

SAMPLE_RATE = 24000  #: samples per second of every audio stream inside kame
FRAME_SIZE = 1920  #: samples in one Mimi frame (one engine tick)
FRAME_RATE = SAMPLE_RATE / FRAME_SIZE  #: frames per second (12.5)
FRAME_S = FRAME_SIZE / SAMPLE_RATE  #: seconds per frame (0.08)
