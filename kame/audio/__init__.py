"""Audio inside kame: the media clock and everything that handles samples.

- :mod:`.media`: the clock every part shares (24 kHz mono, 80 ms frames);
- :mod:`.pcm`: PCM16 and G.711 <-> float32, stream resampling;
- :mod:`.files`: audio files in and out, frames of a signal;
- :mod:`.loudness`: RMS in dBFS, for every loudness gate;
- :mod:`.echo`, :mod:`.echo_linear`: the echo canceller of ``kame mic`` and its linear pre-canceller.
"""
