"""What carries a session's messages and audio: a websocket, or a WebRTC call. The runtime sees only this.

:class:`~kame.server.runtime.session.SessionRuntime` owns the session (pipeline, tasks, send queue,
watchdog, end) whatever carries it; a :class:`Transport` only moves what the wire produced and what the
client sent:

- :meth:`Transport.send` writes one :class:`~kame.server.runtime.wire.Outgoing` (a websocket frame; on
  WebRTC a data channel message, or PCM for the RTP track when ``out.pcm`` is set);
- :meth:`Transport.receive` returns the next client message (a starlette ``websocket.*`` message the wire
  decodes) or a command that needs no wire (:class:`~kame.server.runtime.wire.AudioIn` from RTP,
  :class:`~kame.server.runtime.wire.EndIn` when the peer is gone);
- :meth:`Transport.close` ends it (a close frame; a closed peer connection);
- :meth:`Transport.tasks` names background work the runtime runs and cancels with its own tasks (the
  WebRTC transport's clocked audio input); a websocket has none.

A send to a client that is gone raises :class:`OSError` (or starlette's ``WebSocketDisconnect`` /
``RuntimeError``), which the runtime reads as "client closed".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kame.server.runtime.end import close_reason

if TYPE_CHECKING:
    from starlette.types import Message
    from starlette.websockets import WebSocket

    from kame.server.runtime.wire import AudioIn, EndIn, Outgoing

Work = tuple[str, Callable[[], Awaitable[None]]]


@runtime_checkable
class Transport(Protocol):
    """One session's connection to its client."""

    #: Metrics label and log field (``websocket``, ``webrtc``).
    kind: str

    async def send(self, out: Outgoing) -> None:
        """Write one message (raises when the client is gone)."""

    async def receive(self) -> Message | AudioIn | EndIn:
        """The next client message, or a command that needs no wire."""

    async def close(self, code: int, reason: str) -> None:
        """End the connection (the close frame's ``code`` and ``reason`` where the transport has them)."""

    def tasks(self) -> Sequence[Work]:
        """Background work the runtime runs as tasks of the session (named, cancelled at its end)."""


def as_transport(conn: WebSocket | Transport) -> Transport:
    """``conn`` itself when it is a transport, else the websocket wrapped in one."""
    return conn if isinstance(conn, Transport) else WebSocketTransport(conn)


class WebSocketTransport:
    """A websocket (starlette): text and binary frames both ways; audio travels inside the wire's frames."""

    kind = "websocket"

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def send(self, out: Outgoing) -> None:
        if isinstance(out.data, bytes):
            await self.ws.send_bytes(out.data)
        else:
            await self.ws.send_text(out.data)

    async def receive(self) -> Message:
        return await self.ws.receive()

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code=code, reason=close_reason(reason))

    def tasks(self) -> Sequence[Work]:
        return ()
