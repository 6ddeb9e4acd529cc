"""An aiortc client peer for kame's WebRTC calls (``/v1/realtime/calls``, ``/v1/live/sessions``): a speaking
track, the ``oai-events`` channel, a recorder.

What a browser does, in Python: create the ``oai-events`` data channel, add
a microphone track (here: PCM played at real time, 20 ms frames, then
silence), POST the offer, apply the answer; then record the events and the
assistant's audio. ``drop`` makes the microphone lose packets on purpose
(frames it never sends), ``mute_after_s`` stops sending altogether (as DTX or
a muted track does).
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 48000
FRAME = 960  # 20 ms


class SpeechTrack(MediaStreamTrack):
    """Plays ``pcm`` (float32 at 48 kHz) in real time, then silence; frames for which ``drop(n)`` is true are
    skipped (never sent: a lost packet); after ``mute_after_s`` no frame is sent at all."""

    kind = "audio"

    def __init__(self, pcm: np.ndarray | None = None, *, drop: Callable[[int], bool] | None = None,
                 mute_after_s: float | None = None) -> None:
        super().__init__()
        self.pcm = np.zeros(0, np.float32) if pcm is None else np.asarray(pcm, np.float32)
        self.drop = drop
        self.mute_after_s = mute_after_s
        self._n = 0
        self._start: float | None = None
        self.sent = 0
        #: set by ``new_peer(mono=True)``: recv codes its own Opus packets (the bench's many peers, cheaper)
        self.encoder: Any = None

    def feed(self, pcm: np.ndarray) -> None:
        """Append audio to say next (from where the track is now)."""
        at = self._n * FRAME
        rest = self.pcm[at:] if len(self.pcm) > at else np.zeros(0, np.float32)
        self.pcm = np.concatenate([self.pcm[:at], np.zeros(max(0, at - len(self.pcm)), np.float32), rest,
                                   np.asarray(pcm, np.float32)])

    async def recv(self) -> Any:
        import av

        if self.readyState != "live":
            raise MediaStreamError
        while True:
            if self._start is None:
                self._start = time.monotonic()
            target = self._start + self._n * FRAME / RATE
            delay = target - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            n = self._n
            self._n += 1
            if self.mute_after_s is not None and n * FRAME / RATE >= self.mute_after_s:
                continue  # nothing is sent any more (the sender keeps its clock)
            if self.drop is not None and self.drop(n):
                continue
            chunk = self.pcm[n * FRAME:(n + 1) * FRAME]
            if len(chunk) < FRAME:
                chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), np.float32)])
            ints = (np.clip(chunk, -1, 1) * 32767).astype(np.int16).reshape(1, -1)
            self.sent += 1
            if self.encoder is not None:
                from kame.server.webrtc.transport import EncodedAudio

                return EncodedAudio(self.encoder.encode(ints.reshape(-1)), n * FRAME)
            frame = av.AudioFrame.from_ndarray(ints, format="s16", layout="mono")
            frame.sample_rate = RATE
            frame.pts = n * FRAME
            frame.time_base = fractions.Fraction(1, RATE)
            return frame


@dataclass
class CallClient:
    """One call from the client side."""

    pc: RTCPeerConnection
    channel: Any
    track: SpeechTrack
    events: list[dict[str, Any]] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)  # 48 kHz mono float32, as received
    audio_t: list[float] = field(default_factory=list)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    location: str | None = None
    answer_status: int | None = None
    _reader: asyncio.Task[Any] | None = None
    _jitter: Any = None  # mono peers: the receiver's PassThroughJitter, its sink set once the answer is in

    def types(self) -> list[str]:
        return [e.get("type", "?") for e in self.events]

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for e in self.events[seen:]:
                if predicate(e):
                    return e
            seen = len(self.events)
            await asyncio.sleep(0.02)
        raise AssertionError(f"no such event within {timeout} s; got {self.types()[-30:]}")

    def pcm(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)

    def vanish(self) -> None:
        """The peer disappears (a closed lid, a lost network): its UDP sockets close and nothing is sent, no
        DTLS close_notify, no SCTP abort, no RTCP BYE, so only ICE consent checks (RFC 7675) can tell the
        server. aiortc has no public call for this: its ICE connection's sockets are closed directly."""
        for transceiver in self.pc.getTransceivers():
            ice = transceiver.sender.transport.transport
            for protocol in list(ice._connection._protocols):
                if protocol.transport is not None:
                    protocol.transport.abort()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()


async def new_peer(track: SpeechTrack | None = None, *, mono: bool = False) -> tuple[CallClient, str]:
    """A browser-like peer (the ``oai-events`` channel, a microphone track, a recorder of events and audio)
    and its SDP offer, not yet sent."""
    pc = RTCPeerConnection()
    channel = pc.createDataChannel("oai-events")
    track = track or SpeechTrack()
    sender = pc.addTrack(track)
    client = CallClient(pc, channel, track)

    @channel.on("open")
    def _open() -> None:
        client.opened.set()

    @channel.on("message")
    def _message(message: str) -> None:
        client.events.append(json.loads(message))

    @pc.on("track")
    def _track(remote: Any) -> None:
        async def read() -> None:
            while True:
                try:
                    frame = await remote.recv()
                except MediaStreamError:
                    return
                a = frame.to_ndarray().astype(np.float32) / 32768.0
                channels = len(frame.layout.channels)
                a = a.reshape(-1, channels).mean(axis=1) if channels > 1 else a.reshape(-1)
                client.audio.append(a)
                client.audio_t.append(time.monotonic())

        client._reader = asyncio.ensure_future(read())

    offer = await pc.createOffer()
    await pc.setLocalDescription(offer)
    if mono:  # the bench's many peers: mono Opus at 32 kbit/s, coded inline, as the server does (see _use_libopus)
        from kame.server.webrtc.opus import OpusEncoder, libopus
        from kame.server.webrtc.transport import MonoOpusEncoder, PreEncoded, use_pass_through_jitter

        if libopus() is not None:
            track.encoder = OpusEncoder(RATE, 1, bitrate=32000)
            sender._RTCRtpSender__encoder = PreEncoded()  # type: ignore[attr-defined]
            client._jitter = use_pass_through_jitter(next(t.receiver for t in pc.getTransceivers() if t.sender is sender))
        else:
            sender._RTCRtpSender__encoder = MonoOpusEncoder(rate=RATE, frame=FRAME)  # type: ignore[attr-defined]
    return client, pc.localDescription.sdp


def _use_libopus(client: CallClient, answer_sdp: str) -> None:
    """A mono peer records the server's Opus as its packets arrive, decoded by libopus at 48 kHz mono on the
    loop: the same audio and arrival times as aiortc's decoder thread (48 kHz stereo, averaged here), without
    a thread hand-off and a numpy conversion per packet, so the bench's 8 peers take less of the machine they
    share with the server."""
    from kame.server.webrtc.opus import OpusDecoder
    from kame.server.webrtc.transport import negotiated_audio_payload

    found = negotiated_audio_payload(answer_sdp)
    if client._jitter is None or found is None or found[0] != "opus":
        return
    decoder = OpusDecoder(RATE, 1)

    def sink(timestamp: int, payload: bytes) -> None:
        if payload:
            client.audio.append(decoder.decode(payload))
            client.audio_t.append(time.monotonic())

    client._jitter.payload_type = found[1]
    client._jitter.sink = sink


async def start_call(base_url: str, *, token: str | None = None, track: SpeechTrack | None = None,
                     session: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                     raise_for_status: bool = True, mono: bool = False) -> CallClient:
    """Offer, POST (raw SDP, or multipart when ``session`` is given), answer; the call's events and audio
    are recorded from then on."""
    client, sdp = await new_peer(track, mono=mono)
    pc = client.pc
    h = {"Accept": "application/sdp", **(headers or {})}
    if token:
        h["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient(timeout=30) as http:
        if session is None:
            r = await http.post(f"{base_url}/v1/realtime/calls", content=sdp,
                                headers={**h, "Content-Type": "application/sdp"})
        else:
            r = await http.post(f"{base_url}/v1/realtime/calls", headers=h,
                                files={"sdp": (None, sdp, "application/sdp"),
                                       "session": (None, json.dumps(session), "application/json")})
    client.answer_status = r.status_code
    if r.status_code != 201:
        await pc.close()
        if raise_for_status:
            raise AssertionError(f"offer refused: {r.status_code} {r.text}")
        client.location = r.text
        return client
    client.location = r.headers.get("location")
    _use_libopus(client, r.text)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
    return client


async def start_live(base_url: str, token: str, session: dict[str, Any], *,
                     track: SpeechTrack | None = None) -> CallClient:
    """A Live WebRTC session through the official SDK (``client.live.create`` with the ``webrtc`` transport);
    ``location`` is the session's id. An SDK error (a refusal) is raised as the SDK raises it."""
    from openai import AsyncOpenAI

    client, sdp = await new_peer(track)
    sdk = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=token, max_retries=0)
    try:
        created = await sdk.live.create(session=session, transport={"type": "webrtc", "sdp": sdp})  # type: ignore[typeddict-item]
    except Exception:
        await client.pc.close()
        raise
    finally:
        await sdk.close()
    client.answer_status = 200
    client.location = created.session.id
    await client.pc.setRemoteDescription(RTCSessionDescription(sdp=created.transport.sdp, type="answer"))
    return client


def wait_sessions(server: Any, active: int, timeout: float = 15.0) -> None:
    """Wait until ``server`` (a ``ServerProcess``) has ``active`` sessions (its ``/health``): a call's session
    outlives the HTTP answer, so a test waits for it rather than reading the count at once."""
    deadline = time.monotonic() + timeout
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        _, health = server.get_json("/health")
        if health["sessions"]["active"] == active:
            return
        time.sleep(0.1)
    raise AssertionError(f"sessions never became {active}: {health.get('sessions')}")
