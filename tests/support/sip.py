"""Real parts for the SIP tests: a phone (PJSIP's user agent, tests/support/sip_phone.py, in a subprocess),
the operator's webhook app (a tiny HTTP server on loopback whose handler uses only the ``openai`` SDK),
and free SIP and RTP ports."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

PHONE = Path(__file__).with_name("sip_phone.py")


def free_sip_port(count: int = 1) -> int:
    """The first of ``count`` consecutive ports free for both UDP and TCP on 127.0.0.1."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            base = int(u.getsockname()[1])
        if all(_free_both(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free SIP port")


def _free_both(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket() as t:
        try:
            u.bind(("127.0.0.1", port))
            t.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_rtp_range(size: int = 64) -> int:
    """The first port of ``size`` consecutive UDP ports free on 127.0.0.1 (probed; below the ephemeral range)."""
    import random

    for _ in range(100):
        base = random.randrange(10000, 30000, 2)
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free RTP range")


def speech_wav(path: Path, text: str) -> Path:
    """espeak-ng's speech of ``text`` as a WAV file (what the phone plays)."""
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    return path


def wav_rms(path: Path) -> tuple[float, float]:
    """(seconds, RMS in full scale) of a 16-bit WAV file."""
    with wave.open(str(path)) as w:
        data = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
        seconds = w.getnframes() / w.getframerate()
    return seconds, float(np.sqrt(np.mean(data**2))) if len(data) else 0.0


def first_sound(path: Path, level: float = 0.003) -> float:
    """Seconds from the start of a 16-bit WAV recording to its first sample above ``level`` (inf: none)."""
    with wave.open(str(path)) as w:
        data = np.abs(np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768)
        rate = w.getframerate()
    loud = np.flatnonzero(data > level)
    return float(loud[0]) / rate if len(loud) else float("inf")


class Phone:
    """One call placed by tests/support/sip_phone.py; its JSON events are collected as they come."""

    def __init__(self, **cfg: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen([sys.executable, str(PHONE), json.dumps(cfg)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in list(self.events):
                if match(event):
                    return event
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"phone event not seen; events: {self.events}")

    def finish(self, timeout: float = 30) -> list[dict[str, Any]]:
        self.proc.wait(timeout)
        self._reader.join(5)
        return self.events

    @staticmethod
    def states_of(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
        return [(e["state"], e["code"]) for e in events if e["event"] == "state"]


class WebhookApp:
    """The operator's app: receives kame's webhooks on loopback; ``handler(headers, body)`` runs for each
    (it may accept the call before the 200 goes back, as OpenAI's example does) and may raise to answer 500."""

    def __init__(self) -> None:
        self.handler: Callable[[dict[str, str], bytes], None] = lambda headers, body: None
        self.received: list[tuple[dict[str, str], bytes]] = []
        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                app.received.append((headers, body))
                try:
                    app.handler(headers, body)
                    self.send_response(200)
                except Exception:  # noqa: BLE001 - the app failed: kame retries
                    self.send_response(500)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/webhook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


KAMAILIO_CFG = Path(__file__).resolve().parents[2] / "deploy" / "sip" / "kamailio.cfg"


class Kamailio:
    """deploy/sip/kamailio.cfg run for real: SIP over TLS (a self-signed certificate made here) on
    ``tls_port``, forwarded to kame's UDP ``kame_port``, record-routed."""

    def __init__(self, workdir: Path, kame_port: int) -> None:
        self.workdir = workdir
        self.cert, self.key = workdir / "cert.pem", workdir / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key),
                        "-out", str(self.cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
        tls = workdir / "tls.cfg"
        tls.write_text(f"[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\nrequire_certificate = no\n"
                       f"private_key = {self.key}\ncertificate = {self.cert}\n\n"
                       "[client:default]\nmethod = TLSv1.2+\nverify_certificate = no\nrequire_certificate = no\n")
        self.tls_port = free_sip_port()
        udp_port = free_sip_port()
        run = workdir / "run"
        run.mkdir(exist_ok=True)
        self.log = workdir / "kamailio.log"
        self._log = open(self.log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["kamailio", "-DD", "-E", "-f", str(KAMAILIO_CFG), "-Y", str(run), "-w", str(run),
             "-A", f"PUBLIC_TLS=tls:127.0.0.1:{self.tls_port}", "-A", f"PRIVATE_UDP=udp:127.0.0.1:{udp_port}",
             "-A", f'KAME="sip:127.0.0.1:{kame_port};transport=udp"', "-A", f'TLS_CFG="{tls}"'],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.tls_port)) == 0:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.close()
        raise RuntimeError(f"kamailio did not start:\n{self.log.read_text(errors='replace')[-2000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
