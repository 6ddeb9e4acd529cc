"""Drive one question through one ``/v1/realtime`` session, like a user on a live line.

The line stays open the whole time (full duplex): from the first audio on,
one 80 ms chunk goes out every 80 ms on an absolute schedule - a short
lead-in of silence, turn 1's speech, then silence while the assistant
answers (the server's output clock is the input, ``docs/protocol.md``
3.3), then turn 2's speech in the same session, and so on. The assistant
may start before a question ends; nothing waits for it.

A reply is over when the assistant, having started speaking since the
question began, has been silent for ``reply_silence_s`` after the question
ended (VAD on its audio as it arrives, :mod:`kame.eval.vad`), or when
``max_reply_s`` have passed since the question ended. Then the next turn
starts at once, or the session closes.

Transport is :class:`kame.client.realtime_client.RealtimeClient`; this
module only decides what to send when, and puts what comes back on the
session timeline (:mod:`kame.eval.timeline`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.audio.media import FRAME_S, FRAME_SIZE
from kame.eval.timeline import RATE, SessionTimeline
from kame.eval.vad import EDGE_S, SpeechTracker, VadConfig

FRAME = FRAME_SIZE


class SessionError(Exception):
    """The session could not run to its end (refused, closed early, server error).

    ``close_code`` / ``http_status`` say how the server ended it; :attr:`retry_reason` is not None
    when a new session is worth a try (a refusal, 1013; a drain, 1001; a 503 from a load balancer)."""

    def __init__(self, message: str, *, close_code: int | None = None, http_status: int | None = None) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.http_status = http_status

    @property
    def retry_reason(self) -> str | None:
        from kame.client.reconnect import retry_reason

        return retry_reason(close_code=self.close_code, http_status=self.http_status)


@dataclass(frozen=True)
class DriveConfig:
    """How a question is spoken and when a reply counts as finished."""

    reply_silence_s: float = 1.5
    max_reply_s: float = 30.0
    lead_in_s: float = 0.5
    vad: VadConfig = field(default_factory=VadConfig)
    connect_timeout_s: float = 30.0
    token: str | None = None
    #: Retries of a question whose session was refused or drained (kame.client.reconnect); each
    #: retry speaks the question again from its start in a new session (a new conversation).
    retries: int = 8

    def fingerprint(self) -> dict[str, Any]:
        """What changes the recordings (for resume checks)."""
        return {
            "reply_silence_s": self.reply_silence_s,
            "max_reply_s": self.max_reply_s,
            "lead_in_s": self.lead_in_s,
            "vad": self.vad.__dict__,
        }


@dataclass
class TurnTiming:
    """Where a turn sits on the session timeline (seconds from the first audio sent)."""

    turn: int
    start_s: float  # the turn's window starts (turn 1: at 0, lead-in included)
    speech_start_s: float  # the question audio starts
    question_end_s: float  # the question audio ends
    end_s: float = 0.0  # the reply was over (the next turn starts here)
    reply_end: str = ""  # "silence" or "max_reply"


@dataclass
class SessionRecording:
    """Everything one question's session produced."""

    timeline: SessionTimeline
    turns: list[TurnTiming]
    events: list[dict[str, Any]]  # every non-audio server event, with "t_s" on the timeline
    session: dict[str, Any] | None
    setup_s: float  # connect -> first audio sent
    audio_s: float  # the session's own duration (audio sent)
    wall_s: float  # connect -> closed
    send_lateness_max_s: float
    #: Sessions of this question that were refused or drained before this one (the question was
    #: asked again from its start each time: a new conversation), and why.
    reconnects: list[str] = field(default_factory=list)

    @property
    def session_id(self) -> str | None:
        return None if self.session is None else self.session.get("id")


class _AssistantFeed:
    """Moves audio the client has received onto the timeline and the VAD, frame by frame."""

    def __init__(self, client: Any, timeline: SessionTimeline, tracker: SpeechTracker) -> None:
        self._client = client
        self._timeline = timeline
        self._tracker = tracker
        self._chunks = 0
        self._frames = 0
        self._rest: np.ndarray = np.zeros(0, np.float32)

    def poll(self, t0: float) -> None:
        chunks = self._client.pcm_chunks
        new = chunks[self._chunks :]
        self._chunks = len(chunks)
        buf: np.ndarray = np.concatenate([self._rest, *new]) if new else self._rest
        arrivals = self._client.stats.frame_arrivals
        used = 0
        while len(buf) - used >= FRAME and self._frames < len(arrivals):
            frame = buf[used : used + FRAME]
            used += FRAME
            written = self._timeline.add_assistant(frame, arrivals[self._frames] - t0)
            self._tracker.push(written)
            self._frames += 1
        self._rest = buf[used:]


def reply_over(turn: TurnTiming, tracker: SpeechTracker, now_s: float, cfg: DriveConfig) -> str | None:
    """``silence``, ``max_reply`` or None (still answering, or the question is still being spoken)."""
    if now_s < turn.question_end_s:
        return None
    started = any(s.start_s >= turn.speech_start_s - EDGE_S for s in tracker.all_segments())
    last = tracker.last_voiced_end_s or 0.0
    if started and now_s - max(last, turn.question_end_s) >= cfg.reply_silence_s:
        return "silence"
    if now_s - turn.question_end_s >= cfg.max_reply_s:
        return "max_reply"
    return None


def _error_text(event: Mapping[str, Any]) -> str:
    err = event.get("error") or {}
    return f"{err.get('code') or err.get('type') or 'error'}: {err.get('message', '')}".strip()


async def _await_one_of(client: Any, types: tuple[str, ...], timeout: float, start: int, what: str) -> dict[str, Any]:
    event = await client.wait_for(lambda e: e.get("type") in (*types, "error"), timeout, start=start)
    if event is None:
        if client.closed.is_set():
            raise SessionError(f"server closed the session before {what} ({client.close_code} {client.close_reason})",
                               close_code=client.close_code)
        raise SessionError(f"no {what} within {timeout:g} s")
    if event.get("type") == "error":
        raise SessionError(f"{what} refused: {_error_text(event)}")
    return dict(event)


async def drive_question(
    url: str, turns: Sequence[np.ndarray], settings: Mapping[str, Any], cfg: DriveConfig
) -> SessionRecording:
    """Speak ``turns`` (24 kHz float32, one per question turn) into one session at ``url``."""
    from kame.client.realtime_client import RealtimeClient

    t_connect = time.monotonic()
    try:
        client = await RealtimeClient.connect(url, token=cfg.token, open_timeout=cfg.connect_timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        raise SessionError(f"cannot connect to {url}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - websockets' handshake errors (HTTP status, bad URL)
        from kame.client.reconnect import handshake_status

        raise SessionError(f"cannot connect to {url}: {type(exc).__name__}: {exc}",
                           http_status=handshake_status(exc)) from None
    try:
        created = await _await_one_of(client, ("session.created",), cfg.connect_timeout_s, 0, "session.created")
        session = created.get("session")
        mark = len(client.events)
        fmt = {"type": "audio/pcm", "rate": RATE}
        await client.update_session(audio={"input": {"format": fmt}, "output": {"format": fmt}}, kame=dict(settings))
        updated = await _await_one_of(client, ("session.updated",), cfg.connect_timeout_s, mark, "session.updated")
        session = updated.get("session") or session
        return await _stream(client, turns, cfg, session, t_connect)
    finally:
        await client.close()


async def _stream(
    client: Any, turns: Sequence[np.ndarray], cfg: DriveConfig, session: dict[str, Any] | None, t_connect: float
) -> SessionRecording:
    timeline = SessionTimeline()
    tracker = SpeechTracker(cfg.vad)
    feed = _AssistantFeed(client, timeline, tracker)
    lead = np.zeros(round(cfg.lead_in_s * RATE), np.float32)
    plan = np.concatenate([lead, np.asarray(turns[0], np.float32)])
    timings = [TurnTiming(1, 0.0, len(lead) / RATE, len(plan) / RATE)]
    pos = 0
    speaking = True
    k = 0
    worst_late = 0.0
    t0 = time.monotonic()
    setup_s = t0 - t_connect
    while True:
        target = t0 + k * FRAME_S
        delay = target - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            worst_late = max(worst_late, -delay)
        if client.closed.is_set():
            raise SessionError(f"server closed the session during turn {timings[-1].turn} "
                               f"({client.close_code} {client.close_reason})".rstrip(), close_code=client.close_code)
        feed.poll(t0)
        here = k * FRAME_S
        if not speaking:
            cur = timings[-1]
            reason = reply_over(cur, tracker, time.monotonic() - t0, cfg)
            if reason is not None:
                cur.end_s, cur.reply_end = here, reason
                if len(timings) == len(turns):
                    break
                plan = np.asarray(turns[len(timings)], np.float32)
                timings.append(TurnTiming(len(timings) + 1, here, here, here + len(plan) / RATE))
                pos, speaking = 0, True
        if speaking:
            chunk = plan[pos : pos + FRAME]
            pos += FRAME
            if pos >= len(plan):
                speaking = False
            if len(chunk) < FRAME:
                chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), np.float32)])
        else:
            chunk = np.zeros(FRAME, np.float32)
        timeline.add_user(chunk)
        await client.send_pcm(chunk, chunk=FRAME, realtime=False)
        k += 1
    audio_s = k * FRAME_S
    feed.poll(t0)
    events = [{"t_s": round(t - t0, 3), **e} for t, e in client.events]
    return SessionRecording(
        timeline=timeline,
        turns=timings,
        events=events,
        session=session,
        setup_s=setup_s,
        audio_s=audio_s,
        wall_s=time.monotonic() - t_connect,
        send_lateness_max_s=round(worst_late, 3),
    )
