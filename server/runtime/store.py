"""Where a draining replica leaves its resumable sessions for another one: Redis (or Valkey).

An entry is one session's conversation state (its id, settings, the back-end's turns: conversation
TEXT, so the store must be protected like the logs), under a key derived from the resume handle (a
reader of the store cannot use its keys as handles), with a time to live. A replica resuming a
session reads the entry, checks its binding, then takes it (GETDEL: one taker, one connection at a
time). No store configured: resume works within one replica (server/runtime/resume.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

KEY_PREFIX = "kame:resume:"


@dataclass(frozen=True)
class Snapshot:
    """A session as another replica needs it (the voice's state is not in it: that replica's voice starts
    fresh). ``final``: written when the session left this replica, not while it still ran."""

    session_id: str
    protocol: str
    binding: str
    settings: dict[str, Any]
    #: The back-end's conversation, oldest first: ``[role, text]``.
    turns: list[list[str]] = field(default_factory=list)
    final: bool = False
    written_at: float = field(default_factory=time.time)
    #: What the wire needs to rebuild its protocol state (the Live API: its accepted config messages).
    wire: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        data = json.loads(text)
        return cls(
            session_id=str(data["session_id"]), protocol=str(data["protocol"]), binding=str(data["binding"]),
            settings=dict(data["settings"]), turns=[[str(r), str(t)] for r, t in data.get("turns", [])],
            final=bool(data.get("final", False)), written_at=float(data.get("written_at", 0.0)),
            wire=dict(data.get("wire") or {}),
        )


def store_key(handle: str) -> str:
    return KEY_PREFIX + hashlib.sha256(handle.encode()).hexdigest()


class SessionStore(Protocol):
    """What the resume registry needs of a shared store."""

    async def put(self, handle: str, snapshot: Snapshot, ttl_s: float) -> None: ...

    async def get(self, handle: str) -> Snapshot | None: ...

    async def take(self, handle: str) -> Snapshot | None: ...

    async def aclose(self) -> None: ...


class RedisStore:
    """:class:`SessionStore` on Redis through ``redis.asyncio`` (the URL carries the password)."""

    def __init__(self, url: str, *, timeout_s: float = 2.0) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.from_url(url, decode_responses=True, socket_timeout=timeout_s,
                                        socket_connect_timeout=timeout_s)

    async def put(self, handle: str, snapshot: Snapshot, ttl_s: float) -> None:
        await self._redis.set(store_key(handle), snapshot.to_json(), px=max(1, int(ttl_s * 1000)))

    async def get(self, handle: str) -> Snapshot | None:
        text = await self._redis.get(store_key(handle))
        return Snapshot.from_json(text) if text else None

    async def take(self, handle: str) -> Snapshot | None:
        text = await self._redis.getdel(store_key(handle))
        return Snapshot.from_json(text) if text else None

    async def aclose(self) -> None:
        await self._redis.aclose()


async def claim(store: SessionStore, handle: str, binding: str, *, wait_final_s: float = 3.0,
                poll_s: float = 0.1) -> tuple[Snapshot | None, str | None]:
    """The entry of ``handle`` taken for this replica, or None and why not (``unknown``, ``unauthorized``).

    An entry written while the session still ran on the draining replica (not ``final``) is waited on up to
    ``wait_final_s``, since that replica writes the final one as soon as the client's old connection is gone;
    a binding that does not match leaves the entry where it is."""
    deadline = time.monotonic() + wait_final_s
    while True:
        snapshot = await store.get(handle)
        if snapshot is None:
            return None, "unknown"
        if snapshot.binding != binding:
            return None, "unauthorized"
        if snapshot.final or time.monotonic() >= deadline:
            break
        await asyncio.sleep(poll_s)
    taken = await store.take(handle)
    if taken is None:
        return None, "unknown"
    return taken, None
