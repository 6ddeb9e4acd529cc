"""A Moshi-protocol websocket client (websockets + sphn Ogg/Opus), used by ``kame mic``, tests and benches.

It speaks to ``/api/chat`` the way Kyutai's web client and ``moshi``'s
Python client do: binary messages, first byte = kind, Ogg/Opus audio both
ways at 24 kHz. Audio is sent at real time (an absolute 80 ms schedule, so
pacing does not drift), in 1920-sample frames like moshi's client or 480-
sample (20 ms) frames like the browser's opus-recorder. Everything received
is timestamped so that callers can measure real-time factor, time to first
audio and the lateness of each output frame against the 80 ms schedule.

    client = await MoshiClient.connect("ws://127.0.0.1:8998/api/chat", query={"text_topk": 10})
    assert await client.wait_handshake(10)
    await client.send_pcm(pcm, realtime=True)
    await client.close()
    print(client.stats.rtf, client.stats.lateness_ms(99), client.text)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import numpy as np

from kame.client.stats import FRAME, FRAME_S, RATE, AudioSessionBase, StreamStats, percentile  # noqa: F401  (re-exported)


@dataclass
class ClientStats(StreamStats):
    """:class:`StreamStats` plus the Moshi protocol's handshake time and message counts."""

    handshake_t: float | None = None
    messages: dict[int, int] = field(default_factory=dict)  # kind -> count


class MoshiClient(AudioSessionBase):
    """One ``/api/chat`` session seen from the client side."""

    stats: ClientStats

    def __init__(self, ws: Any) -> None:
        import sphn

        self.ws = ws
        self.stats = ClientStats(connected_t=time.monotonic())
        self.texts: list[str] = []
        self.errors: list[str] = []  # 0x05 texts: notices (end of session, drain) and close reasons
        self.error_times: list[float] = []  # when each of them arrived (time.monotonic)
        self.metadata: list[Any] = []
        self.pcm_chunks: list[np.ndarray] = []
        self.handshake = asyncio.Event()
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason: str = ""
        self._reader = sphn.OpusStreamReader(RATE)
        self._writer = sphn.OpusStreamWriter(RATE)
        self._pending = 0
        self._recv_task = asyncio.create_task(self._receive())

    # ------------------------------------------------------------------ connecting
    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        query: Mapping[str, Any] | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        subprotocols: Sequence[str] | None = None,
        origin: str | None = None,
        open_timeout: float = 10.0,
    ) -> MoshiClient:
        """Open the websocket (``token`` goes in an Authorization header; ``query`` with ``kame_resume=1`` asks
        for resume handles, ``resume=HANDLE`` takes a session back: :attr:`resume_handle`)."""
        from websockets.asyncio.client import connect

        if query:
            url = url + ("&" if "?" in url else "?") + urlencode({k: str(v) for k, v in query.items()})
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        ws = await connect(
            url,
            additional_headers=hdrs or None,
            subprotocols=list(subprotocols) if subprotocols else None,  # type: ignore[arg-type]
            origin=origin,  # type: ignore[arg-type]
            open_timeout=open_timeout,
            max_size=1 << 22,
            compression=None,
            ping_interval=None,
        )
        return cls(ws)

    @property
    def resume_handle(self) -> str | None:
        """The session's latest resume handle (0x04 ``kame.session.resumable``; only with ``kame_resume=1``)."""
        from kame.client.reconnect import latest_handle

        return latest_handle(self.metadata)

    @property
    def subprotocol(self) -> str | None:
        return self.ws.subprotocol

    async def wait_handshake(self, timeout: float = 10.0) -> bool:
        """True once 0x00 arrived; False if the server closed first or the timeout passed."""
        hs = asyncio.create_task(self.handshake.wait())
        cl = asyncio.create_task(self.closed.wait())
        try:
            await asyncio.wait({hs, cl}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hs.cancel()
            cl.cancel()
        return self.handshake.is_set()

    async def wait_closed(self, timeout: float = 10.0) -> tuple[int | None, str]:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closed.wait(), timeout)
        return self.close_code, self.close_reason

    # ------------------------------------------------------------------ receiving
    async def _receive(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                now = time.monotonic()
                if isinstance(message, str):
                    self.errors.append(f"text frame from server: {message[:80]}")
                    continue
                if not message:
                    continue
                kind, payload = message[0], message[1:]
                self.stats.messages[kind] = self.stats.messages.get(kind, 0) + 1
                if kind == 0:
                    self.stats.handshake_t = now
                    self.handshake.set()
                elif kind == 1:
                    pcm = np.asarray(self._reader.append_bytes(payload), dtype=np.float32)
                    if pcm.size:
                        self.pcm_chunks.append(pcm)
                        self.stats.samples_received += pcm.size
                        self._pending += pcm.size
                        while self._pending >= FRAME:
                            self._pending -= FRAME
                            self.stats.frame_arrivals.append(now)
                elif kind == 2:
                    self.texts.append(payload.decode("utf-8"))
                elif kind == 4:
                    self.metadata.append(json.loads(payload.decode("utf-8")))
                elif kind == 5:
                    self.errors.append(payload.decode("utf-8"))
                    self.error_times.append(now)
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self.close_reason = self.ws.close_reason or ""
            self.closed.set()

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def received_pcm(self) -> np.ndarray:
        return np.concatenate(self.pcm_chunks) if self.pcm_chunks else np.zeros(0, np.float32)

    # ------------------------------------------------------------------ sending
    async def send_raw(self, data: bytes | str) -> bool:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(data)
            return True
        except ConnectionClosed:
            return False

    async def _send_piece(self, piece: np.ndarray, chunk: int) -> int | None:
        """Opus-encode one piece; the last, short one is padded with silence to ``chunk`` so that the
        encoder does not keep it. The encoder may hold a piece back for the next page."""
        if piece.size < chunk:
            piece = np.concatenate([piece, np.zeros(chunk - piece.size, np.float32)])
        ogg = self._writer.append_pcm(piece)
        if ogg and not await self.send_raw(b"\x01" + bytes(ogg)):
            return None
        return piece.size


async def run_session(
    url: str,
    pcm: np.ndarray,
    *,
    chunk: int = FRAME,
    tail_s: float = 3.0,
    handshake_timeout: float = 15.0,
    **connect_kwargs: Any,
) -> MoshiClient:
    """Connect, send ``pcm`` at real time, collect the rest of the output (at most ``tail_s``), close."""
    client = await MoshiClient.connect(url, **connect_kwargs)
    if await client.wait_handshake(handshake_timeout):
        await client.send_pcm(pcm, chunk=chunk)
        await client.drain_output(tail_s, until_complete=True)
    await client.close()
    return client
