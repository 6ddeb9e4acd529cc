"""Live API sessions for ``bench/server_load.py --protocol live`` (and ``--protocol all``).

Each session is an application on the official SDK (``client.live.connect()``, through
:class:`kame.client.live_client.LiveClient`): ``session.start`` in client delegation, then audio at real
time in ``--chunk``-sample appends (80 ms by default, as the other protocols' clients; PCM16 at 24 kHz
unless ``--live-format`` says otherwise), and every
``--commentary-every`` seconds a ``session.commentary.append`` (no delegation id: the CPU demo runs
without ASR, so there are no delegations), as an application answering would. Output frames are
timestamped as by the other protocols' clients, so server_load.py prints the same real-time factor and
lateness. The commentary -> oracle FIFO latency is the server's own measure
(``kame_live_commentary_fifo_seconds``), printed by server_load.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from kame.client.live_client import LiveClient

COMMENTARY = "Paris is the capital of France, a city of about two million people."
FORMATS = {
    "pcm24": {"type": "audio/pcm", "rate": 24000},
    "pcm16": {"type": "audio/pcm", "rate": 16000},
    "pcmu": {"type": "audio/pcmu", "rate": 8000},
    "pcma": {"type": "audio/pcma", "rate": 8000},
}


def http_url(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


async def _commentaries(client: LiveClient, every_s: float) -> None:
    k = 0
    while every_s > 0 and not client.closed.is_set():
        await asyncio.sleep(every_s)
        k += 1
        with contextlib.suppress(Exception):
            await client.conn.session.commentary.append(content=COMMENTARY, delegation_id=None, event_id=f"c{k}")


async def one_live_session(url: str, pcm: np.ndarray, chunk: int, token: str | None, stagger: float, *,
                           fmt: str = "pcm24", commentary_every_s: float = 2.0) -> LiveClient:
    """Connect, start, stream ``pcm`` at real time with commentaries, collect the tail, close."""
    await asyncio.sleep(stagger)
    client = await LiveClient.connect(http_url(url), token=token, keep_audio=False)
    session: dict[str, Any] = {"model": "gpt-live-1", "audio": {"format": FORMATS[fmt]}}
    if await client.start(session, timeout=30) is not None:
        talker = asyncio.create_task(_commentaries(client, commentary_every_s))
        await client.send_pcm(pcm, chunk=chunk)
        talker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await talker
        await client.drain_output(3.0, until_complete=True)
        await client.close_session(5.0)
    await client.close()
    return client
