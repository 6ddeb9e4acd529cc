"""One sample streamed into a kame server at real time, as the benchmark's own Moshi client does.

``input.wav`` (any rate) is resampled to the wire's 24 kHz and sent in 80 ms
frames on an absolute schedule; the client waits up to 1 s for the
server's handshake and then sends anyway; it keeps receiving for 0.5 s
after the input ends, then closes. What came back is aligned by
:func:`.align.align_output`.

Two wires:

- ``chat``: ``/api/chat`` (Moshi's protocol, Ogg/Opus), session settings in
  the query string (``llm=0``, ``oracle_policy=...``);
- ``realtime``: ``/v1/realtime`` with kame's own events on (the full-duplex
  timeline: ``kame.output_audio.delta`` carries the frames outside
  responses), settings in ``session.update``'s ``kame`` object. How kame's
  events are switched on is :data:`REALTIME_OPT_IN` / :func:`realtime_kame`,
  in one place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
from kame.errors import UserError
from kame.eval.session import SessionError

HANDSHAKE_WAIT_S = 1.0
TAIL_S = 0.5
WIRES = ("chat", "realtime")
#: Query parameters that switch kame's own events on for ``/v1/realtime`` (issue 24's opt-in).
REALTIME_OPT_IN: Mapping[str, str] = {"kame_events": "1"}


def realtime_kame(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``kame`` object of ``session.update``: the settings, and the frames outside responses."""
    return {**settings, "silence_audio": True}


def chat_query(settings: Mapping[str, Any]) -> dict[str, str]:
    """Session settings as ``/api/chat`` query parameters (``llm`` as 0/1)."""
    out: dict[str, str] = {}
    for k, v in settings.items():
        out[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)
    return out


@dataclass(frozen=True)
class Target:
    """Where the server is, per wire."""

    base: str  # http(s)://host:port[/prefix]
    wire: str = "chat"
    token: str | None = None

    @classmethod
    def parse(cls, url: str, wire: str = "chat", token: str | None = None) -> Target:
        if wire not in WIRES:
            raise UserError(f"--wire {wire!r}: expected one of {', '.join(WIRES)}")
        if "://" not in url:
            url = "http://" + url
        p = urlsplit(url)
        if p.scheme not in ("http", "https", "ws", "wss") or not p.netloc:
            raise UserError(f"--server {url!r}: expected http(s)://HOST:PORT")
        path = p.path.rstrip("/")
        for suffix in ("/api/chat", "/v1/realtime", "/v1"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
                break
        secure = p.scheme in ("https", "wss")
        return cls(urlunsplit(("https" if secure else "http", p.netloc, path, "", "")), wire, token)

    def ws_url(self) -> str:
        p = urlsplit(self.base)
        path = p.path + ("/api/chat" if self.wire == "chat" else "/v1/realtime")
        return urlunsplit(("wss" if p.scheme == "https" else "ws", p.netloc, path, "", ""))

    def health_url(self) -> str:
        return self.base + "/health"


class SampleSessionError(SessionError):
    """A sample's session could not run (refused, closed early): the sample is reported, not scored; retried
    as ``kame eval`` retries its sessions (:attr:`~kame.eval.session.SessionError.retry_reason`)."""


@dataclass
class Received:
    """What one sample's session brought back."""

    chunks: list[np.ndarray]
    handshake_s: float | None  # connect -> handshake (None: none within the wait, sent anyway)
    wall_s: float
    close_code: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


def to_wire_rate(pcm16k: np.ndarray, rate: int) -> np.ndarray:
    import soxr

    return np.asarray(soxr.resample(np.asarray(pcm16k, np.float32), rate, SAMPLE_RATE, quality="HQ"), np.float32)


async def stream_sample(target: Target, pcm: np.ndarray, settings: Mapping[str, Any],
                        connect_timeout_s: float = 30.0) -> Received:
    """Stream ``pcm`` (24 kHz float32) at real time; everything the server sent back, in arrival order."""
    if target.wire == "chat":
        return await _stream_chat(target, pcm, settings, connect_timeout_s)
    return await _stream_realtime(target, pcm, settings, connect_timeout_s)


def _refused(code: int | None, reason: str) -> SampleSessionError:
    return SampleSessionError(f"the server closed the session ({code} {reason})".strip(), close_code=code)


def _connect_error(url: str, exc: BaseException) -> SampleSessionError:
    from kame.client.reconnect import handshake_status

    return SampleSessionError(f"cannot connect to {url}: {type(exc).__name__}: {exc}", http_status=handshake_status(exc))


async def _stream_chat(target: Target, pcm: np.ndarray, settings: Mapping[str, Any], timeout: float) -> Received:
    from kame.client.moshi_client import MoshiClient

    t0 = time.monotonic()
    try:
        client = await MoshiClient.connect(target.ws_url(), query=chat_query(settings), token=target.token,
                                           open_timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - connection and handshake errors of websockets
        raise _connect_error(target.ws_url(), exc) from None
    try:
        got = await client.wait_handshake(HANDSHAKE_WAIT_S)
        hs = (client.stats.handshake_t - t0) if got and client.stats.handshake_t else None
        if client.closed.is_set():
            raise _refused(client.close_code, client.close_reason)
        await client.send_pcm(pcm, chunk=FRAME_SIZE, realtime=True)
        await asyncio.sleep(TAIL_S)
        if client.closed.is_set() and client.close_code not in (1000, None):
            raise _refused(client.close_code, client.close_reason)
        return Received(list(client.pcm_chunks), hs, time.monotonic() - t0, client.close_code)
    finally:
        await client.close()


async def _stream_realtime(target: Target, pcm: np.ndarray, settings: Mapping[str, Any], timeout: float) -> Received:
    from kame.client.realtime_client import RealtimeClient

    t0 = time.monotonic()
    try:
        client = await RealtimeClient.connect(target.ws_url(), token=target.token, open_timeout=timeout,
                                              query=dict(REALTIME_OPT_IN))
    except Exception as exc:  # noqa: BLE001
        raise _connect_error(target.ws_url(), exc) from None
    try:
        created = await client.wait_for_type("session.created", timeout)
        if created is None:
            raise _refused(client.close_code, client.close_reason or "no session.created")
        mark = len(client.events)
        fmt = {"type": "audio/pcm", "rate": SAMPLE_RATE}
        await client.update_session(audio={"input": {"format": fmt}, "output": {"format": fmt}},
                                    kame=realtime_kame(settings))
        ev = await client.wait_for(lambda e: e.get("type") in ("session.updated", "error"), timeout, start=mark)
        if ev is None and client.closed.is_set():
            raise _refused(client.close_code, client.close_reason)
        if ev is None or ev.get("type") == "error":
            why = (ev or {}).get("error", {}).get("message", "no session.updated") if ev else "no session.updated"
            raise SampleSessionError(f"session.update refused: {why}")
        hs = time.monotonic() - t0
        client.pcm_chunks.clear()  # nothing before the first input frame belongs on the input's clock
        await client.send_pcm(pcm, chunk=FRAME_SIZE, realtime=True)
        await asyncio.sleep(TAIL_S)
        if client.closed.is_set() and client.close_code not in (1000, None):
            raise _refused(client.close_code, client.close_reason)
        events = [{"t_s": round(t - t0, 3), **e} for t, e in client.events]
        return Received(list(client.pcm_chunks), hs, time.monotonic() - t0, client.close_code, events)
    finally:
        await client.close()
