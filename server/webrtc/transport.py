"""A WebRTC call as a :class:`~kame.server.runtime.transport.Transport`: the ``oai-events`` data channel, RTP audio.

One aiortc :class:`RTCPeerConnection` per call, under the websocket's session runtime
(:mod:`kame.server.runtime.session`); this only moves events (data channel <-> the wire's JSON, sent
in order once the channel opens) and audio. Input Opus is decoded on the process's one codec thread
(:mod:`~kame.server.webrtc.codec_worker`), never on the loop, into
:class:`~kame.server.webrtc.clock.InputClock`, whose clock task hands the runtime one 80 ms frame
every 80 ms, concealed where nothing arrived, so loss, DTX or a muted track never stall Moshi. Output:
:class:`~kame.server.webrtc.clock.OutputBuffer` -> :class:`OutputTrack` (40 ms packets, silence when
idle). No ICE/DTLS within ``connect_timeout_s`` ends the session as ``ice_timeout``; a failed or closed
connection as ``client_closed``. :class:`PassThroughJitter` replaces aiortc's jitter buffer (which
holds every frame ~300 ms after one loss): the input clock is the jitter buffer.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kame.audio.media import SAMPLE_RATE
from kame.audio.pcm import float_to_pcm16
from kame.server.runtime.end import SessionEnd
from kame.server.runtime.frame_clock import every_frame
from kame.server.runtime.wire import FROM_CHANNEL, AudioIn, EndIn, Outgoing
from kame.server.webrtc.clock import InputClock, OutputBuffer
from kame.server.webrtc.codec_worker import codec_worker
from kame.server.webrtc.opus import OpusDecoder, OpusEncoder, OpusError, libopus

if TYPE_CHECKING:
    from aiortc import RTCDataChannel, RTCPeerConnection
    from starlette.types import Message
    from starlette.websockets import WebSocket

    from kame.server.runtime.transport import Work
    from kame.server.webrtc.metrics import WebRtcMetrics

log = logging.getLogger("kame.server.webrtc")

EVENTS_LABEL = "oai-events"
#: Output packets of 40 ms: two per Moshi frame, half the packets (and the per-packet Python work) of 20 ms.
RTP_FRAME = 960
RTP_FRAME_S = RTP_FRAME / SAMPLE_RATE
#: Opus RTP timestamps count 48 kHz ticks whatever the audio's rate (RFC 7587).
RTP_TICKS = 48000 // SAMPLE_RATE
#: Messages kept for a data channel that has not opened yet (then the oldest are dropped).
MAX_PENDING = 2000
#: Data channel bytes buffered towards the peer before a send waits.
MAX_BUFFERED_BYTES = 1 << 20
STATS_INTERVAL_S = 2.0


class PassThroughJitter:
    """aiortc's ``JitterBuffer`` interface, releasing each audio packet at once (one packet = one Opus frame).

    With a ``sink`` set, packets of ``payload_type`` (the call's Opus) go to it instead, on the event loop as
    they arrive (:meth:`WebRtcTransport.use_native_opus`), and aiortc's decoder thread gets nothing: no
    thread hand-off per packet. Other payload types (G.711) still go to aiortc's decoder.
    """

    capacity = 1

    def __init__(self) -> None:
        self.sink: Callable[[int, bytes], None] | None = None
        self.payload_type: int | None = None

    def add(self, packet: Any) -> tuple[bool, Any]:
        if self.sink is not None and packet.payload_type == self.payload_type:
            self.sink(packet.timestamp, packet._data)
            return False, None
        # deferred: aiortc loads with the first WebRTC call (a server without calls never imports it)
        from aiortc.jitterbuffer import JitterFrame

        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)


def use_pass_through_jitter(receiver: Any) -> PassThroughJitter | None:
    """Swap ``receiver``'s audio jitter buffer for a :class:`PassThroughJitter` (aiortc 1.16's private slot)."""
    slot = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, slot):
        log.warning("aiortc's receiver has no %s: its own audio jitter buffer stays (higher latency after loss)", slot)
        return None
    jitter = PassThroughJitter()
    setattr(receiver, slot, jitter)
    return jitter


class MonoOpusEncoder:
    """aiortc's ``Encoder`` interface for the assistant's voice: mono Opus straight from 24 kHz, 32 kbit/s.

    aiortc's own encoder resamples every frame to 48 kHz stereo and codes it at 96 kbit/s: three to four
    times the CPU, for a mono voice that Mimi made at 24 kHz. Opus takes 24 kHz input natively; RTP still
    counts 48 kHz ticks (RFC 7587), so timestamps are doubled. It runs in aiortc's executor, off the loop.
    """

    def __init__(self, bitrate: int = 32000, rate: int = SAMPLE_RATE, frame: int = RTP_FRAME) -> None:
        # deferred: PyAV loads with the first WebRTC call (a server without calls never imports it)
        from av import CodecContext

        self.codec = CodecContext.create("libopus", "w")
        self.codec.bit_rate = bitrate
        self.codec.format = "s16"
        self.codec.layout = "mono"
        self.codec.sample_rate = rate
        self.codec.time_base = fractions.Fraction(1, rate)
        self._ticks = 48000 // rate
        self.codec.options = {"application": "voip", "frame_duration": str(round(1000 * frame / rate))}
        self._first: int | None = None

    def encode(self, frame: Any, force_keyframe: bool = False) -> tuple[list[bytes], int | None]:
        packets = self.codec.encode(frame)
        if not packets:
            return [], None
        if self._first is None:
            self._first = packets[0].pts
        return [bytes(p) for p in packets], (packets[0].pts - self._first) * self._ticks

    def pack(self, packet: Any) -> tuple[list[bytes], int]:  # pre-encoded media: never used here
        raise NotImplementedError


def use_mono_opus(sender: Any, answer_sdp: str) -> bool:
    """Give ``sender`` a :class:`MonoOpusEncoder` when the call's audio codec is Opus (aiortc 1.16's private
    slot, filled before its RTP loop starts; G.711 calls keep aiortc's encoder)."""
    slot = "_RTCRtpSender__encoder"
    if negotiated_audio_codec(answer_sdp) != "opus" or not hasattr(sender, slot):
        return False
    setattr(sender, slot, MonoOpusEncoder())
    return True


def negotiated_audio_codec(sdp: str) -> str | None:
    """The first codec of the first audio section of an answer (lower case), e.g. ``opus`` or ``pcmu``."""
    found = negotiated_audio_payload(sdp)
    return found[0] if found else None


def negotiated_audio_payload(sdp: str) -> tuple[str, int] | None:
    """The first codec of the first audio section of an answer (lower case) and its RTP payload type."""
    payload = None
    for line in sdp.replace("\r\n", "\n").split("\n"):
        if line.startswith("m=audio ") and payload is None:
            parts = line.split()
            payload = parts[3] if len(parts) > 3 else ""
        elif payload is not None and line.startswith(f"a=rtpmap:{payload} "):
            if not payload.isdigit():
                return None
            return line.split(" ", 1)[1].split("/")[0].lower(), int(payload)
    return None


class PreEncoded:
    """aiortc's ``Encoder`` interface for a track whose ``recv`` returns :class:`EncodedAudio` (Opus coded for
    the track by the codec thread, batched): aiortc only packs it, with no executor hop per packet."""

    def encode(self, frame: Any, force_keyframe: bool = False) -> tuple[list[bytes], int | None]:
        raise NotImplementedError("the track sends pre-encoded audio")

    def pack(self, packet: EncodedAudio) -> tuple[list[bytes], int]:
        return [packet.payload], packet.timestamp


class EncodedAudio:
    """One Opus packet from :class:`OutputTrack` and its RTP timestamp (48 kHz ticks from 0)."""

    __slots__ = ("payload", "timestamp")

    def __init__(self, payload: bytes, timestamp: int) -> None:
        self.payload = payload
        self.timestamp = timestamp


class DecoderTo24k:
    """aiortc's audio ``Decoder`` followed by a resampler to 24 kHz mono float32, both in aiortc's decoder
    thread (the event loop only places the samples)."""

    def __init__(self, inner: Any) -> None:
        # deferred: PyAV loads with the first WebRTC call (a server without calls never imports it)
        import av

        self.inner = inner
        self.resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)

    def decode(self, encoded_frame: Any) -> list[Any]:
        out: list[Any] = []
        for frame in self.inner.decode(encoded_frame):
            pts, base = frame.pts, frame.time_base
            pcm = [f.to_ndarray().reshape(-1) for f in self.resampler.resample(frame)]
            out.append(Decoded24k(np.concatenate(pcm) if pcm else np.zeros(0, np.float32), pts, base))
        return out


class Decoded24k:
    """One decoded frame at 24 kHz: the samples and the source frame's timestamp."""

    def __init__(self, pcm: np.ndarray, pts: int | None, time_base: Any) -> None:
        self.pcm = pcm
        self.pts = pts
        self.time_base = time_base


_decoders_installed = False


def install_decoders() -> None:
    """Make aiortc's receivers decode audio through :class:`DecoderTo24k` (its module's ``get_decoder``,
    looked up per codec change by its decoder thread; video keeps aiortc's)."""
    global _decoders_installed
    if _decoders_installed:
        return
    # deferred: aiortc loads with the first WebRTC call (a server without calls never imports it)
    from aiortc import rtcrtpreceiver

    original = rtcrtpreceiver.get_decoder

    def get_decoder(codec: Any) -> Any:
        decoder = original(codec)
        return DecoderTo24k(decoder) if codec.mimeType.lower().startswith("audio/") else decoder

    rtcrtpreceiver.get_decoder = get_decoder
    _decoders_installed = True


def _output_track_class() -> type:
    # deferred: aiortc loads with the first WebRTC call (a server without calls never imports it)
    from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

    class OutputTrack(MediaStreamTrack):
        """The assistant's audio: 40 ms packets from the output buffer, paced on the loop's clock."""

        kind = "audio"

        def __init__(self, buffer: OutputBuffer) -> None:
            super().__init__()
            self.buffer = buffer
            #: set for an Opus call when libopus loads: recv codes the packet itself (:class:`PreEncoded`)
            self.encoder: OpusEncoder | None = None
            self._start: float | None = None
            self._n = 0
            self.late_restarts = 0

        async def recv(self) -> Any:
            # deferred: PyAV loads with the first WebRTC call (a server without calls never imports it)
            import av

            if self.readyState != "live":
                raise MediaStreamError
            loop = asyncio.get_running_loop()
            now = loop.time()
            if self._start is None:
                self._start = now
            target = self._start + self._n * RTP_FRAME_S
            if target > now:
                await asyncio.sleep(target - now)
            elif now - target > 0.25:  # the loop stalled: go on from now rather than burst
                self.late_restarts += 1
                self._start = now - self._n * RTP_FRAME_S
            pcm = self.buffer.take()
            if self.encoder is not None:  # coded off the loop, batched with every call's (codec_worker)
                payload = await codec_worker().run(self.encoder.encode, float_to_pcm16(pcm))
                packet = EncodedAudio(payload, self._n * RTP_FRAME * RTP_TICKS)
                self._n += 1
                return packet
            ints = float_to_pcm16(pcm).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(ints, format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.pts = self._n * RTP_FRAME
            frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
            self._n += 1
            return frame

    return OutputTrack


class WebRtcTransport:
    """One call's peer connection under a session runtime."""

    kind = "webrtc"

    def __init__(
        self,
        pc: RTCPeerConnection,
        *,
        call_id: str,
        connect_timeout_s: float,
        metrics: WebRtcMetrics | None = None,
        input_delay_s: float = 0.06,
        output_prefill_s: float = 0.04,
    ) -> None:
        """``channel_allows`` (set before the call runs; None: everything) decides which server messages the
        page's data channel gets; a sideband gets them all."""
        self.pc = pc
        self.call_id = call_id
        self.connect_timeout_s = connect_timeout_s
        self.metrics = metrics
        self.clock = InputClock(delay=round(input_delay_s * SAMPLE_RATE))
        self.output = OutputBuffer(rtp_frame=RTP_FRAME, prefill=round(output_prefill_s * SAMPLE_RATE))
        self.output_track = _output_track_class()(self.output)
        self.channel: RTCDataChannel | None = None
        self.connected = asyncio.Event()
        self.created = time.monotonic()
        self.connected_at: float | None = None
        self._incoming: asyncio.Queue[Message | AudioIn | EndIn] = asyncio.Queue()
        self._pending: deque[str | bytes] = deque(maxlen=MAX_PENDING)
        self._track: Any = None
        self._track_ready = asyncio.Event()
        self._sidebands: set[WebSocket] = set()
        self._closed = False
        self._reported = {"concealed": 0, "late": 0, "resyncs": 0, "underruns": 0, "cleared": 0, "lost_in": 0}
        self.ended_reason: str | None = None
        self.channel_allows: Callable[[str | bytes], bool] | None = None
        self._opus_in: OpusDecoder | None = None  #: used only by the codec worker's thread
        #: (position, samples) the codec worker decoded, for the loop's clock (appended there, drained here)
        self._decoded: deque[tuple[int, np.ndarray]] = deque()
        self._ts0: int | None = None  # the first Opus packet's RTP timestamp: position 0
        self.opus_errors = 0
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)

    # ------------------------------------------------------------------ codecs
    def use_native_opus(self, sender: Any, jitter: PassThroughJitter | None, answer_sdp: str) -> bool:
        """For an Opus call, when libopus loads (:mod:`~kame.server.webrtc.opus`): input packets go from
        ``jitter``'s sink to the codec thread, decoded straight to 24 kHz, and the output track has its packets
        coded there too (``sender`` packs them). Else (G.711, no libopus) aiortc's codecs stay."""
        found = negotiated_audio_payload(answer_sdp)
        slot = "_RTCRtpSender__encoder"
        if found is None or found[0] != "opus" or libopus() is None or not hasattr(sender, slot):
            return False
        self.output_track.encoder = OpusEncoder(SAMPLE_RATE, 1, bitrate=32000)
        setattr(sender, slot, PreEncoded())
        if jitter is not None and self._opus_in is None:  # the first audio section only (the one played)
            self._opus_in = OpusDecoder(SAMPLE_RATE, 1)
            jitter.payload_type = found[1]
            jitter.sink = self._on_opus
        return True

    def _on_opus(self, timestamp: int, payload: bytes) -> None:
        """One Opus packet (on the loop, as it arrives): its place on the timeline from its RTP timestamp, and
        its decoding to the codec worker (:mod:`~kame.server.webrtc.codec_worker`)."""
        if self._closed or self._opus_in is None or not payload:
            return
        if self._ts0 is None:
            self._ts0 = timestamp
        delta = (timestamp - self._ts0) & 0xFFFFFFFF  # RTP timestamps wrap at 2**32
        if delta >= 1 << 31:  # reordered before the first packet
            delta -= 1 << 32
        codec_worker().submit(self._decode, self._opus_in, delta // RTP_TICKS, payload)

    def _decode(self, decoder: OpusDecoder, position: int, payload: bytes) -> None:
        """On the codec worker's thread: one packet -> 24 kHz samples for the clock."""
        try:
            pcm = decoder.decode(payload)
        except OpusError:
            self.opus_errors += 1  # a corrupt packet: its stretch is concealed by the clock
            return
        self._decoded.append((position, pcm))

    def input_frame(self) -> np.ndarray:
        """The next 80 ms input frame of the server's clock, with every packet decoded so far placed first."""
        decoded = self._decoded
        while decoded:
            position, pcm = decoded.popleft()
            self.clock.push(position, pcm)
        return self.clock.take()

    # ------------------------------------------------------------------ peer events
    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_LABEL or self.channel is not None:
            log.info("call %s: data channel %r ignored", self.call_id, channel.label[:32])
            return
        self.channel = channel

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            key = "text" if isinstance(message, str) else "bytes"
            self._incoming.put_nowait({"type": "websocket.receive", key: message, FROM_CHANNEL: True})

        @channel.on("open")
        def on_open() -> None:
            self._flush_pending()

        if channel.readyState == "open":
            self._flush_pending()

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio" and self._track is None:
            self._track = track
            self._track_ready.set()

    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and not self.connected.is_set():
            self.connected_at = time.monotonic()
            self.connected.set()
            if self.metrics is not None:
                self.metrics.connect_seconds.observe(self.connected_at - self.created)
        elif state in ("failed", "closed") and not self._closed:
            log.info("call %s: peer connection %s", self.call_id, state)
            self._incoming.put_nowait(EndIn(SessionEnd("client_closed", None, f"peer connection {state}")))

    def _flush_pending(self) -> None:
        channel = self.channel
        while channel is not None and channel.readyState == "open" and self._pending:
            channel.send(self._pending.popleft())

    # ------------------------------------------------------------------ Transport
    async def send(self, out: Outgoing) -> None:
        if self._closed:
            raise ConnectionError("call closed")
        if out.clear_audio:
            dropped = self.output.clear()
            if self.metrics is not None and dropped:
                self.metrics.output_cleared_s.inc(dropped / SAMPLE_RATE)
        if out.pcm is not None:
            self.output.push(out.pcm)
            return
        if not out.data:
            return
        for ws in list(self._sidebands):
            await self._to_sideband(ws, out.data)
        if self.channel_allows is not None and not self.channel_allows(out.data):
            return  # withheld from the page (a Live session's allowed_server_events)
        channel = self.channel
        if channel is None or channel.readyState != "open":
            if channel is not None and channel.readyState == "closed":
                raise ConnectionError("data channel closed")
            self._pending.append(out.data)
            return
        self._flush_pending()
        channel.send(out.data)
        while channel.bufferedAmount > MAX_BUFFERED_BYTES and channel.readyState == "open":
            await asyncio.sleep(0.02)  # the peer does not read: the runtime's slow-client watch decides

    async def receive(self) -> Message | AudioIn | EndIn:
        return await self._incoming.get()

    async def close(self, code: int, reason: str) -> None:
        await self.shutdown()

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ws in list(self._sidebands):
            await _quiet(ws.close(code=1000, reason="call ended"))
        try:
            await asyncio.wait_for(self.pc.close(), 3.0)
        except Exception:  # noqa: BLE001 - a peer connection that cannot close cleanly is gone anyway
            log.debug("call %s: closing the peer connection failed", self.call_id, exc_info=True)
        self._report_stats()

    def tasks(self) -> Sequence[Work]:
        return (("rtc-connect", self._connect_watch), ("rtc-clock", self._clock_loop),
                ("rtc-input", self._input_loop), ("rtc-stats", self._stats_loop))

    def inject(self, message: Message) -> None:
        """A message the server itself sends the wire, as if a trusted client had (a Live call's
        ``session.start`` from the create request), ahead of everything the peers send."""
        self._incoming.put_nowait(message)

    # ------------------------------------------------------------------ sideband (?call_id=, /attach)
    def attach(self, ws: WebSocket) -> None:
        self._sidebands.add(ws)

    def detach(self, ws: WebSocket) -> None:
        self._sidebands.discard(ws)

    def from_sideband(self, message: Message) -> None:
        if message.get("type") == "websocket.receive":
            self._incoming.put_nowait(message)

    async def _to_sideband(self, ws: WebSocket, data: str | bytes) -> None:
        try:
            await asyncio.wait_for(ws.send_text(data) if isinstance(data, str) else ws.send_bytes(data), 1.0)
        except Exception:  # noqa: BLE001 - a sideband that is gone or slow is dropped, the call goes on
            self._sidebands.discard(ws)

    # ------------------------------------------------------------------ tasks
    async def _connect_watch(self) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), self.connect_timeout_s)
        except asyncio.TimeoutError:
            log.warning("call %s: ICE/DTLS not connected within %.0f s", self.call_id, self.connect_timeout_s)
            self._incoming.put_nowait(EndIn(SessionEnd(
                "ice_timeout", None, "ICE/DTLS never connected",
                f"the WebRTC connection was not established within {self.connect_timeout_s:g} s")))

    async def _clock_loop(self) -> None:
        """One input frame every 80 ms of the server's clock, whatever arrived."""
        await every_frame(lambda: self._incoming.put_nowait(AudioIn([self.input_frame()])))

    async def _input_loop(self) -> None:
        """Decoded RTP frames (24 kHz mono, from aiortc's decoder thread) -> placed on the sender's timeline."""
        # deferred: aiortc loads with the first WebRTC call (a server without calls never imports it)
        from aiortc.mediastreams import MediaStreamError

        await self._track_ready.wait()
        track = self._track
        expected: int | None = None
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pcm = frame.pcm if isinstance(frame, Decoded24k) else _to_24k(frame)
            if frame.pts is None or frame.time_base is None:
                position = expected if expected is not None else 0
            else:
                position = int(round(float(frame.pts * frame.time_base) * SAMPLE_RATE))
                if expected is not None and abs(position - expected) <= 96:  # the resampler's own delay
                    position = expected
            self.clock.push(position, pcm)
            expected = position + len(pcm)

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            self._report_stats()
            await self._report_rtp_stats()

    def _report_stats(self) -> None:
        m = self.metrics
        if m is None:
            return
        s, o, r = self.clock.stats, self.output.stats, self._reported
        values = {"concealed": s.concealed, "late": s.late_dropped, "resyncs": s.resyncs, "underruns": o.underruns}
        for key, value in values.items():
            delta = value - r[key]
            if delta <= 0:
                continue
            r[key] = value
            if key == "concealed":
                m.input_concealed_s.inc(delta / SAMPLE_RATE)
            elif key == "late":
                m.input_late_s.inc(delta / SAMPLE_RATE)
            elif key == "resyncs":
                m.input_resyncs.inc(delta)
            else:
                m.output_underruns.inc(delta)

    async def _report_rtp_stats(self) -> None:
        m = self.metrics
        if m is None:
            return
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind != "audio":
                continue
            report = await transceiver.receiver.getStats()
            for stat in report.values():
                if getattr(stat, "type", None) != "inbound-rtp":
                    continue
                lost = max(0, int(stat.packetsLost))
                if lost > self._reported["lost_in"]:
                    m.packets_lost.labels(direction="in").inc(lost - self._reported["lost_in"])
                    self._reported["lost_in"] = lost
                codec_rate = 48000
                m.jitter_seconds.observe(max(0, int(stat.jitter)) / codec_rate)


def _to_24k(frame: Any) -> np.ndarray:
    """A frame aiortc decoded itself (the decoders were not installed): 24 kHz mono float32."""
    # deferred: PyAV loads with the first WebRTC call (a server without calls never imports it)
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    pcm = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    return np.concatenate(pcm) if pcm else np.zeros(0, np.float32)


async def _quiet(work: Any) -> None:
    try:
        await asyncio.wait_for(work, 1.0)
    except Exception:  # noqa: BLE001
        pass
