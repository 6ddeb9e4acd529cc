"""From one session's recording to per-turn facts: text, oracle answers, latency, wav files.

Everything is cut by the turn windows of :class:`~kame.eval.session.TurnTiming`
(turn 1 from 0, lead-in included; each turn up to where its reply ended).
An event belongs to the turn whose window holds its arrival time.

- The assistant's text is its own stream, ``response.output_audio_transcript.delta``
  pieces: concatenated per response (pieces carry their leading spaces),
  responses joined by a space, whitespace collapsed.
- Oracle answers come from ``kame.oracle.reset`` / ``kame.oracle.text``:
  one entry per LLM request, with the text fed to Moshi (all of it, the
  last event's ``text``) and when its first and last words were fed.
- Latency is measured on the recorded audio (:func:`kame.eval.vad.turn_latency`).
"""

from __future__ import annotations

import json
import re
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kame.audio.pcm import float_to_pcm16, pcm16_to_float
from kame.eval.session import SessionRecording, TurnTiming
from kame.eval.timeline import RATE
from kame.eval.vad import Segment, VadConfig, speech_segments, turn_latency

_WS = re.compile(r"\s+")
#: Events too bulky or too frequent to be worth a line in events.jsonl.
_SKIP_IN_LOG = frozenset({"session.created", "session.updated"})


def _in(turn: TurnTiming, t: float, last: bool) -> bool:
    return turn.start_s <= t < turn.end_s or (last and t >= turn.start_s)


def assistant_text(events: Sequence[dict[str, Any]]) -> str:
    """The assistant's words from its transcript deltas (in arrival order)."""
    responses: dict[str, list[str]] = {}
    for e in events:
        if e.get("type") == "response.output_audio_transcript.delta":
            responses.setdefault(str(e.get("response_id")), []).append(str(e.get("delta", "")))
    return _WS.sub(" ", " ".join("".join(parts) for parts in responses.values())).strip()


def oracle_answers(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per LLM request whose answer reached the oracle stream."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        etype = e.get("type")
        if etype not in ("kame.oracle.reset", "kame.oracle.text"):
            continue
        rid = str(e.get("request_id"))
        entry = out.setdefault(rid, {"request_id": e.get("request_id"), "text": "", "first_s": e["t_s"],
                                     "last_s": e["t_s"], "resets": 0, "tokens": 0})
        entry["text"] = str(e.get("text", entry["text"]))
        entry["last_s"] = e["t_s"]
        entry["tokens"] += int(e.get("tokens") or 0)
        if etype == "kame.oracle.reset":
            entry["resets"] += 1
    return list(out.values())


def user_transcript(events: Sequence[dict[str, Any]]) -> str:
    """What the server's ASR heard (final transcripts of the user's turns)."""
    parts = [str(e.get("transcript", "")) for e in events
             if e.get("type") == "conversation.item.input_audio_transcription.completed"]
    return _WS.sub(" ", " ".join(parts)).strip()


def write_stereo_wav(path: Path, stereo: np.ndarray, rate: int = RATE) -> None:
    """16-bit stereo WAV: left = user, right = assistant."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ints = float_to_pcm16(stereo)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(ints.tobytes())


def read_stereo_wav(path: Path) -> np.ndarray:
    """The inverse of :func:`write_stereo_wav` (float32 ``[n, 2]``)."""
    with wave.open(str(path), "rb") as w:
        data = w.readframes(w.getnframes())
        channels = w.getnchannels()
    return pcm16_to_float(data).reshape(-1, channels)


def turn_facts(
    rec: SessionRecording, qdir: Path, rel_to: Path, vad: VadConfig
) -> list[dict[str, Any]]:
    """Per turn: texts, oracle answers, latency and the wav path; writes the wavs and events.jsonl."""
    user_pcm = rec.timeline.user.array()
    asst_pcm = rec.timeline.assistant.array()
    user_segs: list[Segment] = speech_segments(user_pcm, vad)
    asst_segs: list[Segment] = speech_segments(asst_pcm, vad)
    qdir.mkdir(parents=True, exist_ok=True)
    events_path = qdir / "events.jsonl"
    with open(events_path, "w", encoding="utf-8") as f:
        for e in rec.events:
            if e.get("type") not in _SKIP_IN_LOG:
                f.write(json.dumps(e, ensure_ascii=False) + "\n")
    out = []
    for i, turn in enumerate(rec.turns):
        last = i == len(rec.turns) - 1
        mine = [e for e in rec.events if _in(turn, float(e["t_s"]), last)]
        wav = qdir / f"turn{turn.turn}.wav"
        write_stereo_wav(wav, rec.timeline.stereo(turn.start_s, turn.end_s))
        lat = turn_latency(user_segs, asst_segs, turn.start_s, turn.end_s)
        out.append(
            {
                "turn": turn.turn,
                "assistant_text": assistant_text(mine),
                "oracle_answers": oracle_answers(mine),
                "user_transcript_server": user_transcript(mine),
                "latency_s": lat.latency_s,
                "user_start_s": lat.user_start_s,
                "user_end_s": lat.user_end_s,
                "assistant_start_s": lat.assistant_start_s,
                "latency_note": lat.note,
                "turn_start_s": round(turn.start_s, 3),
                "turn_end_s": round(turn.end_s, 3),
                "reply_end": turn.reply_end,
                "audio": str(wav.relative_to(rel_to)),
                "events": str(events_path.relative_to(rel_to)),
                "reply_pcm": rec.timeline.stereo(turn.start_s, turn.end_s)[:, 1],
            }
        )
    return out
