"""OpenAI's documented browser flow for the Realtime API over WebRTC, in real headless Chromium against kame.

Chromium's own WebRTC stack (ICE, DTLS, SCTP, Opus, its jitter buffer) with a fake microphone that says an
espeak question: the test plays the trusted server (mints an ``ek_`` key with the server's token), the page
does exactly what OpenAI's guide shows: ``getUserMedia``, ``new RTCPeerConnection()``, ``addTrack``, a
data channel ``oai-events``, ``createOffer``, ``fetch(".../v1/realtime/calls", {method: "POST", body:
offer.sdp, headers: {Authorization: "Bearer ek_...", "Content-Type": "application/sdp"}})``,
``setRemoteDescription({type: "answer", sdp})``. It must hear its transcript, the response lifecycle with
``output_audio_buffer.*``, and audio on the remote track (Chromium's own inbound-rtp statistics). The page
is an app's own page on another origin than the API (another port), so CORS and the exposed ``Location``
header are what the browser enforces.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import sync_playwright

from kame.audio.files import write_wav
from tests.support.moshi_client import ServerProcess
from tests.support.servers import APP_PORT, SECURED_TOKEN
from tests.support.speech import silence, synthesize

CHROMIUM = "/usr/bin/chromium"
TOKEN = SECURED_TOKEN

FLOW = """
async ({ api, key }) => {
  const events = [];
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  const pc = new RTCPeerConnection();
  const audioEl = document.createElement("audio");
  audioEl.autoplay = true;
  pc.ontrack = (e) => { audioEl.srcObject = e.streams[0]; };
  pc.addTrack(mic.getTracks()[0]);
  const dc = pc.createDataChannel("oai-events");
  dc.addEventListener("message", (e) => events.push(JSON.parse(e.data)));
  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);
  const r = await fetch(`${api}/v1/realtime/calls`, {
    method: "POST", body: offer.sdp,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/sdp" },
  });
  const location = r.headers.get("Location");
  const answer = await r.text();
  if (r.status !== 201) return { status: r.status, answer };
  await pc.setRemoteDescription({ type: "answer", sdp: answer });
  const until = (pred, ms) => new Promise((resolve) => {
    const t0 = performance.now();
    const tick = () => (pred() || performance.now() - t0 > ms) ? resolve() : setTimeout(tick, 50);
    tick();
  });
  await until(() => events.some((e) => e.type === "conversation.item.input_audio_transcription.completed" &&
                                      /france/i.test(e.transcript)), 60000);
  await until(() => events.some((e) => e.type === "output_audio_buffer.stopped"), 20000);
  let inbound = null;
  (await pc.getStats()).forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "audio") inbound = s; });
  dc.send(JSON.stringify({ type: "output_audio_buffer.clear" }));
  await until(() => events.some((e) => e.type === "output_audio_buffer.cleared"), 5000);
  const state = pc.connectionState;
  pc.close();
  return { status: r.status, location, state, events,
           inbound: inbound && { packetsReceived: inbound.packetsReceived, totalAudioEnergy: inbound.totalAudioEnergy,
                                 concealedSamples: inbound.concealedSamples, totalSamplesReceived: inbound.totalSamplesReceived } };
}
"""


@pytest.fixture(scope="module")
def server(secured_server: ServerProcess) -> ServerProcess:
    """The shared ``secured`` server (tests/support/servers.py): a token (the trusted server mints ``ek_`` keys
    with it) and an origin allow-list that names the app's page."""
    return secured_server


@pytest.fixture
def app_page(tmp_path: Path) -> Iterator[str]:
    """An app's own page (another origin on loopback, allowed by the server; kame's page has a CSP that
    allows only itself)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>an app</title>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", APP_PORT), handler)  # an allowed origin
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def test_openais_browser_flow_in_chromium(server: ServerProcess, app_page: str, tmp_path: Path) -> None:
    wav = tmp_path / "question.wav"
    write_wav(wav, np.concatenate([silence(0.5), synthesize("What is the capital of France?"), silence(3.0)]))
    r = httpx.post(f"{server.http_url}/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {TOKEN}"},
                   json={"session": {"type": "realtime"}})
    key = r.json()["value"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync",
            "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}",
            "--allow-loopback-in-peer-connection",
        ])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{app_page}/")  # an app's own page: another origin than the API
            api = server.http_url
            result: dict[str, Any] = page.evaluate(FLOW, {"api": api, "key": key})
        finally:
            browser.close()
    assert result["status"] == 201, result
    assert result["location"] and result["location"].startswith("/v1/realtime/calls/rtc_"), "Location is exposed (CORS)"
    assert result["state"] == "connected"
    events = result["events"]
    types = [e["type"] for e in events]
    finals = [e["transcript"] for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert any("france" in f.lower() for f in finals), finals
    assert "output_audio_buffer.started" in types and "output_audio_buffer.stopped" in types
    assert "output_audio_buffer.cleared" in types
    assert not [t for t in types if t.endswith("audio.delta")]
    inbound = result["inbound"]
    assert inbound and inbound["packetsReceived"] > 50, inbound  # RTP from kame, continuously (40 ms packets: > 2 s)
    assert inbound["totalAudioEnergy"] > 0, inbound  # and not only silence
    print("\nchromium inbound-rtp:", json.dumps(inbound))
    assert not errors, errors
