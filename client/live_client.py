"""A small async client for kame's Live API (``/v1/live/sessions``) built on the official openai SDK.

The connection is ``AsyncOpenAI(base_url=".../v1").live.connect()``, exactly
what a GPT-Live application opens, so every message goes through the SDK's
own serialisation and parsing. On top of it: audio in any Live format
(PCM16 at 24 or 16 kHz, G.711 mu-law / A-law at 8 kHz) converted from and
to 24 kHz float32 by :mod:`kame.audio.pcm` (the one conversion module of kame's
wires, clients and recorders; the tests check its formats against audioop
and tone analysis themselves), paced at real time on an absolute schedule,
every event kept with its arrival time, and the same stream measures as the
other protocol clients (real-time factor, time to first audio, lateness of
each 80 ms of output).

    client = await LiveClient.connect("http://127.0.0.1:8998", token="...")
    await client.start({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}})
    await client.send_pcm(pcm)                  # float32 24 kHz
    d = await client.wait_for_type("session.delegation.created", 20)
    await client.conn.session.commentary.append(content="Paris.", delegation_id=d["delegation"]["id"])
    closed = await client.close_session()       # session.close -> session.closed (with usage)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame.audio.pcm import EncodedAudioReader, stream_resampler, to_encoding
from kame.client.event_session import Event, EventSession
from kame.client.stats import FRAME, RATE, StreamStats

AUDIO_EVENT = "session.output_audio.delta"


@dataclass
class LiveStats(StreamStats):
    """:class:`StreamStats` plus when ``session.started`` came and counts of each event type."""

    started_t: float | None = None
    event_counts: dict[str, int] = field(default_factory=dict)

    @property
    def handshake_t(self) -> float | None:
        """When the session became usable (``session.started``), as the Moshi-protocol client names it."""
        return self.started_t


class _Codec:
    """24 kHz float32 <-> one Live audio format, with streaming resamplers each way."""

    def __init__(self, fmt: Mapping[str, Any]) -> None:
        self.type = str(fmt.get("type", "audio/pcm"))
        self.rate = int(fmt.get("rate") or (RATE if self.type == "audio/pcm" else 8000))
        self._up = stream_resampler(self.rate, RATE)
        self._down = stream_resampler(RATE, self.rate)
        self._reader = EncodedAudioReader(self.type)

    def encode(self, pcm: np.ndarray) -> bytes:
        x = np.asarray(pcm, np.float32).reshape(-1)
        if self._down is not None:
            x = self._down.push(x)
        return to_encoding(x, self.type)

    def decode(self, data: bytes) -> np.ndarray:
        x = self._reader.read(data)
        if self._up is not None:
            x = self._up.push(x)
        return x

    def samples_at_24k(self, data: bytes) -> float:
        per_sample = 2 if self.type == "audio/pcm" else 1
        return len(data) / per_sample * RATE / self.rate


def _as_dict(event: Any) -> Event:
    if isinstance(event, dict):
        return event
    to_dict = getattr(event, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return dict(getattr(event, "__dict__", {}))


class LiveClient(EventSession):
    """One ``/v1/live/sessions`` session seen from an application using the official SDK."""

    stats: LiveStats

    DEFAULT_CHUNK = 480  # 20 ms appends, like telephony and browsers

    def __init__(self, conn: Any, *, keep_audio: bool = True) -> None:
        self.conn = conn
        self.ws = conn
        self.keep_audio = keep_audio
        self.stats = LiveStats(connected_t=time.monotonic())
        self._init_events()
        self.session: dict[str, Any] | None = None
        self.codec = _Codec({"type": "audio/pcm", "rate": RATE})
        self.audio_bytes = 0
        self._received_24k = 0.0
        self._recv_task = asyncio.create_task(self._receive())

    @classmethod
    async def connect(cls, base_url: str, *, token: str | None = None, keep_audio: bool = True,
                      timeout: float = 10.0, kame_events: bool = False, resume: str | None = None) -> LiveClient:
        """``base_url``: the server's http(s):// address; the SDK opens ws(s)://.../v1/live/sessions.
        ``kame_events``: ask for the resume handle (``?kame_events=1``, docs/protocol.md "Resuming a session");
        ``resume``: a handle from :attr:`resume_handle` of a dropped connection: the same session again."""
        from openai import AsyncOpenAI

        query: dict[str, str] = {}
        if kame_events or resume:
            query["kame_events"] = "1"
        if resume:
            query["resume"] = resume
        api = AsyncOpenAI(api_key=token or "no-key", base_url=base_url.rstrip("/") + "/v1", max_retries=0)
        conn = await asyncio.wait_for(api.live.connect(extra_query=query).enter(), timeout)
        return cls(conn, keep_audio=keep_audio)

    @property
    def resume_handle(self) -> str | None:
        """The session's latest resume handle (``kame.session.resumable``), None when the server gave none."""
        from kame.client.reconnect import latest_handle

        return latest_handle(ev for _, ev in self.events)

    # ------------------------------------------------------------------ receiving
    async def _receive(self) -> None:
        from websockets.exceptions import ConnectionClosed

        ws = self.conn._connection
        try:
            async for parsed in self.conn:
                now = time.monotonic()
                event = _as_dict(parsed)
                etype = str(event.get("type"))
                counts = self.stats.event_counts
                counts[etype] = counts.get(etype, 0) + 1
                if etype == AUDIO_EVENT:
                    self._on_audio(str(event.get("delta", "")), now)
                    continue
                if etype in ("session.started", "session.updated", "session.closed"):
                    self.session = event.get("session")
                    if etype == "session.started":
                        self.stats.started_t = now
                self.events.append((now, event))
                self._changed.set()
        except (ConnectionClosed, OSError):
            pass
        finally:
            self.close_code = ws.close_code
            self.close_reason = ws.close_reason or ""
            self.closed.set()
            self._changed.set()

    def _on_audio(self, delta: str, now: float) -> None:
        data = base64.b64decode(delta)
        if not data:
            return
        self.audio_bytes += len(data)
        if self.keep_audio:
            self.pcm_chunks.append(self.codec.decode(data))
        before = int(self._received_24k)
        self._received_24k += self.codec.samples_at_24k(data)
        self.stats.samples_received = int(self._received_24k)
        for _ in range(int(self._received_24k) // FRAME - before // FRAME):
            self.stats.frame_arrivals.append(now)

    # ------------------------------------------------------------------ queries
    def transcript(self, role: str = "user") -> str:
        kind = "session.input_transcript.delta" if role == "user" else "session.output_transcript.delta"
        return "".join(str(e.get("delta", "")) for e in self.of_type(kind))

    # ------------------------------------------------------------------ sending
    async def start(self, session: Mapping[str, Any], *, timeout: float = 30.0, event_id: str | None = None) -> Event | None:
        """``session.start``; the ``session.started`` event (None: refused or timed out)."""
        fmt = (session.get("audio") or {}).get("format") or {"type": "audio/pcm", "rate": RATE}
        self.codec = _Codec(fmt)
        start = len(self.events)
        if event_id is None:
            await self.conn.session.start(session=dict(session))
        else:
            await self.conn.session.start(session=dict(session), event_id=event_id)
        mine = {"session.started", "error"}
        got = await self.wait_for(
            lambda e: e.get("type") in mine and (event_id is None or e.get("client_event_id") == event_id), timeout,
            start=start)
        return got if got is not None and got.get("type") == "session.started" else None

    async def _send_piece(self, piece: np.ndarray, chunk: int) -> int | None:
        data = self.codec.encode(piece)
        if data:
            try:
                await self.conn.session.input_audio.append(audio=base64.b64encode(data).decode("ascii"))
            except Exception:  # noqa: BLE001 - the connection closed under us
                return None
        return int(piece.size)

    async def close_session(self, timeout: float = 10.0) -> Event | None:
        """``session.close``; the ``session.closed`` event (None when the server sent none)."""
        with contextlib.suppress(Exception):
            await self.conn.session.close(event_id="close-1")
        return await self.wait_for_type("session.closed", timeout)

    async def close(self, code: int = 1000) -> None:
        with contextlib.suppress(Exception):
            await self.conn.close(code=code)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._recv_task, 5)
