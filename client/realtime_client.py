"""A small async client for KAME's ``/v1/realtime`` (OpenAI Realtime events), for tools and tests.

It streams a microphone-like signal (PCM at real time, on an absolute 80 ms
schedule so pacing never drifts), collects every event with a timestamp,
decodes the assistant's audio, and measures what a listener would notice:
time to first audio, real-time factor and the lateness of each output frame
against an 80 ms schedule (the same measures as the Moshi-protocol client
in ``tests/support/moshi_client.py``). The bench, the CLI mic client and the
evaluation harness build on it; anything the official OpenAI SDK can do
with this server, this client does with fewer moving parts.

    client = await RealtimeClient.connect("ws://127.0.0.1:8998/v1/realtime", token="...")
    await client.wait_for_type("session.created")
    await client.update_session(kame={"backend": "scripted"})
    await client.send_pcm(pcm)                       # float32 24 kHz, paced at real time
    done = await client.wait_for_type("response.done", timeout=10)
    print(client.user_transcripts(), client.assistant_transcripts(), client.stats.lateness_ms(99))
    await client.close()
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import numpy as np

from kame.audio.pcm import float_to_pcm16_bytes, pcm16_to_float
from kame.client.event_session import Event, EventSession
from kame.client.stats import FRAME, FRAME_S, RATE, StreamStats, percentile  # noqa: F401  (re-exported)

AUDIO_EVENTS = frozenset({"response.output_audio.delta", "kame.output_audio.delta"})
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."



def pcm16_b64(pcm: np.ndarray) -> str:
    """float32 [-1, 1] -> base64 PCM16 little-endian (what ``input_audio_buffer.append`` carries)."""
    return base64.b64encode(float_to_pcm16_bytes(np.asarray(pcm, np.float32).reshape(-1))).decode("ascii")


def b64_pcm(delta: str) -> np.ndarray:
    """base64 PCM16 -> float32."""
    return pcm16_to_float(base64.b64decode(delta))


@dataclass
class RealtimeStats(StreamStats):
    """:class:`StreamStats` plus when ``session.created`` came and counts of each event type."""

    created_t: float | None = None
    event_counts: dict[str, int] = field(default_factory=dict)

    @property
    def handshake_t(self) -> float | None:
        """When the session became usable (``session.created``), as the Moshi-protocol client names it."""
        return self.created_t


class RealtimeClient(EventSession):
    """One ``/v1/realtime`` session seen from the client side."""

    DEFAULT_CHUNK = 480  # 20 ms appends, like a browser
    stats: RealtimeStats

    def __init__(self, ws: Any, *, keep_audio: bool = True) -> None:
        self.ws = ws
        self.keep_audio = keep_audio
        self.stats = RealtimeStats(connected_t=time.monotonic())
        self._init_events()
        self.session: dict[str, Any] | None = None
        self._pending = 0
        self._recv_task = asyncio.create_task(self._receive())

    # ------------------------------------------------------------------ connecting
    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        token: str | None = None,
        token_via: str = "header",
        query: Mapping[str, Any] | None = None,
        origin: str | None = None,
        subprotocols: Sequence[str] | None = None,
        open_timeout: float = 10.0,
        keep_audio: bool = True,
        kame_events: bool = True,
        resume: str | None = None,
    ) -> RealtimeClient:
        """Open the websocket; ``token_via``: ``header`` (Bearer), ``query`` (?token=) or ``subprotocol``;
        ``kame_events``: ask for kame's own events (``?kame_events=1``: transcripts in progress, the back-end's
        answers, the audio outside responses), which a plain OpenAI client does not get."""
        from websockets.asyncio.client import connect

        params = dict(query or {})
        if resume:  # a handle from kame.session.resumable: the same session again (docs/protocol.md)
            params["resume"] = resume
        if kame_events and "kame_events=" not in url:
            params.setdefault("kame_events", "1")
        headers: dict[str, str] = {}
        protos = list(subprotocols or [])
        if token is not None:
            if token_via == "header":
                headers["Authorization"] = f"Bearer {token}"
            elif token_via == "query":
                params["token"] = token
            elif token_via == "subprotocol":
                protos = ["realtime", KEY_SUBPROTOCOL_PREFIX + token, *protos]
            else:
                raise ValueError(f"token_via: header, query or subprotocol, not {token_via!r}")
        if params:
            url = url + ("&" if "?" in url else "?") + urlencode({k: str(v) for k, v in params.items()})
        ws = await connect(
            url,
            additional_headers=headers or None,
            subprotocols=protos or None,  # type: ignore[arg-type]
            origin=origin,  # type: ignore[arg-type]
            open_timeout=open_timeout,
            max_size=1 << 24,
            compression=None,
            ping_interval=None,
        )
        return cls(ws, keep_audio=keep_audio)

    @property
    def resume_handle(self) -> str | None:
        """The session's latest resume handle (``kame.session.resumable``), None when the server gave none."""
        from kame.client.reconnect import latest_handle

        return latest_handle(ev for _, ev in self.events)

    @property
    def subprotocol(self) -> str | None:
        return self.ws.subprotocol

    # ------------------------------------------------------------------ receiving
    async def _receive(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                now = time.monotonic()
                try:
                    event = json.loads(message)
                except (TypeError, ValueError):
                    event = {"type": "client.invalid_message", "size": len(message)}
                etype = str(event.get("type"))
                counts = self.stats.event_counts
                counts[etype] = counts.get(etype, 0) + 1
                if etype in AUDIO_EVENTS:
                    self._on_audio(event, now)
                    continue
                if etype in ("session.created", "session.updated"):
                    self.session = event.get("session")
                    if etype == "session.created":
                        self.stats.created_t = now
                self.events.append((now, event))
                self._changed.set()
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self.close_reason = self.ws.close_reason or ""
            self.closed.set()
            self._changed.set()

    def _on_audio(self, event: Event, now: float) -> None:
        pcm = b64_pcm(str(event.get("delta", "")))
        if not pcm.size:
            return
        if self.keep_audio:
            self.pcm_chunks.append(pcm)
        self.stats.samples_received += pcm.size
        self._pending += pcm.size
        while self._pending >= FRAME:
            self._pending -= FRAME
            self.stats.frame_arrivals.append(now)

    # ------------------------------------------------------------------ queries
    def user_transcripts(self) -> list[str]:
        return [str(e.get("transcript", "")) for e in self.of_type("conversation.item.input_audio_transcription.completed")]

    def assistant_transcripts(self) -> list[str]:
        return [str(e.get("transcript", "")) for e in self.of_type("response.output_audio_transcript.done")]

    async def send_raw(self, data: str | bytes) -> bool:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(data)
            return True
        except ConnectionClosed:
            return False

    async def send_event(self, event: Mapping[str, Any]) -> bool:
        return await self.send_raw(json.dumps(event))

    async def update_session(self, *, instructions: str | None = None, kame: Mapping[str, Any] | None = None,
                             **fields: Any) -> bool:
        session: dict[str, Any] = {"type": "realtime", **fields}
        if instructions is not None:
            session["instructions"] = instructions
        if kame is not None:
            session["kame"] = dict(kame)
        return await self.send_event({"type": "session.update", "session": session})

    async def _send_piece(self, piece: np.ndarray, chunk: int) -> int | None:
        """One ``input_audio_buffer.append`` of base64 pcm16 (a short last piece is sent as it is)."""
        if not await self.send_event({"type": "input_audio_buffer.append", "audio": pcm16_b64(piece)}):
            return None
        return piece.size

