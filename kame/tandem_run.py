"""Offline tandem run: a wav through the same pipeline a live session uses.

Speech in, ASR partials, LLM requests, oracle tokens, reply audio out: an
:class:`~kame.frontend.engine_thread.EngineThread` with one slot and a
:class:`~kame.tandem.Tandem` built by the server's factory, fed one frame
every 80 ms (real time, so ASR and LLM timing is what a caller would see).
Every event goes to a timeline (``--events-out``), one JSON object a line
with ``t_s`` (seconds since the first frame) and ``type``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kame.audio import frames_of
from kame.frontend.engine import SlotOutput
from kame.frontend.engine_thread import AsyncSlot, EngineThread
from kame.frontend.runner import FRAME_RATE, OracleInjection, piece_of
from kame.tandem import TandemEvent, TandemFactory


@dataclass
class TandemRunResult:
    pcm: np.ndarray
    outputs: list[SlotOutput] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


async def run_tandem_file(
    engine: EngineThread,
    factory: TandemFactory,
    pcm: np.ndarray,
    *,
    settings: dict[str, Any] | None = None,
    injections: list[OracleInjection] = (),  # type: ignore[assignment]
    encode_answer: Any = None,
    tail_s: float = 0.0,
    fast: bool = False,
) -> TandemRunResult:
    """Stream ``pcm`` (24 kHz mono) through one session; the reply has the input's length
    (plus ``tail_s`` of silence fed after it, so a late answer can still be heard)."""
    tokenizer = engine.core.models.tokenizer
    events: list[dict[str, Any]] = []
    t0 = time.monotonic()

    def record(kind: str, data: dict[str, Any]) -> None:
        events.append({"t_s": round(time.monotonic() - t0, 4), "type": kind, **data})

    def emit(ev: TandemEvent) -> None:
        if ev.type != "assistant.text":  # the text tokens are recorded per step below
            record(ev.type, ev.data)

    slot = AsyncSlot(engine, max_queued=1 << 16)
    await slot.attach()
    tandem = factory.new(slot, emit, **(settings or {}))
    await tandem.start()
    by_step: dict[int, list[OracleInjection]] = {}
    for inj in injections:
        by_step.setdefault(inj.step, []).append(inj)
    frames = frames_of(np.concatenate([pcm, np.zeros(int(tail_s * 24000), np.float32)]))
    outputs: list[SlotOutput] = []

    async def collect() -> None:
        while len(outputs) < len(frames):
            item = await slot.outputs.get()
            if isinstance(item, Exception):
                raise item
            outputs.append(item)
            tandem.on_output(item)
            if item.oracle_id not in (engine.core.idle_id,):
                record("oracle.token", {"step": item.step, "id": item.oracle_id})
            if item.text_id is not None:
                record("text", {"step": item.step, "id": item.text_id, "piece": piece_of(tokenizer, item.text_id)})

    collector = asyncio.get_running_loop().create_task(collect())
    t0 = time.monotonic()
    for step, frame in enumerate(frames):
        if not fast:
            delay = t0 + step / FRAME_RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        else:  # as fast as the engine goes, without overrunning its bounded input buffer
            while step - len(outputs) > 8 and not collector.done():
                await asyncio.sleep(0.002)
        for inj in by_step.get(step, []):
            ids = encode_answer(inj.text) if encode_answer else []
            if ids:
                slot.oracle_reset(ids)
                record("oracle.injected", {"step": step, "text": inj.text, "tokens": len(ids) + 1})
        tandem.feed_user_audio(frame)
    try:
        await asyncio.wait_for(collector, timeout=30 + len(frames) / FRAME_RATE)
    finally:
        await tandem.aclose()
    reply = np.concatenate([o.pcm for o in outputs]) if outputs else np.zeros(0, np.float32)
    return TandemRunResult(pcm=reply[: pcm.size + int(tail_s * 24000)], outputs=outputs, events=events)


def write_events(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for ev in events:
            f.write(json.dumps(ev, ensure_ascii=False, default=str) + "\n")
