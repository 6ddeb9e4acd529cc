"""A SIP call as a :class:`~kame.server.runtime.transport.Transport`: the phone's audio via the SIP child.

The child (:mod:`~kame.server.telephony.child`) hands over 20 ms of 8 kHz PCM as PJSIP's jitter buffer
plays it out; here it is resampled to 24 kHz (:class:`~kame.audio.pcm.StreamResampler`) and placed on an
:class:`~kame.server.webrtc.clock.InputClock` whose clock task gives the runtime one 80 ms frame every
80 ms, as on a WebRTC call, so a stalled child or a lost stretch never stalls Moshi. The reply leaves
through an :class:`~kame.server.webrtc.clock.OutputBuffer`, 40 ms at a time on the loop's clock,
resampled to 8 kHz. A phone has no data channel: server events go only to sidebands
(``/v1/realtime?call_id=``, ``/v1/live/sessions/{id}/attach``), whose client events drive the session;
the keypad's DTMF arrives as ``input_audio_buffer.dtmf_event_received`` (Realtime) or
``transport.dtmf.received`` (Live), and a Live sideband's ``transport.dtmf.send`` is sent to the phone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.audio.pcm import StreamResampler, float_to_pcm16_bytes, pcm16_to_float
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.frame_clock import every_frame
from kame.server.runtime.wire import AudioIn, EndIn, Outgoing
from kame.server.telephony import ipc
from kame.server.wires.peek import peek

if TYPE_CHECKING:
    from starlette.types import Message
    from starlette.websockets import WebSocket

    from kame.server.runtime.transport import Work
    from kame.server.telephony.metrics import SipMetrics

log = logging.getLogger("kame.server.sip")

#: Reply audio sent to the child per message: two RTP packets (fewer messages than one per packet).
OUT_CHUNK_S = 0.04
OUT_CHUNK = round(OUT_CHUNK_S * SAMPLE_RATE)
DTMF_KEYS = frozenset("0123456789*#ABCD")
#: Events a sideband sends this transport itself (the wire never sees them).
_DTMF_SEND = "transport.dtmf.send"


class SipTransport:
    """One answered SIP call under a session runtime (``send_child``: writes one IPC frame to the child)."""

    kind = "sip"

    def __init__(self, *, call_id: str, cid: int, api: str, send_child: Callable[[bytes], None],
                 metrics: SipMetrics | None = None, input_delay_s: float = 0.06) -> None:
        from kame.server.webrtc.clock import InputClock, OutputBuffer

        self.call_id = call_id
        self.cid = cid
        self.api = api  # "realtime" or "live": which DTMF events the sideband gets
        self.send_child = send_child
        self.metrics = metrics
        self.clock = InputClock(delay=round(input_delay_s * SAMPLE_RATE))
        self.output = OutputBuffer(rtp_frame=OUT_CHUNK, prefill=OUT_CHUNK)
        self._up = StreamResampler(ipc.RATE, SAMPLE_RATE)
        self._down = StreamResampler(SAMPLE_RATE, ipc.RATE)
        self._position = 0
        self._incoming: asyncio.Queue[Message | AudioIn | EndIn] = asyncio.Queue()
        self._sidebands: set[WebSocket] = set()
        self._closed = False
        self.frames_in = 0
        self.ended_reason: str | None = None
        self.media_at: float | None = None
        self.pending_dtmf: dict[str, str | None] = {}

    # ------------------------------------------------------------------ from the child
    def audio_in(self, pcm16: bytes) -> None:
        """20 ms of the caller at 8 kHz (on the loop, as the child sends it)."""
        if self._closed:
            return
        self.frames_in += 1
        pcm = self._up.push(pcm16_to_float(pcm16))
        if len(pcm):
            self.clock.push(self._position, pcm)
            self._position += len(pcm)

    def dtmf_in(self, digit: str) -> None:
        if digit not in DTMF_KEYS:
            return
        if self.metrics is not None:
            self.metrics.dtmf.labels(direction="in").inc()
        if self.api == "live":
            event: dict[str, Any] = {"type": "transport.dtmf.received", "event_id": _event_id(), "event": digit}
        else:
            event = {"type": "input_audio_buffer.dtmf_event_received", "event": digit, "received_at": int(time.time())}
        self._to_sidebands(json.dumps(event))

    def dtmf_sent(self, digits: str, ref: str | None) -> None:
        if self.metrics is not None:
            self.metrics.dtmf.labels(direction="out").inc()
        event: dict[str, Any] = {"type": "transport.dtmf.sent", "event_id": _event_id(), "event": digits}
        if ref:
            event["client_event_id"] = ref
        self._to_sidebands(json.dumps(event))

    def peer_ended(self, code: int, reason: str) -> None:
        """The phone hung up (or the call failed)."""
        if not self._closed:
            self._incoming.put_nowait(EndIn(SessionEnd("client_closed", None, f"phone hung up ({code} {reason})"[:120])))

    def end(self, label: str, reason: str) -> None:
        if not self._closed:
            self._incoming.put_nowait(EndIn(SessionEnd(label, None, reason)))

    # ------------------------------------------------------------------ Transport
    async def send(self, out: Outgoing) -> None:
        if self._closed:
            raise ConnectionError("call closed")
        if out.clear_audio:
            self.output.clear()
        if out.pcm is not None:
            self.output.push(out.pcm)
            return
        if out.data:
            self._to_sidebands(out.data)

    async def receive(self) -> Message | AudioIn | EndIn:
        return await self._incoming.get()

    async def close(self, code: int, reason: str) -> None:
        await self.shutdown()

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.send_child(ipc.control(self.cid, op="hangup"))
        for ws in list(self._sidebands):
            try:
                await asyncio.wait_for(ws.close(code=1000, reason="call ended"), 1.0)
            except Exception:  # noqa: BLE001 - a sideband that is gone
                pass
        self._sidebands.clear()

    def tasks(self) -> Sequence[Work]:
        return (("sip-clock", self._clock_loop), ("sip-output", self._output_loop))

    def inject(self, message: Message) -> None:
        """A message the server itself gives the wire first (a Live accept's ``session.start``)."""
        self._incoming.put_nowait(message)

    # ------------------------------------------------------------------ sideband
    def attach(self, ws: WebSocket) -> None:
        self._sidebands.add(ws)

    def detach(self, ws: WebSocket) -> None:
        self._sidebands.discard(ws)

    def from_sideband(self, message: Message) -> None:
        if message.get("type") != "websocket.receive":
            return
        text = message.get("text")
        if isinstance(text, str) and _DTMF_SEND in text:
            etype, event_id = peek(text)
            if etype == _DTMF_SEND:
                self._dtmf_send(text, event_id)
                return
        self._incoming.put_nowait(message)

    def _dtmf_send(self, text: str, event_id: str | None) -> None:
        try:
            key = json.loads(text).get("event")
        except (ValueError, AttributeError):
            key = None
        if self.api != "live":
            self._sideband_error("unknown_event", "transport.dtmf.send is a Live API event", event_id)
        elif not isinstance(key, str) or key not in DTMF_KEYS:
            self._sideband_error("invalid_value", "transport.dtmf.send needs event: one of 0-9, A-D, * or #", event_id)
        else:
            self.send_child(ipc.control(self.cid, op="dtmf", digits=key, ref=event_id))

    def _sideband_error(self, code: str, message: str, event_id: str | None) -> None:
        error: dict[str, Any] = {"type": "invalid_request_error", "code": code, "message": message}
        if event_id:
            error["client_event_id"] = event_id
        self._to_sidebands(json.dumps({"type": "error", "event_id": _event_id(), "error": error}))

    def _to_sidebands(self, data: str | bytes) -> None:
        for ws in list(self._sidebands):
            asyncio.get_running_loop().create_task(self._to_sideband(ws, data))

    async def _to_sideband(self, ws: WebSocket, data: str | bytes) -> None:
        try:
            await asyncio.wait_for(ws.send_text(data) if isinstance(data, str) else ws.send_bytes(data), 1.0)
        except Exception:  # noqa: BLE001 - a sideband that is gone or slow is dropped, the call goes on
            self._sidebands.discard(ws)

    # ------------------------------------------------------------------ tasks
    async def _clock_loop(self) -> None:
        """One input frame every 80 ms of the server's clock, whatever the child delivered."""
        await every_frame(lambda: self._incoming.put_nowait(AudioIn([self.clock.take()])))

    async def _output_loop(self) -> None:
        """40 ms of reply every 40 ms (silence when none waits), at 8 kHz, to the child's call port."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        n = 0
        carry = np.zeros(0, np.float32)
        while True:
            target = start + n * OUT_CHUNK_S
            now = loop.time()
            if target > now:
                await asyncio.sleep(target - now)
            elif now - target > 0.25:
                start, n = now, 0
            n += 1
            pcm = np.concatenate([carry, self._down.push(self.output.take())])
            whole = len(pcm) - len(pcm) % ipc.FRAME_SAMPLES
            carry = pcm[whole:]
            if whole and not self._closed:
                self.send_child(ipc.audio(self.cid, float_to_pcm16_bytes(pcm[:whole])))


def _event_id() -> str:
    return "event_" + uuid.uuid4().hex[:20]
