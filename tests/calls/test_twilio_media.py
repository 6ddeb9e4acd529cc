"""Phone calls over Twilio Media Streams against a real server (the CPU demo: tiny model, Whisper, scripted back-end).

Twilio itself cannot reach this machine, so :class:`TwilioCall` plays it, as its
documentation describes the protocol: the voice webhook is POSTed as a form
signed with ``X-Twilio-Signature`` (by the ``twilio`` package's own
``RequestValidator``, the real implementation), the TwiML it returns is read
for the Stream URL and its ``<Parameter>``s, the websocket upgrade is signed
too, then ``connected``, ``start`` and espeak speech as G.711 mu-law at 8 kHz in
20 ms ``media`` messages at real time, a keypad press, ``stop``. Its playback
is emulated: audio received is "played" at real time, each ``mark`` is echoed
once the audio before it has been played, and ``clear`` drops what is queued
and echoes the pending marks at once, as Twilio does. Not covered: Twilio's
own network jitter and its TLS termination (a proxy's job, docs/deploying.md).
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():  # stdlib audioop is deprecated on 3.11/3.12 (audioop-lts from 3.13)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop
import asyncio
import base64
import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pytest
import soxr
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.haproxy import Backend, HAProxy
from tests.support.moshi_client import ServerProcess
from tests.support.speech import silence, synthesize

TOKEN = "twilio-auth-token-7c21e9f0"
SLOTS = 3
START_TIMEOUT_S = 2.0
#: What a websocket client waits for its first audio at most (tests/test_server_chat.py, /api/chat).
FIRST_AUDIO_BUDGET_S = 1.5
QUESTION = "Hello there, can you hear me? I would like to know the weather in Paris tomorrow."
ULAW_SILENCE = b"\xff" * 160
INSTRUCTIONS = "You answer phone calls for a bakery. Be brief."


def ulaw_8k(pcm_24k: np.ndarray) -> bytes:
    """24 kHz float speech -> what a phone network sends: 8 kHz G.711 mu-law."""
    pcm = soxr.resample(pcm_24k.astype(np.float32), 24000, 8000)
    linear = (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()
    return audioop.lin2ulaw(linear, 2)


@dataclass
class TwilioCall:
    """One call as Twilio places it on a bidirectional stream, and what it heard."""

    url: str
    custom: dict[str, str]
    token: str = TOKEN
    call_sid: str = "CA0123456789abcdef0123456789abcdef"
    stream_sid: str = "MZ0123456789abcdef0123456789abcdef"
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    marks_echoed: list[str] = field(default_factory=list)
    audio_bytes: int = 0
    heard: bytearray = field(default_factory=bytearray)
    t0: float = 0.0
    closed: tuple[int | None, str] | None = None
    #: send one message that is not JSON this far into the call (the call must go on)
    junk_at_s: float | None = None

    def of(self, event: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, m) for t, m in self.received if m.get("event") == event]

    async def run(self, audio: bytes, dtmf_at: dict[float, str] | None = None, tail_s: float = 0.5) -> None:
        """Send ``audio`` (mu-law) in 20 ms messages at real time, keypad presses at their times, then ``stop``."""
        headers = {"X-Twilio-Signature": RequestValidator(self.token).compute_signature(self.url, {})}
        async with connect(self.url, additional_headers=headers, max_size=2**20) as ws:
            self.t0 = time.monotonic()
            playback = _Playback()
            receiver = asyncio.create_task(self._receive(ws, playback))
            try:
                await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
                await ws.send(json.dumps({
                    "event": "start", "sequenceNumber": "1", "streamSid": self.stream_sid,
                    "start": {"accountSid": "AC0123456789abcdef0123456789abcdef", "streamSid": self.stream_sid,
                              "callSid": self.call_sid, "tracks": ["inbound"], "customParameters": self.custom,
                              "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
                self.t0 = time.monotonic()
                await self._play(ws, playback, audio, dtmf_at or {}, tail_s)
            except ConnectionClosed:  # the server refused or ended the call
                pass
            try:
                await asyncio.wait_for(receiver, 5.0)
            except asyncio.TimeoutError:
                receiver.cancel()
            self.closed = (ws.close_code, ws.close_reason or "")

    async def _play(self, ws: Any, playback: _Playback, audio: bytes, dtmf_at: dict[float, str], tail_s: float) -> None:
        pending = dict(sorted(dtmf_at.items()))
        seq = 2
        for i in range(0, len(audio) - 159, 160):
            chunk = i // 160
            await asyncio.sleep(max(0.0, self.t0 + chunk * 0.02 - time.monotonic()))
            await ws.send(json.dumps({
                "event": "media", "sequenceNumber": str(seq), "streamSid": self.stream_sid,
                "media": {"track": "inbound", "chunk": str(chunk + 1), "timestamp": str(chunk * 20),
                          "payload": base64.b64encode(audio[i:i + 160]).decode()}}))
            seq += 1
            if self.junk_at_s is not None and chunk == int(self.junk_at_s / 0.02):
                await ws.send("{not json")
            for at in [a for a in pending if a <= chunk * 0.02]:
                await ws.send(json.dumps({"event": "dtmf", "streamSid": self.stream_sid, "sequenceNumber": str(seq),
                                          "dtmf": {"track": "inbound_track", "digit": pending.pop(at)}}))
                seq += 1
            for name in playback.due(time.monotonic()):
                await self._echo(ws, name, seq)
                seq += 1
        await asyncio.sleep(tail_s)
        for name in playback.due(time.monotonic()):
            await self._echo(ws, name, seq)
            seq += 1
        await ws.send(json.dumps({"event": "stop", "sequenceNumber": str(seq), "streamSid": self.stream_sid,
                                  "stop": {"accountSid": "AC0123456789abcdef0123456789abcdef", "callSid": self.call_sid}}))

    async def _echo(self, ws: Any, name: str, seq: int) -> None:
        self.marks_echoed.append(name)
        await ws.send(json.dumps({"event": "mark", "sequenceNumber": str(seq), "streamSid": self.stream_sid,
                                  "mark": {"name": name}}))

    async def _receive(self, ws: Any, playback: _Playback) -> None:
        try:
            async for raw in ws:
                msg = json.loads(raw)
                now = time.monotonic()
                self.received.append((now - self.t0, msg))
                assert msg.get("streamSid") == self.stream_sid, msg
                if msg["event"] == "media":
                    data = base64.b64decode(msg["media"]["payload"])
                    self.audio_bytes += len(data)
                    self.heard += data
                    playback.queue_audio(now, len(data) / 8000)
                elif msg["event"] == "mark":
                    playback.queue_mark(msg["mark"]["name"])
                elif msg["event"] == "clear":
                    playback.clear(now)
        except ConnectionClosed:
            pass


class _Playback:
    """Twilio's playout of the audio it received: real time, marks due once the audio before them played."""

    def __init__(self) -> None:
        self.until = 0.0
        self.marks: list[tuple[float, str]] = []

    def queue_audio(self, now: float, seconds: float) -> None:
        self.until = max(self.until, now) + seconds

    def queue_mark(self, name: str) -> None:
        self.marks.append((self.until, name))

    def clear(self, now: float) -> None:
        self.until = now
        self.marks = [(now, name) for _, name in self.marks]

    def due(self, now: float) -> list[str]:
        out = [name for at, name in self.marks if at <= now]
        self.marks = [(at, name) for at, name in self.marks if at > now]
        return out


@pytest.fixture(scope="module")
def server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The CPU demo with a Twilio auth token, three slots, sessions recorded, a short start deadline."""
    root = tmp_path_factory.mktemp("twilio")
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=root / "server.log", label="twilio", env={
        "KAME_TWILIO__AUTH_TOKEN": TOKEN,
        "KAME_TWILIO__START_TIMEOUT_S": str(START_TIMEOUT_S),
        "KAME_FRONTEND__BATCH_SIZE": str(SLOTS),
        "KAME_SERVER__RECORD_DIR": str(root / "records"),
    })
    srv.record_dir = root / "records"
    srv.start()
    yield srv
    srv.stop()


def webhook(server: ServerProcess | HAProxy, query: dict[str, str], form: dict[str, str], *,
            token: str = TOKEN) -> tuple[int, str]:
    """POST the voice webhook as Twilio does: a form, signed over the full URL and the sorted parameters."""
    import urllib.error
    import urllib.request

    url = f"{server.http_url}/twilio/voice" + (f"?{urlencode(query)}" if query else "")
    sig = RequestValidator(token).compute_signature(url, form)
    req = urllib.request.Request(url, data=urlencode(form).encode(), method="POST",
                                 headers={"X-Twilio-Signature": sig, "Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def stream_of(twiml: str) -> tuple[str, dict[str, str]]:
    """The Stream URL and parameters of a ``<Connect><Stream>`` TwiML."""
    stream = ET.fromstring(twiml).find("./Connect/Stream")
    assert stream is not None, twiml
    return stream.attrib["url"], {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}


FORM = {"CallSid": TwilioCall.call_sid, "AccountSid": "AC0123456789abcdef0123456789abcdef", "From": "+14155550100",
        "To": "+14155550199", "CallStatus": "ringing", "Direction": "inbound", "ApiVersion": "2010-04-01"}


def test_a_call_hears_the_reply_gets_clear_on_barge_in_marks_and_dtmf(server: ServerProcess) -> None:
    """Two calls at once (and refused sockets beside them): the webhook's TwiML connects each; the caller hears
    mu-law audio within the websocket clients' first-audio budget and at real time; its speech talking over the
    assistant gets ``clear``; marks come after responses and the server counts the echoes; a keypad press reaches
    the session (log line, metric); the customParameters chose the instructions (the recording's settings)."""
    answered0 = server.metric("kame_twilio_calls_total", 'result="answered"')
    dtmf0 = server.metric("kame_twilio_dtmf_total")
    clears0 = server.metric("kame_twilio_clears_total")
    status, body = webhook(server, {"instructions": INSTRUCTIONS, "backend": "scripted"}, FORM)
    assert status == 200, body
    url, params = stream_of(body)
    assert url == f"ws://127.0.0.1:{server.port}/twilio/media"
    assert params["instructions"] == INSTRUCTIONS and params["From"] == FORM["From"] and params["CallSid"] == FORM["CallSid"]
    speech = synthesize(QUESTION)
    audio = ulaw_8k(np.concatenate([silence(2.0), speech, silence(2.5)]))
    speech_at = (2.0, 2.0 + len(speech) / 24000)
    a = TwilioCall(url, params, junk_at_s=1.0)
    # the other call: no barge-in, so every output frame is sent (none withheld after a clear)
    b = TwilioCall(url, {"backend": "scripted", "interrupt_response": "false"}, call_sid="CA" + "b" * 32,
                   stream_sid="MZ" + "b" * 32)
    b_audio = ulaw_8k(np.concatenate([silence(1.0), synthesize("Good morning."), silence(6.0)]))

    async def main() -> list[Any]:
        calls = asyncio.gather(a.run(audio, dtmf_at={speech_at[1] + 1.0: "5"}), b.run(b_audio))
        await asyncio.sleep(1.0)
        # bad input beside the calls: not JSON, and a socket that never sends start
        return list(await asyncio.gather(calls, _malformed(url), _silent(url)))

    _, malformed, silent = asyncio.run(main())
    for call in (a, b):
        assert call.closed == (1000, "call ended"), call.closed
        first = call.of("media")
        assert first, "no audio came back"
        assert first[0][0] < FIRST_AUDIO_BUDGET_S, first[0][0]
        pcm = np.frombuffer(audioop.ulaw2lin(bytes(call.heard), 2), "<i2")
        assert np.abs(pcm).max() > 0, "silence only"
    # the call beside the bad sockets and the barge-ins keeps its frames: its audio back covers it at real time
    assert b.audio_bytes / 8000 >= 0.85 * len(b_audio) / 8000, (b.audio_bytes / 8000, len(b_audio) / 8000)
    assert not b.of("clear")
    # after a barge-in Moshi's rest is withheld until the caller's turn ends; then the answer is heard
    assert any(speech_at[1] < t for t, _ in a.of("media")), "no audio after the caller's turn"
    clears = [t for t, _ in a.of("clear")]
    assert clears, "talking over the assistant sends clear"
    assert speech_at[0] < clears[0] < speech_at[1] + 3.0, (clears, speech_at)
    marks = [m["mark"]["name"] for _, m in a.of("mark")]
    assert marks and set(a.marks_echoed) <= set(marks) and a.marks_echoed, (marks, a.marks_echoed)
    assert malformed == (1008, "protocol"), malformed
    assert silent[0] == 1008, silent
    assert server.metric("kame_twilio_calls_total", 'result="answered"') == answered0 + 2
    assert server.metric("kame_twilio_dtmf_total") == dtmf0 + 1
    assert server.metric("kame_twilio_clears_total") >= clears0 + 1
    assert server.metric("kame_twilio_marks_played_total") >= len(a.marks_echoed) + len(b.marks_echoed)
    logs = server.logs()
    assert "twilio dtmf: the caller pressed 5" in logs
    assert f"no start message within {START_TIMEOUT_S:.1f} s" in logs
    assert "twilio stream refused: not JSON" in logs
    assert "client message refused (invalid_message): not a Media Streams message: not JSON" in logs
    assert TOKEN not in logs
    start = _recorded_start(server, a.call_sid, logs)
    assert start["protocol"] == "twilio" and start["instructions"] == INSTRUCTIONS and start["backend"] == "scripted"
    assert start["interrupt_response"] is True


def _recorded_start(server: ServerProcess, call_sid: str, logs: str) -> dict[str, Any]:
    """The ``session.start`` event of the call's recording (its session id from the log's accept line)."""
    line = next(ln for ln in logs.splitlines() if "session accepted" in ln and call_sid in ln)
    assert server.record_dir is not None
    for events in server.record_dir.glob("*/events.jsonl"):
        if events.parent.name.split("-")[-1] in line:
            return dict(json.loads(events.read_text().splitlines()[0]))
    raise AssertionError(f"no recording for {line}")


async def _malformed(url: str) -> tuple[int | None, str]:
    headers = {"X-Twilio-Signature": RequestValidator(TOKEN).compute_signature(url, {})}
    async with connect(url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await ws.send("{not json")
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5.0)
        return ws.close_code, "protocol" if ws.close_code == 1008 else (ws.close_reason or "")


async def _silent(url: str) -> tuple[int | None, float]:
    headers = {"X-Twilio-Signature": RequestValidator(TOKEN).compute_signature(url, {})}
    t0 = time.monotonic()
    async with connect(url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), START_TIMEOUT_S + 5.0)
        return ws.close_code, time.monotonic() - t0


def test_bad_signatures_are_refused_403_and_logged(server: ServerProcess) -> None:
    bad0 = server.metric("kame_twilio_webhooks_total", 'result="bad_signature"')
    status, _ = webhook(server, {}, FORM, token="not-the-token")
    assert status == 403
    tampered = dict(FORM, From="+14155550111")
    url = f"{server.http_url}/twilio/voice"
    sig = RequestValidator(TOKEN).compute_signature(url, FORM)
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=urlencode(tampered).encode(), method="POST", headers={"X-Twilio-Signature": sig})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 403
    assert server.metric("kame_twilio_webhooks_total", 'result="bad_signature"') == bad0 + 2
    media = f"ws://127.0.0.1:{server.port}/twilio/media"

    async def upgrade(headers: dict[str, str]) -> int:
        with pytest.raises(InvalidStatus) as exc:
            async with connect(media, additional_headers=headers):
                pass
        return exc.value.response.status_code

    assert asyncio.run(upgrade({"X-Twilio-Signature": RequestValidator("wrong").compute_signature(media, {})})) == 403
    assert asyncio.run(upgrade({})) == 403
    logs = server.logs()
    assert "twilio webhook refused: bad X-Twilio-Signature" in logs
    assert "twilio stream refused: bad X-Twilio-Signature" in logs
    assert TOKEN not in logs


def test_bad_custom_parameter_closes_the_stream_and_a_full_server_answers_busy(server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.port}/twilio/media"
    bad = TwilioCall(url, {"backend": "nope"}, call_sid="CA" + "c" * 32)
    asyncio.run(bad.run(ULAW_SILENCE * 10))
    assert bad.closed is not None and bad.closed[0] == 1008, bad.closed
    assert "twilio call refused: query parameter backend: unknown back-end 'nope'" in server.logs()
    busy0 = server.metric("kame_twilio_webhooks_total", 'result="busy"')
    refused0 = server.metric("kame_twilio_calls_total", 'result="refused"')
    holders = [TwilioCall(url, {}, call_sid=f"CA{i:032d}", stream_sid=f"MZ{i:032d}") for i in range(SLOTS)]

    async def main() -> tuple[tuple[int, str], TwilioCall]:
        calls = asyncio.gather(*(h.run(ULAW_SILENCE * 150) for h in holders))
        await asyncio.sleep(1.5)
        busy = await asyncio.to_thread(webhook, server, {}, FORM)
        extra = TwilioCall(url, {}, call_sid="CA" + "d" * 32)
        await extra.run(ULAW_SILENCE * 10)
        await calls
        return busy, extra

    (status, body), extra = asyncio.run(main())
    assert status == 200 and ET.fromstring(body).find("./Reject").attrib == {"reason": "busy"}, body  # type: ignore[union-attr]
    assert extra.closed is not None and extra.closed[0] == 1013, extra.closed
    assert server.metric("kame_twilio_webhooks_total", 'result="busy"') == busy0 + 1
    assert server.metric("kame_twilio_calls_total", 'result="refused"') == refused0 + 1
    assert all(h.of("media") for h in holders)


def test_through_the_shipped_haproxy_a_call_connects_and_a_full_fleet_answers_busy(
        server: ServerProcess, tmp_path: Path) -> None:
    """deploy/haproxy.cfg in front of the server: the webhook's TwiML names the proxy's address, the call's
    signatures hold through it and its audio comes back; with the replica full, the webhook still gets TwiML
    (a busy signal), not HAProxy's 503."""
    proxy = HAProxy(tmp_path / "haproxy", [Backend("kame1", server.port, SLOTS)]).start()
    try:
        proxy.wait_status("kame1", "UP")
        status, body = webhook(proxy, {}, FORM)
        assert status == 200, body
        url, params = stream_of(body)
        assert url == f"ws://127.0.0.1:{proxy.port}/twilio/media"
        call = TwilioCall(url, params)
        asyncio.run(call.run(ULAW_SILENCE * 150))
        # 3 s of call: at least half of it heard back through the proxy (a loaded 2-core machine starts slowly)
        assert call.closed == (1000, "call ended") and call.audio_bytes >= 1.5 * 8000, (call.closed, call.audio_bytes)
        holders = [TwilioCall(url, {}, call_sid=f"CA{i:032d}", stream_sid=f"MZ{i:032d}") for i in range(SLOTS)]

        async def full() -> tuple[int, str]:
            calls = asyncio.gather(*(h.run(ULAW_SILENCE * 200) for h in holders))
            await asyncio.to_thread(proxy.wait_status, "kame1", "DOWN")
            busy = await asyncio.to_thread(webhook, proxy, {}, FORM)
            await calls
            return busy

        status, body = asyncio.run(full())
        assert status == 200 and ET.fromstring(body).find("./Reject") is not None, (status, body)
        assert all(h.closed == (1000, "call ended") for h in holders)
    finally:
        proxy.stop()


def test_a_draining_server_ends_its_calls_and_answers_busy(server: ServerProcess) -> None:
    """SIGTERM (last in this module: it stops the server): a call in progress is closed with 1001 after the drain
    grace (Twilio then ends it) and a new webhook gets a busy signal meanwhile."""
    import signal

    url = f"ws://127.0.0.1:{server.port}/twilio/media"
    call = TwilioCall(url, {}, call_sid="CA" + "e" * 32)

    async def main() -> tuple[int, str]:
        running = asyncio.create_task(call.run(ULAW_SILENCE * 500))
        while not call.of("media"):
            await asyncio.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        busy = await asyncio.to_thread(webhook, server, {}, FORM)
        await running
        return busy

    status, body = asyncio.run(main())
    assert status == 200 and ET.fromstring(body).find("./Reject") is not None, (status, body)
    assert call.closed is not None and call.closed[0] == 1001, call.closed
    assert server.proc.wait(15) in (0, -signal.SIGTERM)  # exited after the drain (uvicorn re-raises the signal)
