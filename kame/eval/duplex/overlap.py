"""Full-Duplex-Bench v1.5 (overlap handling) in kame's own scoring: timing and behaviour.

v1.5 plays a user turn with an overlap event (the user interrupting, a user
backchannel, the user talking to someone else, background speech) and the
same turn without it (``clean_input.wav``). kame scores, per sample:

- **timing**, from the speech segments of ``input.wav`` and ``output.wav``
  (kame's VAD; user pauses up to :data:`USER_MERGE_S` and model pauses up to
  :data:`MODEL_MERGE_S` joined, the benchmark's merge gaps): *stop latency*,
  how long the model went on speaking over the user (each stretch where both
  speak, one per end time, the shortest kept); *response latency*, from the
  end of a user stretch to the model's next start (one per model start, the
  latest user end kept). A sample's figure is the mean of its stretches;
- **behaviour**, one label for what the model does after the overlap
  (:data:`BEHAVIOURS`: responds to it, resumes its earlier answer, says it
  could not hear, or nothing clear), given by an OpenAI-compatible judge from
  the four transcripts (``input.json``, ``clean_input.json``, ``output.json``,
  ``clean_output.json``) with kame's own prompt, asked at most ``retries + 1``
  times and cached.

The benchmark's speech-feature comparison (UTMOS, pitch, intensity before
and after the overlap) is not re-implemented: run its own script on the
folders kame wrote (docs/evaluation.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kame.eval.duplex.cached_judge import CachedJudge
from kame.eval.duplex.scoring import Span, mean

USER_MERGE_S = 0.6
MODEL_MERGE_S = 0.5
BEHAVIOURS = ("C_RESPOND", "C_RESUME", "C_UNCERTAIN_HANDLING", "C_UNKNOWN")
CACHE_FILE = "behaviour_cache.json"


def merge(spans: Sequence[Span], gap_s: float) -> list[Span]:
    """Spans sorted and joined where the silence between them is at most ``gap_s``."""
    out: list[Span] = []
    for s in sorted(spans, key=lambda x: (x.start_s, x.end_s)):
        if out and s.start_s - out[-1].end_s <= gap_s:
            out[-1] = Span(out[-1].start_s, max(out[-1].end_s, s.end_s))
        else:
            out.append(s)
    return out


def stop_intervals(user: Sequence[Span], model: Sequence[Span]) -> list[Span]:
    """Where the user and the model speak at once; of those ending at the same millisecond, the shortest."""
    best: dict[int, Span] = {}
    for u in user:
        for m in model:
            a, b = max(u.start_s, m.start_s), min(u.end_s, m.end_s)
            if b > a:
                key = round(b * 1000)
                if key not in best or b - a < best[key].end_s - best[key].start_s:
                    best[key] = Span(a, b)
    return sorted(best.values(), key=lambda s: s.end_s)


def response_intervals(user: Sequence[Span], model: Sequence[Span]) -> list[Span]:
    """From each user stretch's end to the model's next start; per model start, the latest user end."""
    starts = sorted(m.start_s for m in model)
    best: dict[int, Span] = {}
    for u in user:
        nxt = next((s for s in starts if s > u.end_s), None)
        if nxt is None:
            continue
        key = round(nxt * 1000)
        if key not in best or u.end_s > best[key].start_s:
            best[key] = Span(u.end_s, nxt)
    return sorted(best.values(), key=lambda s: s.end_s)


def timing(user_raw: Sequence[Span], model_raw: Sequence[Span]) -> dict[str, Any]:
    """A sample's stop and response latency (means of its intervals; None without any)."""
    user, model = merge(user_raw, USER_MERGE_S), merge(model_raw, MODEL_MERGE_S)
    stops, resps = stop_intervals(user, model), response_intervals(user, model)
    return {"stop_latency_s": mean([s.end_s - s.start_s for s in stops]),
            "response_latency_s": mean([s.end_s - s.start_s for s in resps]),
            "stop_intervals": [[round(s.start_s, 3), round(s.end_s, 3)] for s in stops],
            "response_intervals": [[round(s.start_s, 3), round(s.end_s, 3)] for s in resps]}


def aggregate_v15(per_sample: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per task: the behaviour shares (over the labelled samples) and the latency means."""
    labels = [s["behaviour"] for s in per_sample if s.get("behaviour") in BEHAVIOURS]
    shares = {b: round(labels.count(b) / len(labels), 4) for b in BEHAVIOURS} if labels else None
    stops = [s["stop_latency_s"] for s in per_sample if s.get("stop_latency_s") is not None]
    resps = [s["response_latency_s"] for s in per_sample if s.get("response_latency_s") is not None]
    return {"samples": len(per_sample), "behaviour": shares, "labelled": len(labels),
            "stop_latency_mean_s": mean(stops), "response_latency_mean_s": mean(resps)}


SYSTEM_PROMPT = """You label one moment of a spoken conversation between a user and a voice assistant.
The user's turn was played twice: once with an extra event overlapping it (the user cutting in, a short
"uh-huh", the user talking to someone else, or other people talking in the background: "input_noisy"), and
once without it ("input_clean"). You see automatic word-level transcripts (words with start and end times in
seconds) of both inputs and of the assistant's speech in each run ("output_noisy", "output_clean").

Find where the overlap event is in input_noisy (the words that input_clean lacks). Then look at the first
stretch of the assistant's speech in output_noisy that starts after the overlap began and starts something
new (it addresses the event, changes what it is doing, or restarts with "anyway", "as I was saying"...).
Speech that began before the overlap does not count. Label that stretch with exactly one of:

C_RESPOND - it takes up what the overlapping speech said or asked;
C_RESUME - it ignores the overlap and carries on with what it was saying or answering before;
C_UNCERTAIN_HANDLING - it says it did not hear or understand, or asks the user to repeat, with no real answer;
C_UNKNOWN - none of these clearly, off-topic filler, or no such stretch (including no speech at all).

Answer with one line and nothing after it, exactly of the form:
{"behaviour": ["C_..."]}"""


def parse_behaviour(text: str) -> str | None:
    """The label of the first JSON object with a ``behaviour`` list naming one of :data:`BEHAVIOURS`."""
    decoder = json.JSONDecoder()
    pos = (text or "").find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        tags = obj.get("behaviour") if isinstance(obj, dict) else None
        if isinstance(tags, list) and tags and tags[0] in BEHAVIOURS:
            return str(tags[0])
        pos = text.find("{", end)
    return None


def user_message(transcripts: Mapping[str, Any]) -> str:
    """The four transcripts (as written to the sample folder), compact JSON, in the order the prompt names."""
    order = ("input_clean", "input_noisy", "output_clean", "output_noisy")
    return json.dumps({k: transcripts[k] for k in order}, separators=(",", ":"), ensure_ascii=False)


class BehaviourJudge(CachedJudge):
    """Labels through a :class:`kame.eval.judge.Judge`; bounded retries, labels cached in ``cache_dir``."""

    def __init__(self, judge: Any, cache_dir: Path, retries: int = 2) -> None:
        super().__init__(judge, cache_dir, CACHE_FILE, retries)

    async def label(self, transcripts: Mapping[str, Any]) -> dict[str, Any]:
        message = user_message(transcripts)
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": message}]
        return await self.verdict(self.key(SYSTEM_PROMPT, message), msgs, "behaviour", parse_behaviour,
                                  "no {\"behaviour\": [C_...]} with a known label in the judgement")
