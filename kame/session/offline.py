"""Offline tandem run: a wav through the same pipeline a live session uses.

Speech in, ASR partials, LLM requests, oracle tokens, reply audio out: a
:class:`~kame.session.pipeline.Pipeline` from a
:class:`~kame.session.root.SessionRoot` (as the server builds them), fed one
frame every 80 ms (real time, so ASR and LLM timing is what a caller would
see), or as fast as the engine goes (``fast``; an injected answer still lands
on the frame of its time, as at real time). Every event goes to a timeline (``--events-out``), one JSON object a
line with ``t_s`` (seconds since the first frame) and ``type``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kame.audio.files import frames_of
from kame.audio.media import SAMPLE_RATE
from kame.frontend.runner import FRAME_RATE, OracleInjection
from kame.session.commands import SpeakAnswer
from kame.session.events import AssistantFrame, EngineDown
from kame.session.root import SessionRoot
from kame.session.settings import SessionSettings


@dataclass
class TandemRunResult:
    pcm: np.ndarray
    frames: list[AssistantFrame] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


async def run_tandem_file(
    root: SessionRoot,
    pcm: np.ndarray,
    *,
    settings: SessionSettings | None = None,
    injections: Sequence[OracleInjection] = (),
    encode_answer: Callable[[str], list[int]] | None = None,
    tail_s: float = 0.0,
    fast: bool = False,
) -> TandemRunResult:
    """Stream ``pcm`` (24 kHz mono) through one session; the reply has the input's length
    (plus ``tail_s`` of silence fed after it, so a late answer can still be heard)."""
    idle_id = root.engine.core.idle_id
    piece_of = root.piece_of or (lambda i: str(i))
    events: list[dict[str, Any]] = []
    t0 = time.monotonic()

    def record(kind: str, data: dict[str, Any]) -> None:
        events.append({"t_s": round(time.monotonic() - t0, 4), "type": kind, **data})

    by_step: dict[int, list[OracleInjection]] = {}
    for inj in injections:
        by_step.setdefault(inj.step, []).append(inj)
    frames = frames_of(np.concatenate([pcm, np.zeros(int(tail_s * SAMPLE_RATE), np.float32)]))
    outputs: list[AssistantFrame] = []

    async with root.pipeline(settings, max_queued_frames=1 << 16) as pipeline:

        async def collect() -> None:
            while len(outputs) < len(frames):
                event = await pipeline.next_event()
                if isinstance(event, EngineDown):
                    raise RuntimeError(event.message)
                if not isinstance(event, AssistantFrame):
                    record(event.name, event.fields())
                    continue
                outputs.append(event)
                if event.oracle_id != idle_id:
                    record("oracle.token", {"step": event.step, "id": event.oracle_id})
                if event.text_id is not None:
                    record("text", {"step": event.step, "id": event.text_id, "piece": piece_of(event.text_id)})

        collector = asyncio.get_running_loop().create_task(collect())
        t0 = time.monotonic()
        for step, frame in enumerate(frames):
            if not fast:
                delay = t0 + step / FRAME_RATE - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            else:  # as fast as the engine goes, without overrunning its bounded input buffer
                # an oracle write goes straight into the FIFO the engine reads: it waits for every frame before its
                # step to come out, so that it lands on its own frame (as at real time), not on a queued one
                ahead = 0 if step in by_step else 8
                while step - len(outputs) > ahead and not collector.done():
                    await asyncio.sleep(0.002)
            for inj in by_step.get(step, []):
                ids = encode_answer(inj.text) if encode_answer else []
                if ids:
                    pipeline.apply(SpeakAnswer(tuple(ids), time.monotonic()))
                    record("oracle.injected", {"step": step, "text": inj.text, "tokens": len(ids) + 1})
            pipeline.feed(frame)
        await asyncio.wait_for(collector, timeout=30 + len(frames) / FRAME_RATE)
    reply = np.concatenate([o.pcm for o in outputs]) if outputs else np.zeros(0, np.float32)
    return TandemRunResult(pcm=reply[: pcm.size + int(tail_s * SAMPLE_RATE)], frames=outputs, events=events)


def write_events(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for ev in events:
            f.write(json.dumps(ev, ensure_ascii=False, default=str) + "\n")
