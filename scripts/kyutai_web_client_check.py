#!/usr/bin/env python3
"""Run Kyutai's Moshi web client (a build you made) in Chromium against kame's ``/api/chat``.

kame cannot ship or fetch Kyutai's client (it lives in the ``client/``
folder of github.com/kyutai-labs/moshi, is not on npm, and its code must
not be copied here), so this script takes the path of a build you made
yourself (``npm ci && npx vite build`` in that folder gives ``dist/``) and
checks what a user of that client sees:

- the page opens ``/?worker_addr=HOST:PORT``, the "Connect" button is
  clicked, the client opens ``ws://HOST:PORT/api/chat?text_temperature=...``
  and kame accepts its query parameters;
- kame's handshake arrives, then exactly one ``0x04`` server info that the
  client's schema accepts (its "server is running on the following
  configuration" panel shows ``Instance name: kame``), and no console
  error (the client logs a ``ZodError`` for metadata it cannot parse and
  throws ``Unknown message type`` for kinds it does not know);
- audio (``0x01``) and text (``0x02``) arrive; the client's microphone
  (Chromium's fake device, or a WAV given with ``--speech-wav`` / spoken by
  ``espeak-ng`` with ``--say``) is sent as Ogg/Opus pages that kame decodes
  (the session stays up, kame logs no audio error);
- with ``--max-duration S`` kame ends the session after S seconds: its
  ``0x05`` notices (the warning, then the close reason) reach the client
  before the close frame and the client raises nothing on them.

It starts ``kame serve --config cpu-demo`` on a free port unless
``--server HOST:PORT`` names a running one, serves the build with Python's
HTTP server (or, with ``--from-kame``, lets kame serve it: ``kame serve
--client-dir``, opened at ``/`` with no ``worker_addr``), drives Debian's ``/usr/bin/chromium`` with Playwright, prints
one line per check and exits 1 if any failed. ``--json FILE`` writes
everything it saw (frames by kind, console, metadata) for a report.

    python scripts/kyutai_web_client_check.py --client-dist /tmp/moshi-client/dist --say "hello there"
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

KIND_NAMES = {0: "handshake", 1: "audio", 2: "text", 3: "control", 4: "metadata", 5: "error", 6: "ping", 7: "coloredtext"}


@dataclass
class Seen:
    """Everything observed in the browser, JSON-serialisable for ``--json``."""

    ws_url: str = ""
    query: dict[str, str] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    metadata: list[Any] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    text: str = ""
    first_sent_audio: str = ""  # hex of the first bytes of the first 0x01 the client sent
    sent_opus_head: bool = False
    closed: bool = False
    closed_by_server: bool = False  # closed before the script clicked "Disconnect"
    console: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    server_info_panel: str = ""
    text_panel: str = ""
    stats_panel: str = ""
    audio_arrivals: list[float] = field(default_factory=list)  # monotonic seconds of each 0x01 received
    disconnect_clicked: bool = False
    server_log_errors: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def serve_dist(dist: Path) -> tuple[ThreadingHTTPServer, int]:
    """Serve the client build on 127.0.0.1 (a thread; the single-page app only needs ``/``)."""
    handler = functools.partial(_QuietHandler, directory=str(dist))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, int(httpd.server_address[1])


def start_kame(port: int, max_duration: float | None, log: Path, client_dir: Path | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, NO_TORCH_COMPILE="1")
    if max_duration is not None:
        env["KAME_SERVER__MAX_DURATION_S"] = str(max_duration)
        env["KAME_SERVER__DURATION_WARNING_S"] = str(max(1.0, max_duration / 2))
    kame = shutil.which("kame") or str(Path(sys.executable).with_name("kame"))
    cmd = [kame, "serve", "--config", "cpu-demo", "--port", str(port)]
    if client_dir is not None:
        cmd += ["--client-dir", str(client_dir)]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kame serve exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"kame serve not ready after 180 s; see {log}")


#: Server metrics read after the run (summed over labels unless a label is named).
METRICS = (
    "kame_asr_partial_latency_seconds_count",
    "kame_oracle_resets_total",
    'kame_sessions_ended_total{reason="client_closed"}',
    'kame_sessions_ended_total{reason="max_duration"}',
    'kame_frames_dropped_total{direction="in"}',
    "kame_protocol_errors_total",
)


def read_metrics(worker: str) -> dict[str, float]:
    """The few Prometheus values the checks use, from ``GET /metrics`` (no token: the demo sets none)."""
    try:
        with urllib.request.urlopen(f"http://{worker}/metrics", timeout=5) as r:
            lines = r.read().decode("utf-8").splitlines()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for want in METRICS:
        name, _, label = want.partition("{")
        total = 0.0
        for line in lines:
            if line.startswith("#") or not line.startswith(name):
                continue
            key, _, value = line.rpartition(" ")
            if key != name and not key.startswith(name + "{"):
                continue
            if label and label.rstrip("}") not in key:
                continue
            total += float(value)
        out[want] = total
    for line in lines:  # every end reason, for the report
        if line.startswith("kame_sessions_ended_total{"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def speech_wav(text: str, out: Path) -> Path:
    """A WAV of ``text`` spoken by espeak-ng, for Chromium's fake microphone."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise SystemExit("--say needs espeak-ng (apt-get install espeak-ng), or pass --speech-wav")
    subprocess.run([espeak, "-w", str(out), text], check=True)
    return out


def run_browser(page_url: str, seconds: float, wav: Path | None, seen: Seen, chromium: str) -> None:
    from playwright.sync_api import WebSocket, sync_playwright

    args = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream", "--autoplay-policy=no-user-gesture-required"]
    if wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={wav}")

    def on_ws(ws: WebSocket) -> None:
        if "/api/chat" not in ws.url:
            return
        seen.ws_url = ws.url
        seen.query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(ws.url).query))

        def received(payload: bytes | str) -> None:
            if isinstance(payload, str) or not payload:
                seen.received["non-binary"] = seen.received.get("non-binary", 0) + 1
                return
            name = KIND_NAMES.get(payload[0], f"0x{payload[0]:02x}")
            seen.received[name] = seen.received.get(name, 0) + 1
            if payload[0] == 1:
                seen.audio_arrivals.append(time.monotonic())
            if payload[0] == 4:
                try:
                    seen.metadata.append(json.loads(payload[1:].decode("utf-8")))
                except ValueError:
                    seen.metadata.append({"unparsable": payload[1:80].hex()})
            elif payload[0] == 2:
                seen.text += payload[1:].decode("utf-8", "replace")
            elif payload[0] == 5:
                seen.notices.append(payload[1:].decode("utf-8", "replace"))

        def sent(payload: bytes | str) -> None:
            if isinstance(payload, str) or not payload:
                seen.sent["non-binary"] = seen.sent.get("non-binary", 0) + 1
                return
            name = KIND_NAMES.get(payload[0], f"0x{payload[0]:02x}")
            seen.sent[name] = seen.sent.get(name, 0) + 1
            if payload[0] == 1:
                if not seen.first_sent_audio:
                    seen.first_sent_audio = payload[1:9].hex()
                seen.sent_opus_head = seen.sent_opus_head or b"OpusHead" in payload

        def closed(_: WebSocket) -> None:
            seen.closed = True

        ws.on("framereceived", received)
        ws.on("framesent", sent)
        ws.on("close", closed)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=args, headless=True)
        context = browser.new_context()
        context.grant_permissions(["microphone"])
        page = context.new_page()
        page.on("console", lambda m: seen.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: seen.page_errors.append(str(e)))
        page.on("websocket", on_ws)
        page.goto(page_url)
        page.get_by_role("button", name="Connect", exact=True).click(timeout=15_000)
        page.wait_for_timeout(3000)
        if not seen.ws_url:  # older builds: the conversation page has a Connect button of its own
            again = page.get_by_role("button", name="Connect", exact=True)
            if again.count():
                again.click()
        start = time.monotonic()
        while time.monotonic() - start < seconds and not seen.closed:
            page.wait_for_timeout(250)
        page.wait_for_timeout(1000)  # let the close (or the last frames) reach the page
        stats = page.locator(".player-stats")
        seen.stats_panel = stats.first.inner_text(timeout=1000) if stats.count() else ""
        panel = page.get_by_text("Our server is running on the following configuration")
        seen.server_info_panel = panel.inner_text(timeout=1000) if panel.count() else ""
        text_panel = page.locator(".player-text")
        seen.text_panel = text_panel.first.inner_text(timeout=1000) if text_panel.count() else ""
        seen.closed_by_server = seen.closed
        disconnect = page.get_by_role("button", name="Disconnect", exact=True)
        if not seen.closed and disconnect.count():
            disconnect.click()  # what a user does at the end: the client closes the socket
            seen.disconnect_clicked = True
            page.wait_for_timeout(1500)
        browser.close()


def played_seconds(stats_panel: str) -> float:
    """``Audio played: m:ss.cc`` of the client's stats panel, in seconds (0 when absent)."""
    for line in stats_panel.splitlines():
        if line.startswith("Audio played:"):
            minutes, _, rest = line.split(":", 1)[1].strip().partition(":")
            try:
                return 60 * float(minutes) + float(rest)
            except ValueError:
                return 0.0
    return 0.0


def checks(seen: Seen, max_duration: float | None, speech: bool) -> list[tuple[bool, str]]:
    bad_console = [
        c for c in seen.console
        if c.startswith("error:") and ("ZodError" in c or "invalid_type" in c or "Required" in c or "Unknown" in c)
    ]
    played = played_seconds(seen.stats_panel)
    results = [
        (bool(seen.ws_url), f"client opened /api/chat ({seen.ws_url or 'never'})"),
        (seen.received.get("handshake", 0) == 1, f"one 0x00 handshake received ({seen.received.get('handshake', 0)})"),
        (len(seen.metadata) == 1, f"exactly one 0x04 metadata message ({len(seen.metadata)})"),
        ("Instance name: kame" in seen.server_info_panel, "the client's schema accepted the server info (its panel shows it)"),
        (not bad_console, f"no schema or message error in the console ({bad_console[:3]})"),
        (not seen.page_errors, f"no uncaught page error ({seen.page_errors[:3]})"),
        (seen.received.get("audio", 0) > 10, f"audio received ({seen.received.get('audio', 0)} 0x01 messages)"),
        (played > 1.0, f"the client decoded and played kame's audio ({played:.2f} s played)"),
        (seen.received.get("text", 0) > 0, f"text received ({seen.received.get('text', 0)} 0x02 messages)"),
        (bool(seen.text_panel.strip()), f"the client shows the text ({seen.text_panel.strip()[:60]!r})"),
        (
            seen.sent.get("audio", 0) > 10 and seen.sent_opus_head,
            f"client sent Ogg/Opus ({seen.sent.get('audio', 0)} 0x01, OpusHead seen: {seen.sent_opus_head})",
        ),
        (not seen.server_log_errors, f"kame logged no session error ({seen.server_log_errors[:3]})"),
    ]
    if seen.metrics:
        results.append((seen.metrics.get("kame_protocol_errors_total", 0) == 0, "kame counted no protocol error"))
        if speech:
            heard = seen.metrics.get("kame_asr_partial_latency_seconds_count", 0)
            results.append((heard > 0, f"kame's ASR transcribed the client's Opus microphone ({heard:g} partials)"))
        if seen.disconnect_clicked:
            n = seen.metrics.get('kame_sessions_ended_total{reason="client_closed"}', 0)
            results.append((n == 1, f"the client's Disconnect ended the session as client_closed ({n:g})"))
    if max_duration is None:
        results.append((not seen.closed_by_server, "the session stayed up for the whole run"))
    else:
        results.append((seen.closed_by_server, "kame ended the session at the maximum duration"))
        if seen.metrics:
            n = seen.metrics.get('kame_sessions_ended_total{reason="max_duration"}', 0)
            results.append((n == 1, f"kame counted it as max_duration ({n:g})"))
        results.append((any("session ends in" in n for n in seen.notices), f"the 0x05 warning arrived ({seen.notices})"))
        results.append((any("maximum session duration reached" in n for n in seen.notices), "the 0x05 close reason arrived"))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client-dist", type=Path, required=True, help="folder of a built Kyutai web client (its dist/)")
    ap.add_argument("--server", help="HOST:PORT of a running kame server (default: start kame serve --config cpu-demo)")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long to stay connected")
    ap.add_argument("--max-duration", type=float, help="start kame with this server.max_duration_s and check the end notices")
    ap.add_argument("--say", help="text espeak-ng speaks into the fake microphone")
    ap.add_argument("--speech-wav", type=Path, help="WAV for the fake microphone")
    ap.add_argument(
        "--from-kame", action="store_true",
        help="let kame serve the build (kame serve --client-dir) and open it at / with no worker_addr",
    )
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--json", type=Path, help="write what was seen here")
    args = ap.parse_args(argv)
    if not (args.client_dist / "index.html").is_file():
        raise SystemExit(f"{args.client_dist}: no index.html (build Kyutai's client first: npx vite build)")
    if (args.max_duration is not None or args.from_kame) and args.server:
        raise SystemExit("--max-duration and --from-kame start their own server; drop --server")

    tmp = Path(tempfile.mkdtemp(prefix="kame-kyutai-client-"))
    wav = args.speech_wav or (speech_wav(args.say, tmp / "speech.wav") if args.say else None)
    proc = None
    log = tmp / "kame.log"
    if args.server:
        worker = args.server
    else:
        port = free_port()
        proc = start_kame(port, args.max_duration, log, args.client_dist if args.from_kame else None)
        worker = f"127.0.0.1:{port}"
    httpd, http_port = serve_dist(args.client_dist)
    page_url = f"http://{worker}/" if args.from_kame else f"http://127.0.0.1:{http_port}/?worker_addr={worker}"
    seen = Seen()
    try:
        seconds = args.seconds if args.max_duration is None else args.max_duration + 10
        run_browser(page_url, seconds, wav, seen, args.chromium)
    finally:
        httpd.shutdown()
        # The session's end is counted once its tasks are done (seconds on a loaded machine).
        deadline = time.monotonic() + 15
        while True:
            seen.metrics = read_metrics(worker)
            ended = sum(v for k, v in seen.metrics.items() if k.startswith("kame_sessions_ended_total{"))
            if ended >= 1 or time.monotonic() > deadline or not seen.ws_url:
                break
            time.sleep(0.5)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
            lines = log.read_text(errors="replace").splitlines()
            seen.server_log_errors = [
                line for line in lines if " ERROR " in line or "Traceback" in line or "corrupt" in line
            ]
    results = checks(seen, args.max_duration, speech=wav is not None)
    for ok, what in results:
        print(("ok   " if ok else "FAIL ") + what)
    print(f"query sent by the client: {seen.query}")
    print(f"received by kind: {seen.received}; sent by kind: {seen.sent}")
    print(f"server metrics: {seen.metrics}")
    gaps = sorted(b - a for a, b in zip(seen.audio_arrivals, seen.audio_arrivals[1:]))
    if gaps:
        print(
            f"0x01 inter-arrival: median {1000 * gaps[len(gaps) // 2]:.0f} ms, "
            f"p95 {1000 * gaps[int(0.95 * (len(gaps) - 1))]:.0f} ms, max {1000 * gaps[-1]:.0f} ms; "
            f"client stats: {' '.join(seen.stats_panel.split())}"
        )
    if args.json:
        args.json.write_text(json.dumps(asdict(seen), indent=2, ensure_ascii=False))
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
