"""``kame mic``: talk to a kame server from a terminal (microphone or wav files).

Either protocol works: ``realtime`` (``/v1/realtime``, shows the user's
transcript, the oracle answer and the assistant's text) or ``moshi``
(``/api/chat``, Moshi's binary protocol: assistant text only). With
``--input-wav`` no sound device is touched: the file is streamed at real
time, the line stays open ``tail_s`` seconds for the reply, and everything
the server sent is written to ``--output-wav``.

A refused session (1013: full or starting; HTTP 503 from a load balancer)
and a drained one (1001: the replica is shutting down) are retried with
back-off and jitter (:mod:`kame.client.reconnect`), saying so on the
``state`` line. Where the server gave the session a resume handle, a dropped
connection or a drain reconnects with it and the same conversation goes on
(said on the state line); otherwise a reconnect starts a new conversation.
With ``--input-wav`` the rest of the file goes to the session either way.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse, urlunparse

import numpy as np

from kame.audio.echo import EchoCanceller, EchoPath, read_impulse_response
from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
from kame.audio.pcm import float_to_pcm16
from kame.client.reconnect import (
    Backoff,
    GaveUp,
    Refused,
    Retrier,
    describe,
    latest_handle,
    open_with_retry,
    resume_reason,
    retry_reason,
)
from kame.errors import UserError

RATE = SAMPLE_RATE
FRAME = FRAME_SIZE


@dataclass(frozen=True)
class MicOptions:
    server: str = "http://127.0.0.1:8998"
    protocol: str = "realtime"
    backend: str | None = None
    token: str | None = None
    input_wav: Path | None = None
    output_wav: Path | None = None
    tail_s: float = 4.0
    instructions: str | None = None
    oracle_policy: str | None = None
    voice: str | None = None  # a PersonaPlex checkpoint's voice (GET /health lists them)
    backoff: Backoff = Backoff()  # attempts=0: no reconnecting
    aec: bool = True  # cancel the echo of the reply in the microphone (--no-aec: off)
    echo_path: Path | None = None  # --input-wav only: a simulated speaker and room (an impulse response)
    record_wav: Path | None = None  # --echo-path only: what the microphone heard and what was sent


def websocket_url(server: str, protocol: str) -> str:
    """``http(s)://host:port`` -> the websocket URL of ``protocol`` (ws/wss)."""
    parsed = urlparse(server if "://" in server else f"http://{server}")
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parsed.scheme)
    if scheme is None or not parsed.netloc:
        raise UserError(f"--server {server}: expected http(s)://host:port")
    path = "/v1/realtime" if protocol == "realtime" else "/api/chat"
    return urlunparse((scheme, parsed.netloc, parsed.path.rstrip("/") + path, "", "", ""))


# --------------------------------------------------------------------------- terminal display


class Display:
    """Line-oriented live view: user transcript, oracle answer, assistant text, state."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self.assistant = ""

    def line(self, label: str, text: str) -> None:
        self.out.write(f"{label:>9} | {text}\n")
        self.out.flush()

    def state(self, text: str) -> None:
        self.line("state", text)

    def assistant_piece(self, piece: str) -> None:
        self.assistant += piece
        if piece.endswith((".", "?", "!")) or len(self.assistant) > 70:
            self.flush_assistant()

    def flush_assistant(self) -> None:
        if self.assistant.strip():
            self.line("kame", self.assistant.strip())
        self.assistant = ""


# --------------------------------------------------------------------------- sound devices


def _sounddevice() -> Any:
    try:
        import sounddevice
    except (ImportError, OSError) as exc:
        raise UserError(
            f"no sound I/O here ({exc}); install PortAudio (Debian: apt install libportaudio2) and "
            "`pip install sounddevice`, or use --input-wav/--output-wav"
        ) from None
    return sounddevice


class PlayBuffer:
    """A small jitter buffer between the event loop (received audio) and the player (a sound card's
    callback, or the simulated speaker of ``--echo-path``): what ``fill`` writes is what is played."""

    def __init__(self, prebuffer_s: float = 0.12) -> None:
        self._buf: collections.deque[np.ndarray] = collections.deque()
        self._lock = threading.Lock()
        self._queued = 0
        self._started = False
        self._prebuffer = int(prebuffer_s * RATE)
        self.underruns = 0

    def push(self, pcm: np.ndarray) -> None:
        with self._lock:
            self._buf.append(np.asarray(pcm, np.float32).reshape(-1))
            self._queued += pcm.size

    def fill(self, out: np.ndarray) -> None:
        """Write the next ``out.size`` samples to play into ``out`` (silence where none came)."""
        frames = out.size
        out[:] = 0
        with self._lock:
            if not self._started and self._queued < self._prebuffer:
                return
            self._started = True
            filled = 0
            while filled < frames and self._buf:
                head = self._buf[0]
                take = min(frames - filled, head.size)
                out[filled : filled + take] = head[:take]
                filled += take
                self._queued -= take
                if take == head.size:
                    self._buf.popleft()
                else:
                    self._buf[0] = head[take:]
            if filled < frames and self._started:
                self.underruns += 1


class Duplex:
    """One full-duplex sound stream: the microphone and the speaker on one clock.

    Each callback plays the next block of the reply and captures one block of the microphone; with
    a canceller the block just played is its reference, so the echo of the reply is removed from the
    microphone before it is sent. The capture-plus-playback latency PortAudio reports is the
    canceller's delay hint (AEC3 estimates the actual delay itself)."""

    def __init__(self, sd: Any, canceller: EchoCanceller | None, on_block: Callable[[np.ndarray], None]) -> None:
        self.play = PlayBuffer()
        self.canceller = canceller
        self.on_block = on_block
        self.stream = sd.Stream(samplerate=RATE, channels=1, dtype="float32", blocksize=480, callback=self._cb)
        if canceller is not None:
            latency = self.stream.latency
            canceller.delay_ms = int(1000 * (sum(latency) if isinstance(latency, (tuple, list)) else latency))

    def _cb(self, indata: np.ndarray, outdata: np.ndarray, _frames: int, _t: Any, _status: Any) -> None:
        out = outdata[:, 0]
        self.play.fill(out)
        mic = indata[:, 0].copy()
        if self.canceller is not None:
            self.canceller.far(out)
            mic = self.canceller.near(mic)
        self.on_block(mic)


class EchoSimulation:
    """``--echo-path``: a simulated speaker and microphone for ``--input-wav``, frame by frame.

    The reply goes through the same jitter buffer as on a sound card; what is played is convolved with
    the room impulse response (its leading silence is the delay) and mixed into the file's audio,
    which is what the "microphone" hears; with a canceller, what is played is its reference. Both the
    microphone signal and what is sent are kept for ``--record-wav``."""

    def __init__(self, ir: np.ndarray, canceller: EchoCanceller | None) -> None:
        self.play = PlayBuffer()
        self.path = EchoPath(ir, FRAME)
        self.canceller = canceller
        self.mic: list[np.ndarray] = []
        self.sent: list[np.ndarray] = []
        self.played: list[np.ndarray] = []
        self.user: list[np.ndarray] = []

    def step(self, user: np.ndarray) -> np.ndarray:
        """One frame of the user's audio in, the frame to send out."""
        user = np.pad(np.asarray(user, np.float32), (0, FRAME - user.size))
        played = np.zeros(FRAME, np.float32)
        self.play.fill(played)
        mic = np.clip(user + self.path.play(played), -1.0, 1.0)  # the microphone's converter clips
        sent = mic
        if self.canceller is not None:
            self.canceller.far(played)
            sent = self.canceller.near(mic)
        self.mic.append(mic)
        self.sent.append(sent)
        self.played.append(played)
        self.user.append(user)
        return sent

    def echo_report(self) -> str | None:
        """How loud the echo was and what was left of it: the echo return loss enhancement over the
        frames where the reply played (after its first 2 s, the canceller's convergence) and the
        file was silent (the simulation knows the user's audio: no double talk counted)."""
        if not self.mic:
            return None
        played_on = np.cumsum([np.mean(p**2) > 1e-7 for p in self.played])
        quiet = [np.mean(u**2) < 1e-7 for u in self.user]
        keep = np.array([q and n * FRAME > 2 * RATE for q, n in zip(quiet, played_on)])
        if keep.sum() * FRAME < RATE:
            return "echo: under 1 s of reply played past its first 2 s while the file was silent: nothing to measure"
        frames = np.repeat(keep, FRAME)
        mic, sent = np.concatenate(self.mic)[frames], np.concatenate(self.sent)[frames]

        def db(x: np.ndarray) -> float:
            return float(10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-12))

        m, o = db(mic), db(sent)
        what = "cancelled" if self.canceller is not None else "not cancelled (--no-aec)"
        return (f"echo {what}: microphone {m:.1f} dBFS, sent {o:.1f} dBFS after 2 s of reply with the file silent "
                f"(echo return loss enhancement {m - o:.1f} dB)")

    def write_record(self, path: Path) -> None:
        """A 2-channel wav: left what the microphone heard, right what was sent."""
        import wave

        mic = np.concatenate(self.mic) if self.mic else np.zeros(0, np.float32)
        sent = np.concatenate(self.sent) if self.sent else np.zeros(0, np.float32)
        both = np.stack([mic, sent], axis=1)
        ints = float_to_pcm16(both)
        path.parent.mkdir(parents=True, exist_ok=True)
        with wave.open(str(path), "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(ints.tobytes())


# --------------------------------------------------------------------------- sessions


@dataclass
class _Resume:
    """The session's resume handle (None: the next connection starts a new conversation), and whether the
    client left on its own after a drain's notice to resume elsewhere."""

    handle: str | None = None
    moving: bool = False


def _handle_events(client: Any, protocol: str) -> list[Any]:
    if protocol == "realtime":
        return [ev for _, ev in client.events]
    return list(client.metadata)


async def _open_session(opts: MicOptions, resume: _Resume | None = None) -> Any:
    url = websocket_url(opts.server, opts.protocol)
    again = {"resume": resume.handle} if resume is not None and resume.handle else {}
    if opts.protocol == "realtime":
        from kame.client.realtime_client import RealtimeClient

        return await RealtimeClient.connect(url, token=opts.token, query=again or None)
    from kame.client.moshi_client import MoshiClient

    query: dict[str, str] | None = {"kame_resume": "1", **again}  # kame's own client takes resume handles
    if opts.backend:
        query = {**(query or {}), "backend": opts.backend}
    if opts.oracle_policy:
        query = {**(query or {}), "oracle_policy": opts.oracle_policy}
    if opts.voice:  # PersonaPlex's own query parameter: the voice file's name
        name = opts.voice if opts.voice.endswith((".pt", ".wav")) else f"{opts.voice}.pt"
        query = {**(query or {}), "voice_prompt": name}
    return await MoshiClient.connect(url, token=opts.token, query=query)


async def _ready(client: Any, opts: MicOptions, resuming: bool = False) -> bool:
    """True once the session is usable; False when the server closed it first (the code says why)."""
    if opts.protocol == "realtime":
        ev = await client.wait_for_type("session.created", 30)
        if ev is None:
            if not client.closed.is_set():
                client.close_reason = "no session.created within 30 s"
            return False
        if resuming:  # the session keeps its settings
            return True
        kame = {k: v for k, v in {"backend": opts.backend, "oracle_policy": opts.oracle_policy}.items() if v}
        audio = {"audio": {"output": {"voice": opts.voice}}} if opts.voice else {}
        if kame or opts.instructions or audio:
            await client.update_session(instructions=opts.instructions, kame=kame or None, **audio)
        return True
    if await client.wait_handshake(30):
        return True
    if not client.closed.is_set():
        client.close_reason = "no handshake within 30 s"
    return False


async def _connect(opts: MicOptions, display: Display, retrier: Retrier, resume: _Resume | None = None) -> Any:
    """A ready session, retrying refusals and drains (see the module docstring); with a resume handle, the
    same session again (a refused resume: a new conversation, said so)."""
    url = websocket_url(opts.server, opts.protocol)
    resume = resume or _Resume()
    if resume.handle:
        try:
            client = await open_with_retry(lambda: _open_session(opts, resume), lambda c: _ready(c, opts, True), retrier)
        except Refused as exc:
            display.state(f"the resume was refused ({exc}): a new conversation starts")
        except Exception as exc:  # noqa: BLE001 - the connect itself failed: the plain path below says how
            display.state(f"the resume failed ({type(exc).__name__}): a new conversation starts")
        else:
            resume.moving = False
            resumed = await _wait_resumed(client, opts.protocol)
            voice = f", voice {resumed.get('voice')}" if resumed else ""
            display.state(f"resumed ({opts.protocol}): the same conversation goes on{voice}")
            return client
        resume.handle = None
        resume.moving = False
    try:
        client = await open_with_retry(lambda: _open_session(opts), lambda c: _ready(c, opts), retrier)
    except (GaveUp, Refused) as exc:
        raise UserError(f"{url}: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot connect to {url}: {exc}") from None
    except Exception as exc:  # websockets' handshake errors (401, 404...)
        raise UserError(f"cannot connect to {url}: {type(exc).__name__}: {exc}") from None
    display.state(f"connected ({opts.protocol})" + (": a new conversation" if retrier.reconnects else ""))
    return client


async def _wait_resumed(client: Any, protocol: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """The server's ``kame.session.resumed`` (what was lost, whether the voice continued)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not client.closed.is_set():
        for ev in _handle_events(client, protocol):
            if isinstance(ev, dict) and ev.get("type") == "kame.session.resumed":
                return ev
        await asyncio.sleep(0.05)
    return None


def _should_reconnect(client: Any, display: Display) -> bool:
    """The server ended the session in a way worth a new one (1001 drain, 1013, 1012)?"""
    why = retry_reason(close_code=client.close_code)
    if why is None:
        if client.close_code not in (None, 1000):
            display.state(f"the server closed the session ({client.close_code} {client.close_reason})".strip())
        return False
    return True


class _EventPrinter:
    """Prints what a client received since the last call."""

    def __init__(self, client: Any, protocol: str, display: Display, resume: _Resume | None = None) -> None:
        self.client, self.protocol, self.display = client, protocol, display
        self.resume = resume
        self.seen = 0
        self.errors_seen = 0
        self.meta_seen = 0

    def poll(self) -> None:
        if self.protocol == "realtime":
            events = self.client.events
            for _, ev in events[self.seen :]:
                self._realtime(ev)
            self.seen = len(events)
        else:
            texts = self.client.texts
            for piece in texts[self.seen :]:
                self.display.assistant_piece(piece)
            self.seen = len(texts)
            for text in self.client.errors[self.errors_seen :]:
                self.display.state(f"server: {text}")
            self.errors_seen = len(self.client.errors)
            for meta in self.client.metadata[self.meta_seen :]:
                if isinstance(meta, dict) and meta.get("type") == "session.expiring":
                    self.display.state(_ending_text(meta))
                elif isinstance(meta, dict) and meta.get("type") == "kame.session.ending":
                    self._ending(meta)
            self.meta_seen = len(self.client.metadata)

    def _realtime(self, ev: dict[str, Any]) -> None:
        t = ev.get("type", "")
        if t == "conversation.item.input_audio_transcription.completed":
            self.display.line("you", str(ev.get("transcript", "")))
        elif t == "response.output_audio_transcript.delta":
            self.display.assistant_piece(str(ev.get("delta", "")))
        elif t in ("kame.oracle.reset",):
            self.display.line("oracle", str(ev.get("text", "")))
        elif t == "kame.backend.down":
            self.display.state(f"LLM back-end down ({ev.get('error', '')}): the voice goes on alone")
        elif t == "error":
            err = ev.get("error", {})
            self.display.state(f"error: {err.get('code', '')} {err.get('message', '')}")
        elif t == "kame.session.ending":
            self._ending(ev)

    def _ending(self, ev: dict[str, Any]) -> None:
        """A drain's notice with a handle: leave now and resume on another replica (the server hands the
        conversation over as soon as this connection is gone)."""
        self.display.state(_ending_text(ev))
        if ev.get("reason") == "draining" and ev.get("handle") and self.resume is not None and not self.resume.moving:
            self.resume.handle = str(ev["handle"])
            self.resume.moving = True
            asyncio.get_running_loop().create_task(self.client.close())


def _ending_text(ev: dict[str, Any]) -> str:
    """The notice that a session ends soon: maximum duration, or the server draining for a restart."""
    left = ev.get("seconds_left")
    when = f" in {float(left):.0f} s" if isinstance(left, (int, float)) else " soon"
    if ev.get("reason") == "draining" and ev.get("handle"):
        return "the server is shutting down: kame mic resumes this conversation on another replica"
    if ev.get("reason") == "draining":
        return f"the server is shutting down: this conversation ends{when}, then kame mic reconnects (a new conversation)"
    return f"the session ends{when} (maximum duration)"


@dataclass
class MicResult:
    received: np.ndarray
    time_to_first_audio_s: float | None
    rtf: float
    underruns: int = 0
    reconnects: int = 0  # sessions opened after the first (each one a new conversation)
    echo: str | None = None  # --echo-path: how much of the echo was left in what was sent


def _retrier(opts: MicOptions, display: Display) -> Retrier:
    return Retrier(opts.backoff, say=display.state)


async def _after_session(client: Any, retrier: Retrier, display: Display, resume: _Resume | None = None,
                         protocol: str = "realtime") -> bool:
    """Close ``client``; True when the server ended it in a way worth a new session, or when it dropped
    and the server gave it a resume handle (``resume.handle`` set: the next connection resumes it)."""
    server_closed = client.closed.is_set()
    if resume is not None:
        handle = latest_handle(_handle_events(client, protocol)) or resume.handle
        why = resume_reason(client.close_code if server_closed else None, handle, moving=resume.moving)
        if why is not None and (server_closed or resume.moving):
            await client.close()
            resume.handle = handle
            retrier.reset()
            if resume.moving:
                display.state(f"{why}: resuming the same conversation")
            else:
                why = describe(client.close_code, client.close_reason, why)
                if not await retrier.wait(f"{why}, resuming the same conversation", resuming=True):
                    raise UserError(f"{why}: gave up after {retrier.policy.attempts} retries")
            retrier.reconnects += 1
            return True
        resume.handle = None
    await client.close()
    if not (server_closed and _should_reconnect(client, display)):
        return False
    retrier.reset()  # this session got going: a fresh count of failed tries
    why = describe(client.close_code, client.close_reason, retry_reason(close_code=client.close_code) or "")
    if not await retrier.wait(why):
        raise UserError(f"{why}: gave up after {retrier.policy.attempts} retries")
    retrier.reconnects += 1
    return True


def _canceller(opts: MicOptions) -> EchoCanceller | None:
    return EchoCanceller(RATE) if opts.aec else None


async def _send_simulated(client: Any, pcm: np.ndarray, sim: EchoSimulation) -> int:
    """Stream ``pcm`` at real time through the simulated speaker and microphone; the samples sent."""
    start = time.monotonic()
    if client.stats.first_send_t is None:
        client.stats.first_send_t = start
    sent = 0
    played = 0
    for k, i in enumerate(range(0, pcm.size, FRAME)):
        if client.closed.is_set():
            break
        delay = start + k * FRAME / RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        chunks = client.pcm_chunks
        for chunk in chunks[played:]:
            sim.play.push(chunk)
        played = len(chunks)
        piece = pcm[i : i + FRAME]
        out = sim.step(piece)[: piece.size]
        if await client.send_pcm(out, chunk=FRAME, realtime=False) < out.size:
            break
        sent += piece.size
    return sent


async def run_wav(opts: MicOptions, display: Display) -> MicResult:
    from kame.audio.files import read_audio, write_wav

    assert opts.input_wav is not None
    pcm = read_audio(opts.input_wav)
    sim: EchoSimulation | None = None
    if opts.echo_path is not None:
        sim = EchoSimulation(read_impulse_response(opts.echo_path, RATE), _canceller(opts))
        display.state(f"simulated speaker and microphone ({opts.echo_path}): echo cancellation "
                      + ("on" if opts.aec else "off (--no-aec)"))
    retrier = _retrier(opts, display)
    resume = _Resume()
    received: list[np.ndarray] = []
    pos = 0

    def save() -> np.ndarray:
        out = np.concatenate(received) if received else np.zeros(0, np.float32)
        if opts.output_wav is not None:
            write_wav(opts.output_wav, out)
        if sim is not None and opts.record_wav is not None:
            sim.write_record(opts.record_wav)
        return out

    while True:
        try:
            client = await _connect(opts, display, retrier, resume)
        except UserError:
            if received:  # what earlier sessions sent is kept even when the reconnect fails
                save()
            raise
        printer = _EventPrinter(client, opts.protocol, display, resume)

        async def show(p: _EventPrinter = printer) -> None:
            while True:
                p.poll()
                await asyncio.sleep(0.1)

        shower = asyncio.create_task(show())
        try:
            if sim is None:
                pos += await client.send_pcm(pcm[pos:], realtime=True)
            else:
                pos += await _send_simulated(client, pcm[pos:], sim)
            cut_short = client.closed.is_set() and pos < pcm.size
            if not cut_short:  # the line stays open for the reply, full duplex
                if sim is None:
                    await client.send_silence(opts.tail_s)
                else:
                    await _send_simulated(client, np.zeros(int(opts.tail_s * RATE), np.float32), sim)
                await client.drain_output(2.0, until_complete=True)
        finally:
            shower.cancel()
            printer.poll()
            display.flush_assistant()
        received.append(client.received_pcm())
        try:
            again = cut_short and await _after_session(client, retrier, display, resume, opts.protocol)
        except UserError:  # retries used up: keep what came
            save()
            raise
        if not again:
            await client.close()
            break
    out = save()
    echo = sim.echo_report() if sim is not None else None
    return MicResult(out, client.stats.time_to_first_audio_s, client.stats.rtf, reconnects=retrier.reconnects, echo=echo)


async def run_live(opts: MicOptions, display: Display, stop: asyncio.Event) -> MicResult:
    sd = _sounddevice()
    loop = asyncio.get_running_loop()
    mic_q: asyncio.Queue[np.ndarray] = asyncio.Queue(maxsize=200)

    def on_mic(block: np.ndarray) -> None:
        def put() -> None:
            if not mic_q.full():
                mic_q.put_nowait(block)

        loop.call_soon_threadsafe(put)

    canceller = _canceller(opts)
    try:
        duplex = Duplex(sd, canceller, on_mic)
    except Exception as exc:  # PortAudioError: no device, or none that plays and records 24 kHz mono
        raise UserError(f"no usable sound device for playing and recording at once ({exc}); use --input-wav/--output-wav") from None
    speaker = duplex.play
    retrier = _retrier(opts, display)
    resume = _Resume()
    received: list[np.ndarray] = []
    hint = ("echo cancellation on: speakers are fine" if canceller is not None
            else "--no-aec: use headphones, the speakers would reach the microphone")
    with duplex.stream:
        while True:
            client = await _connect(opts, display, retrier, resume)
            printer = _EventPrinter(client, opts.protocol, display, resume)
            played = 0
            try:
                display.state(f"listening: speak ({hint})")
                while not stop.is_set() and not client.closed.is_set():
                    try:
                        block = await asyncio.wait_for(mic_q.get(), 0.05)
                        await client.send_pcm(block, chunk=block.size, realtime=False)
                    except asyncio.TimeoutError:
                        pass
                    chunks = client.pcm_chunks
                    for chunk in chunks[played:]:
                        speaker.push(chunk)
                    played = len(chunks)
                    printer.poll()
            finally:
                printer.poll()
                display.flush_assistant()
            received.append(client.received_pcm())
            if stop.is_set() or not await _after_session(client, retrier, display, resume, opts.protocol):
                await client.close()
                break
            while not mic_q.empty():  # what was said while reconnecting belongs to no conversation
                mic_q.get_nowait()
    out = np.concatenate(received) if received else np.zeros(0, np.float32)
    return MicResult(out, client.stats.time_to_first_audio_s, client.stats.rtf, speaker.underruns, retrier.reconnects)


def summary_lines(result: MicResult) -> list[str]:
    ttfa = "n/a" if result.time_to_first_audio_s is None else f"{result.time_to_first_audio_s * 1000:.0f} ms"
    return [
        f"time to first reply audio: {ttfa} (from the first frame sent)",
        f"received audio: {result.received.size / RATE:.2f} s, real-time factor {result.rtf:.3f}"
        + (f", playback underruns {result.underruns}" if result.underruns else ""),
        *([f"reconnected {result.reconnects} time(s)"] if result.reconnects else []),
        *([result.echo] if result.echo else []),
    ]


def run_mic(opts: MicOptions, display: Display | None = None) -> int:
    display = display or Display()
    if opts.protocol not in ("realtime", "moshi"):
        raise UserError(f"--protocol {opts.protocol}: realtime or moshi")
    websocket_url(opts.server, opts.protocol)  # validate early
    if opts.echo_path is not None and opts.input_wav is None:
        raise UserError("--echo-path simulates a speaker and microphone for --input-wav; with a real microphone leave it out")
    if opts.record_wav is not None and opts.echo_path is None:
        raise UserError("--record-wav records the simulated microphone: it needs --echo-path")
    if opts.input_wav is not None:
        result = asyncio.run(run_wav(opts, display))
    else:
        stop = asyncio.Event()

        async def main() -> MicResult:
            return await run_live(opts, display, stop)

        try:
            result = asyncio.run(main())
        except KeyboardInterrupt:
            display.state("stopped")
            return 0
    for line in summary_lines(result):
        display.line("stats", line)
    return 0
