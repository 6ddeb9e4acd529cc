"""Twilio calls for ``bench/server_load.py --protocol twilio`` (and ``--protocol all``).

Each session is a phone call as Twilio places it on ``/twilio/media``: ``connected``, ``start``
(``audio/x-mulaw`` 8000 Hz), then the session's audio resampled to 8 kHz, G.711 mu-law, in 20 ms
``media`` messages at real time (``--chunk`` is ignored: Twilio's messages are 20 ms), ``stop`` at the
end. Each ``media`` message received (kame sends one per 80 ms output frame) is timestamped as one frame, so
server_load.py prints the same real-time factor, first audio and lateness as for the other protocols;
marks are echoed at once (this client does not play). With ``--twilio-token`` (the server's
``twilio.auth_token``) the upgrade is signed as Twilio signs it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
import warnings
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import soxr
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from kame.client.stats import StreamStats

with warnings.catch_warnings():  # stdlib audioop is deprecated on 3.11/3.12 (audioop-lts from 3.13)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

#: 24 kHz samples per mu-law byte (8 kHz)
UP = 3


def media_url(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "/twilio/media", "", ""))


def sign(token: str, url: str) -> str:
    """X-Twilio-Signature of a websocket upgrade: HMAC-SHA1 of the URL alone, base64."""
    return base64.b64encode(hmac.new(token.encode(), url.encode(), hashlib.sha1).digest()).decode()


@dataclass
class TwilioStats(StreamStats):
    """:class:`StreamStats` plus ``handshake_t``: Twilio's protocol has no handshake, so the first audio received
    (None: the call was refused)."""

    handshake_t: float | None = None


class TwilioCallClient:
    """One call; ``stats``, ``close_code`` and ``close_reason`` as server_load.py reads them."""

    def __init__(self) -> None:
        self.stats = TwilioStats()
        self.close_code: int | None = None
        self.close_reason = ""


async def one_twilio_session(url: str, pcm: np.ndarray, chunk: int, token: str | None, stagger: float, *,
                             twilio_token: str | None = None) -> TwilioCallClient:
    """Call, stream ``pcm`` (24 kHz float) at real time as 20 ms mu-law, collect the tail, stop."""
    await asyncio.sleep(stagger)
    client = TwilioCallClient()
    target = media_url(url)
    headers = {"X-Twilio-Signature": sign(twilio_token, target)} if twilio_token else {}
    ulaw = audioop.lin2ulaw((np.clip(soxr.resample(pcm.astype(np.float32), 24000, 8000), -1, 1) * 32767)
                            .astype("<i2").tobytes(), 2)
    sid = f"MZ{abs(hash((stagger, time.monotonic()))):032x}"[:34]
    try:
        async with connect(target, additional_headers=headers, max_size=2**20) as ws:
            client.stats.connected_t = time.monotonic()
            await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            await ws.send(json.dumps({"event": "start", "streamSid": sid, "start": {
                "streamSid": sid, "callSid": "CA" + sid[2:], "tracks": ["inbound"], "customParameters": {},
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
            receiver = asyncio.create_task(_receive(ws, client))
            t0 = time.monotonic()
            client.stats.first_send_t = t0
            for k, i in enumerate(range(0, len(ulaw) - 159, 160)):
                await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))
                await ws.send(json.dumps({"event": "media", "streamSid": sid, "media": {
                    "track": "inbound", "chunk": str(k + 1), "timestamp": str(k * 20),
                    "payload": base64.b64encode(ulaw[i:i + 160]).decode()}}))
                client.stats.samples_sent += 160 * UP
                client.stats.last_send_t = time.monotonic()
            await asyncio.sleep(1.0)  # the tail of the reply
            await ws.send(json.dumps({"event": "stop", "streamSid": sid, "stop": {}}))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(receiver, 5.0)
            receiver.cancel()
            client.close_code, client.close_reason = ws.close_code, ws.close_reason or ""
    except ConnectionClosed as exc:
        client.close_code = exc.rcvd.code if exc.rcvd is not None else None
        client.close_reason = exc.rcvd.reason if exc.rcvd is not None else ""
    return client


async def _receive(ws: object, client: TwilioCallClient) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for raw in ws:  # type: ignore[attr-defined]
            msg = json.loads(raw)
            if msg.get("event") == "media":
                now = time.monotonic()
                if client.stats.handshake_t is None:
                    client.stats.handshake_t = now
                client.stats.samples_received += len(base64.b64decode(msg["media"]["payload"])) * UP
                client.stats.frame_arrivals.append(now)  # kame sends one media message per 80 ms output frame
            elif msg.get("event") == "mark":
                await ws.send(json.dumps({"event": "mark", "streamSid": msg["streamSid"], "mark": msg["mark"]}))  # type: ignore[attr-defined]
