"""``kame transcribe IN.wav``: run the streaming recogniser over a file and print its events.

By default the file is fed in 80 ms frames as fast as possible, every
partial check done after each frame (deterministic; times are positions
in the file). ``--realtime`` feeds it at real-time pace through the live
stream API a server session uses (worker thread or process, asyncio), so
times include the recogniser's own delay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
from kame.errors import UserError

if TYPE_CHECKING:
    import numpy as np

    from kame.asr import AsrEvent, Recognizer

NAME = "transcribe"
HELP = "Transcribe a WAV file with the streaming recogniser, printing partials and finals as they come."

FRAME = FRAME_SIZE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN.wav", help="WAV file (any rate, mono or stereo, int or float samples).")
    p.add_argument(
        "--asr",
        choices=["whisper", "pocketsphinx", "kyutai", "none"],
        default=None,
        help="Recogniser kind (default: asr.kind of the config).",
    )
    p.add_argument("--realtime", action="store_true", help="Feed at real-time pace through the live stream API.")
    p.add_argument("--json", action="store_true", help="One JSON object per event: t_s, type, text.")


def _print_event(ev: AsrEvent, as_json: bool) -> None:
    if as_json:
        print(json.dumps(ev.to_json_dict()), flush=True)
    else:
        text = f"  {ev.text}" if ev.text else ""
        print(f"{ev.audio_s:8.2f}s  {ev.type.value:<14s}{text}", flush=True)


def _print_all(events: Iterable[AsrEvent], as_json: bool) -> int:
    from kame.asr import EventType

    rc = 0
    for ev in events:
        _print_event(ev, as_json)
        if ev.type is EventType.ERROR:
            rc = 1
    return rc


async def _realtime(recognizer: Recognizer, pcm: np.ndarray, as_json: bool) -> int:
    from kame.asr import EventType

    stream = recognizer.open_stream()

    async def feed() -> None:
        t0 = time.monotonic()
        for k, start in enumerate(range(0, len(pcm), FRAME)):
            if not stream.feed(pcm[start : start + FRAME]) and stream.done:
                break
            delay = t0 + (k + 1) * FRAME / SAMPLE_RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        stream.close()

    feeder = asyncio.create_task(feed())
    rc = 0
    async for ev in stream.events():
        _print_event(ev, as_json)
        if ev.type is EventType.ERROR:
            rc = 1
    feeder.cancel()
    return rc


def run(args: argparse.Namespace) -> int:
    from kame.asr import create_recognizer, transcribe_offline
    from kame.asr.wav import load_wav_24k_mono
    from kame.server.config import load_app_config

    cfg = load_app_config(args.config, overrides={"asr.kind": args.asr})
    pcm = load_wav_24k_mono(args.input)  # before loading a model: a bad file fails fast
    recognizer = create_recognizer(cfg.asr, cache_dir=cfg.cache_dir)
    if recognizer is None:
        raise UserError("asr.kind is 'none': there is no recogniser to transcribe with (try --asr whisper)")
    with recognizer:
        if args.realtime:
            return asyncio.run(_realtime(recognizer, pcm, args.json))
        transcriber = recognizer.new_transcriber()
        try:
            return _print_all(transcribe_offline(transcriber, pcm, frame=FRAME), args.json)
        except Exception as exc:  # noqa: BLE001 - a recogniser bug: report like a live error event
            print(f"kame transcribe: recogniser failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            transcriber.close()
