"""``kame eval``: MT-Bench in speech against a running ``/v1/realtime`` server.

One module per idea:

- :mod:`~kame.eval.questions` - the bundled MT-Bench subset and judge prompts;
- :mod:`~kame.eval.tts` - speaking the questions (espeak-ng, pluggable);
- :mod:`~kame.eval.vad` - speech/silence on recorded audio, latency per turn;
- :mod:`~kame.eval.timeline` - both sides of a session on one wall-clock timeline;
- :mod:`~kame.eval.session` - drives one question (two turns) over a realtime session;
- :mod:`~kame.eval.analysis` - a session's recording cut into turns: texts, oracle answers, latency, wavs;
- :mod:`~kame.eval.transcribe` - ``--score-from asr``: Whisper on the recorded replies;
- :mod:`~kame.eval.judge` - MT-Bench judging through any OpenAI-compatible model;
- :mod:`~kame.eval.results` - ``results.jsonl`` with resume bookkeeping;
- :mod:`~kame.eval.summary` - ``summary.json`` and ``summary.md`` (with the paper's numbers);
- :mod:`~kame.eval.published` - those published numbers, with their source;
- :mod:`~kame.eval.sweep` - ``--sweep KEY=V1,V2`` parsing, ``sweep.md/json`` and the plot;
- :mod:`~kame.eval.runner` - one question set end to end (concurrency, judging, wall time);
- :mod:`~kame.eval.duplex` - ``kame eval duplex``: Full-Duplex-Bench v1's tasks and metrics.

Nothing here measures real-model quality unless it is pointed at a server
with the real weights and a real judge: see ``docs/evaluation.md``.
"""
