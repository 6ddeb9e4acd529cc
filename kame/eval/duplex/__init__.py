"""``kame eval duplex``: Full-Duplex-Bench's v1 and v1.5 tasks and metrics on any kame server.

The definitions (take-over, TOR, latency, interruption relevance, backchannel
frequency and JSD) are re-implemented from the benchmark's paper and scoring
code (Lin et al., 2025); its code and data are under non-commercial licences,
so none of it is copied or bundled. One module per idea:

- :mod:`.samples` - a sample folder (``input.wav`` + a label file), checked; a bad one is one sentence;
- :mod:`.words` - ``output.json`` (word timestamps), read and written in the benchmark's layout;
- :mod:`.scoring` - the v1 metrics, pure functions over words and labels;
- :mod:`.overlap` - v1.5: stop and response latency, the behaviour after the overlap (judged, cached);
- :mod:`.align` - the model's audio on the input's clock (arrival order after one zero frame, or frame index);
- :mod:`.client` - one sample streamed at real time over ``/api/chat`` or ``/v1/realtime``;
- :mod:`.asr` - word timestamps from a local Whisper (faster-whisper);
- :mod:`.relevance` - kame's 0-5 relevance judge for v1's interruption task, cached;
- :mod:`.generate` - kame's own generated set (espeak-ng voices and rates, from a seed);
- :mod:`.published` - the benchmark's published v1 figures, with their source;
- :mod:`.report` - ``results.json``, the table and the plot;
- :mod:`.runner` - a folder of samples end to end, several sessions at once, writing into each sample
  folder what the benchmark's own inference and ASR steps write there (its results elsewhere).
"""
