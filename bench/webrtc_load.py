"""WebRTC calls for bench/server_load.py (``--protocol webrtc``): aiortc peers on ``/v1/realtime/calls``.

Each call sends its audio as RTP (Opus, 20 ms packets) at real time and
records the assistant's RTP audio. RTP flows continuously (silence when the
server's output buffer is empty), so the measures count only *non-silent*
output: every 80 ms of it gets an arrival time (``frame_arrivals``), the
real-time factor is non-silent audio received / wall time, first audio is
the first non-silent output after the first packet sent, and lateness is
that audio against an 80 ms schedule, so an engine that falls behind shows
as silence inserted (an underrun) and audio arriving late. On the CPU demo
Moshi's random tiny weights never output silence.

The peers share the machine with the server: they code and decode Opus
with libopus inline on their loop (``new_peer(mono=True)``), not through
aiortc's executor and decoder thread, so 8 of them take ~0.27 of a core on
the CPU demo's 2 cores (0.55 before), leaving the server what it needs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from kame.client.stats import StreamStats  # noqa: E402

SILENT_RMS = 1e-3
OUT_RATE = 48000
OUT_FRAME = 3840  # 80 ms at 48 kHz


class CallStats(StreamStats):
    """:class:`StreamStats` of a call (``handshake_t``: the data channel's ``session.created``)."""

    handshake_t: float | None = None


class CallResult:
    def __init__(self) -> None:
        self.stats = CallStats()
        self.close_code: Any = None
        self.close_reason = ""


async def one_webrtc_session(url: str, pcm: np.ndarray, chunk: int, token: str | None, stagger: float) -> CallResult:
    """Call, stream ``pcm`` (24 kHz) as RTP at real time, record 3 s more, hang up."""
    import soxr

    from tests.support.webrtc_peer import SpeechTrack, start_call

    await asyncio.sleep(stagger)
    result = CallResult()
    s = result.stats
    base = url.split("/v1/")[0].split("/api/")[0].replace("ws://", "http://").replace("wss://", "https://")
    s.connected_t = time.monotonic()
    track = SpeechTrack()
    call = await start_call(base, token=token, track=track, raise_for_status=False, mono=True)
    if call.answer_status != 201:
        result.close_code, result.close_reason = call.answer_status, str(call.location)[:80]
        return result
    try:
        await call.wait_for(lambda e: e["type"] == "session.created", 30)
        s.handshake_t = time.monotonic()
        n_audio = len(call.audio)
        track.feed(soxr.resample(np.asarray(pcm, np.float32), 24000, OUT_RATE).astype(np.float32))
        s.first_send_t = time.monotonic()
        s.samples_sent = len(pcm)
        await asyncio.sleep(len(pcm) / 24000)
        s.last_send_t = time.monotonic()
        await asyncio.sleep(3.0)
    except AssertionError as exc:
        result.close_reason = str(exc)[:80]
        n_audio = len(call.audio)
    finally:
        await call.close()
    result.close_code = 1000
    acc = 0
    for t, frame in zip(call.audio_t[n_audio:], call.audio[n_audio:], strict=False):
        if s.first_send_t is None or t < s.first_send_t:
            continue
        if float(np.sqrt(np.mean(frame**2))) < SILENT_RMS:
            continue
        before = acc // OUT_FRAME
        acc += len(frame)
        for _ in range(acc // OUT_FRAME - before):
            s.frame_arrivals.append(t)
    s.samples_received = (acc // OUT_FRAME) * 1920
    return result
