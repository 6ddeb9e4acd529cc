"""The ``/api/chat`` wire: Moshi's binary protocol over the session runtime. No I/O.

Client messages (:func:`kame.server.wires.moshi.protocol.decode_client_message`): 0x01
Ogg/Opus audio is decoded to 80 ms frames; 0x03 control, 0x04 metadata, 0x06
ping and a client 0x00 are accepted and ignored; anything else breaks the
protocol and ends the session (1002/1003, a 0x05 error first), as does
corrupt audio (1007). Server messages: 0x00 handshake once the pipeline is
ready, then one 0x04 server-info message (:mod:`kame.server.wires.moshi.server_info`)
and the 0x05 notices about the URL's parameters (:mod:`kame.server.wires.moshi.params`),
0x02 text piece then 0x01 Ogg/Opus audio per output frame (text may be
dropped, audio dropped before encoding, for a client that lags), a 0x05
notice before the maximum duration and when the server drains, and the reason (or the error) of every
close as a 0x05 text message before the close frame. The 0x04 and 0x05 messages
go only to a client that gets kame's messages (``kame_messages``: not PersonaPlex's
clients, which know 0x00-0x02 only). The message formats are in
:mod:`kame.server.wires.moshi.protocol`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from starlette import status

from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
from kame.redaction import client_safe
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.wire import AudioIn, Command, Fault, Ignored, Outgoing, Wire
from kame.server.wires.codec import AudioDecodeError, OpusIn, OpusOut
from kame.server.wires.moshi import protocol
from kame.server.wires.moshi.protocol import ServerInfo
from kame.session.events import AssistantFrame, PipelineEvent, ToolsRefused
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from starlette.types import Message

PROTOCOL = "chat"
PATH = "/api/chat"


class MoshiWire(Wire):
    """One ``/api/chat`` session's codec state. Moshi's protocol has no settings messages (they come only
    with the URL, checked before the session starts), no client functions (its tools are the operator's
    MCP servers), no overflow message (the runtime logs and counts it) and no reset: the base class's
    no-op defaults answer those."""

    protocol = PROTOCOL

    def __init__(self, sample_rate: int = SAMPLE_RATE, frame_size: int = FRAME_SIZE, *, server_info: ServerInfo | None = None,
                 max_duration_s: float = 600.0, vocab: TextVocab = MOSHI_VOCAB, kame_messages: bool = True,
                 notices: Sequence[str] = (), kame_resume: bool = False) -> None:
        self.vocab = vocab
        self._rates = (sample_rate, frame_size)
        #: ``kame_resume=1``: resume handles as 0x04 JSON (a client that did not ask never sees them).
        self.kame_resume = kame_resume
        self._opus_in = OpusIn(sample_rate, frame_size)
        self._opus_out = OpusOut(sample_rate)
        self.server_info = server_info
        self.max_duration_s = max_duration_s
        #: Send kame's 0x04 and 0x05 messages (False: only 0x00, 0x01 and 0x02, for PersonaPlex's clients).
        self.kame_messages = kame_messages
        self.notices = tuple(notices)

    def _notice(self, text: str) -> list[Outgoing]:
        return [Outgoing(protocol.encode_notice(text))] if self.kame_messages else []

    def opening(self, settings: SessionSettings) -> list[Outgoing]:
        out = [Outgoing(protocol.encode_handshake())]
        if self.kame_messages and self.server_info is not None:
            out.append(Outgoing(protocol.encode_server_info(self.server_info)))
        for notice in self.notices:
            out += self._notice(notice)
        return out

    def decode(self, message: Message, now: float) -> list[Command]:
        data = message.get("bytes")
        payload: bytes | str | None = data if data is not None else message.get("text")
        try:
            parsed = protocol.decode_client_message(payload)
        except protocol.ProtocolError as exc:
            end = SessionEnd("protocol", exc.close_code, "protocol error", f"protocol error: {exc}")
            return [Fault(kind=exc.kind, message=f"protocol error: {exc}", end=end)]
        if isinstance(parsed, protocol.ClientAudio):
            try:
                frames = self._opus_in.decode(parsed.payload)
            except AudioDecodeError as exc:
                end = SessionEnd("bad_audio", status.WS_1007_INVALID_FRAME_PAYLOAD_DATA, "corrupt audio", str(exc))
                return [Fault(kind="bad_audio", message=f"bad audio: {exc}", end=end)]
            return [AudioIn(frames)]
        if isinstance(parsed, protocol.ClientControl):
            return [Ignored(f"control message {parsed.action}")]
        return [Ignored(type(parsed).__name__)]

    def frame(self, frame: AssistantFrame, index: int, send_audio: bool) -> list[Outgoing]:
        out: list[Outgoing] = []
        if frame.piece is not None:
            text = protocol.text_message(frame.text_id, frame.piece, self.vocab)
            if text is not None:
                out.append(Outgoing(text, droppable=True))
        if send_audio:
            ogg = self._opus_out.encode(frame.pcm)
            if ogg:
                out.append(Outgoing(protocol.encode_audio(ogg), audio_index=index))
        return out

    def event(self, event: PipelineEvent) -> list[Outgoing]:
        # Moshi's protocol has no transcript or back-end messages; a refusal of tools is a 0x05 notice.
        if isinstance(event, ToolsRefused):
            return self._notice(protocol.tools_refused_notice(event.backend, client_safe(event.reason, 200)))
        return []

    # -- resume (server/runtime/resume.py): 0x04 JSON messages, only with kame_resume=1
    @property
    def resume_offered(self) -> bool:
        return self.kame_resume

    def resumable(self, handle: str, expires_in_s: float) -> list[Outgoing]:
        return [Outgoing(protocol.encode_metadata({"type": "kame.session.resumable", "handle": handle,
                                                   "expires_in_s": round(expires_in_s, 1)}))]

    def resumed(self, info: dict[str, object]) -> list[Outgoing]:
        # a new connection is a new Ogg stream both ways
        self._opus_in = OpusIn(*self._rates)
        self._opus_out = OpusOut(self._rates[0])
        return [Outgoing(protocol.encode_metadata({"type": "kame.session.resumed", **info}))]

    def ending_with_handle(self, reason: str, seconds_left: float, handle: str) -> list[Outgoing]:
        return [*self.draining(seconds_left), Outgoing(protocol.encode_metadata(
            {"type": "kame.session.ending", "reason": reason, "seconds_left": round(seconds_left, 1), "handle": handle}))]

    def expiring(self, seconds_left: float) -> list[Outgoing]:
        return self._notice(protocol.expiring_notice(seconds_left, self.max_duration_s))

    def draining(self, seconds_left: float) -> list[Outgoing]:
        return self._notice(protocol.draining_notice(seconds_left))

    def closing(self, end: SessionEnd) -> list[Outgoing]:
        return self._notice(protocol.close_notice(end.reason, end.error))


def refusal(error: str) -> Outgoing:
    """How an admission refusal's message goes on this wire (a 0x05 error before the close)."""
    return Outgoing(protocol.encode_error(error))
