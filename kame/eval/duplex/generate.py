"""kame's own generated set: the v1 tasks spoken by espeak-ng, labels in the benchmark's formats.

No download, reproducible from a seed (same seed, same count: the same
texts, voices, rates and pauses, and the same bytes: espeak-ng runs through
``kame.eval.tts.run_espeak``, which keeps PulseAudio's first run off its random numbers), small
for CI (``--per-task 2``) and as large as wanted on a GPU box. Voices
(``VOICES``) and rates (``RATES``, words a minute) vary per sample. The
texts are kame's own, written for this; this is NOT the benchmark's data,
and its rows are never shown beside the published figures.

Per task, ``OUT/TASK/NNN/``:

- ``pause_handling``: a sentence broken by a pause of 1.5-3 s in the
  middle (the user has not finished), input ending 0.5 s after its last
  word; ``pause.json`` lists the speech spans.
- ``smooth_turn_taking``: a question, then 4-5 s of silence;
  ``turn_taking.json`` ``[{"text", "timestamp": [turn_end_s, input_end_s]}]``.
- ``user_interruption``: a request, 3-4 s of silence (the model answers),
  an interruption changing the subject, then 4 s of silence;
  ``interrupt.json`` ``[{"context", "interrupt", "timestamp": [start_s, end_s]}]``.
- ``backchannel``: a story told in short sentences with 0.4-0.9 s gaps
  (backchannel cues), no label.

Each sample also has ``meta.json`` (texts, voice, rate); ``OUT/dataset.json``
names the set (``kame-generated``, its seed and counts).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kame.eval.duplex.samples import INPUT_RATE, V1_TASKS, write_wav

VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us+f3", "en-gb+f2")
RATES = (140, 155, 170, 185)
DATASET = "kame-generated"

PAUSE_SENTENCES = (
    ("I was thinking about going to", "the coast this weekend if the weather holds up."),
    ("Could you tell me how long it takes to", "boil an egg so the yolk stays soft?"),
    ("My sister just moved to a new city and she wants", "to find a good place to run in the morning."),
    ("The thing I never understood about trains is", "why they are always late in the winter."),
    ("Before we start, I should mention that", "I only have about ten minutes today."),
    ("What I really need is a recipe that uses", "potatoes, leeks and a little cheese."),
    ("So yesterday at work my manager asked me to", "plan the whole team dinner by myself."),
    ("I would like to learn a language that", "is useful for travelling in South America."),
)
QUESTIONS = (
    "What is the tallest mountain in Europe?",
    "Can you suggest a name for a small grey cat?",
    "How many minutes should I bake a loaf of bread?",
    "Why is the sky blue during the day?",
    "What should I pack for a weekend of hiking?",
    "Which planet is closest to the sun?",
    "How do I keep basil fresh in the kitchen?",
    "What is a good way to fall asleep faster?",
)
INTERRUPTIONS = (
    ("Tell me about the history of the bicycle.", "Sorry, actually, can you tell me what time it is in Tokyo?"),
    ("Explain how a rainbow forms.", "Wait, before that, what is the capital of Canada?"),
    ("Give me some tips for a job interview.", "Hold on, how do I say thank you in Japanese?"),
    ("Describe how to plant tomatoes.", "Stop, I changed my mind, what is a good film for tonight?"),
    ("Tell me a story about a dragon.", "Actually, could you make it about a robot instead?"),
    ("How does a car engine work?", "Sorry to cut in, how much water should I drink a day?"),
    ("What are the rules of chess?", "Wait, I meant the rules of checkers, not chess."),
    ("Explain what inflation is.", "Hang on, can you give me a quick example with bread prices?"),
)
STORIES = (
    ("So last summer I went camping with my brother.", "We drove for six hours to reach the lake.",
     "The first night it rained without stopping.", "Our tent leaked from every corner.",
     "In the morning we found a frog inside my boot.", "We laughed about it all the way home."),
    ("I started baking bread during the winter.", "The first loaf was as hard as a brick.",
     "Then a neighbour gave me her old recipe.", "She told me to let the dough rest overnight.",
     "Now I bake two loaves every Sunday.", "My kids eat one before it even cools down."),
    ("My grandfather used to repair old clocks.", "His workshop was full of tiny drawers.",
     "Every drawer had a different kind of spring.", "He could hear when a clock was slightly off.",
     "When I was ten he gave me my first watch.", "I still wind it every single morning."),
)


@dataclass(frozen=True)
class Speech:
    pcm: np.ndarray  # 16 kHz float32

    @property
    def seconds(self) -> float:
        return self.pcm.size / INPUT_RATE


def speak(text: str, voice: str, wpm: int) -> Speech:
    """espeak-ng at 16 kHz, leading and trailing silence cut (20 ms kept)."""
    import soxr

    from kame.eval.tts import EspeakTts

    x = EspeakTts(voice, wpm).synthesize(text)
    x = np.asarray(soxr.resample(x, 24000, INPUT_RATE, quality="HQ"), np.float32)
    loud = np.nonzero(np.abs(x) > 1e-3)[0]
    if loud.size:
        m = int(0.02 * INPUT_RATE)
        x = x[max(0, loud[0] - m) : loud[-1] + 1 + m]
    return Speech(x)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * INPUT_RATE), np.float32)


def _r(x: float) -> float:
    return round(x, 3)


def _pause(rng: random.Random, i: int, voice: str, wpm: int) -> tuple[np.ndarray, dict[str, Any], Any]:
    a, b = PAUSE_SENTENCES[i % len(PAUSE_SENTENCES)]
    s1, s2 = speak(a, voice, wpm), speak(b, voice, wpm)
    lead, gap = rng.uniform(0.3, 0.6), rng.uniform(1.5, 3.0)
    pcm = np.concatenate([silence(lead), s1.pcm, silence(gap), s2.pcm, silence(0.5)])
    t1 = lead + s1.seconds
    t2 = t1 + gap
    label = [{"text": a, "timestamp": [_r(lead), _r(t1)]}, {"text": b, "timestamp": [_r(t2), _r(t2 + s2.seconds)]}]
    return pcm, {"texts": [a, b], "pause_s": _r(gap)}, label


def _turn(rng: random.Random, i: int, voice: str, wpm: int) -> tuple[np.ndarray, dict[str, Any], Any]:
    q = QUESTIONS[i % len(QUESTIONS)]
    s = speak(q, voice, wpm)
    lead, tail = rng.uniform(0.3, 0.6), rng.uniform(4.0, 5.0)
    pcm = np.concatenate([silence(lead), s.pcm, silence(tail)])
    end = lead + s.seconds
    return pcm, {"texts": [q]}, [{"text": q, "timestamp": [_r(end), _r(pcm.size / INPUT_RATE)]}]


def _interrupt(rng: random.Random, i: int, voice: str, wpm: int) -> tuple[np.ndarray, dict[str, Any], Any]:
    ctx, intr = INTERRUPTIONS[i % len(INTERRUPTIONS)]
    s1, s2 = speak(ctx, voice, wpm), speak(intr, voice, wpm)
    lead, gap = rng.uniform(0.3, 0.6), rng.uniform(3.0, 4.0)
    pcm = np.concatenate([silence(lead), s1.pcm, silence(gap), s2.pcm, silence(4.0)])
    start = lead + s1.seconds + gap
    label = [{"context": ctx, "interrupt": intr, "timestamp": [_r(start), _r(start + s2.seconds)]}]
    return pcm, {"texts": [ctx, intr]}, label


def _backchannel(rng: random.Random, i: int, voice: str, wpm: int) -> tuple[np.ndarray, dict[str, Any], Any]:
    story = STORIES[i % len(STORIES)]
    parts = [silence(rng.uniform(0.3, 0.6))]
    for line in story:
        parts += [speak(line, voice, wpm).pcm, silence(rng.uniform(0.4, 0.9))]
    return np.concatenate(parts), {"texts": list(story)}, None


BUILDERS = {"pause_handling": _pause, "smooth_turn_taking": _turn, "user_interruption": _interrupt,
            "backchannel": _backchannel}
LABEL_NAMES = {"pause_handling": "pause.json", "smooth_turn_taking": "turn_taking.json",
               "user_interruption": "interrupt.json"}


def generate(out: Path, per_task: int, seed: int = 0, tasks: tuple[str, ...] = V1_TASKS) -> dict[str, Any]:
    """Write ``per_task`` samples of each task under ``out/TASK/NNN/``; returns ``dataset.json``'s content."""
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        rng = random.Random(f"{seed}:{task}")
        order = list(range(per_task))
        offset = rng.randrange(1000)
        for n in order:
            voice, wpm = rng.choice(VOICES), rng.choice(RATES)
            pcm, meta, label = BUILDERS[task](rng, n + offset, voice, wpm)
            d = out / task / f"{n + 1:03d}"
            d.mkdir(parents=True, exist_ok=True)
            write_wav(d / "input.wav", pcm, INPUT_RATE)
            if label is not None:
                (d / LABEL_NAMES[task]).write_text(json.dumps(label, indent=1) + "\n", encoding="utf-8")
            (d / "meta.json").write_text(json.dumps({**meta, "voice": voice, "wpm": wpm}, indent=1) + "\n",
                                         encoding="utf-8")
    info = {"dataset": DATASET, "seed": seed, "per_task": per_task, "tasks": list(tasks)}
    (out / "dataset.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info
