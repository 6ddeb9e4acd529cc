"""A real TURN server (Debian's coturn) on loopback: long-term credentials, a small relay port range.

The ``openai`` shared server (tests/support/servers.py) relays every WebRTC call through it
(tests/test_webrtc_turn.py), so it starts before that server, once per run (``conftest.py``'s ``coturn``).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.moshi_client import free_port

TURN_USER = "kame"
TURN_PASSWORD = "turn-pw-7c41d9"
RELAY_PORTS = (49700, 49799)


@dataclass(frozen=True)
class Turn:
    """A running coturn: its UDP port and its log (which says who allocated what)."""

    port: int
    log: Path


@contextlib.contextmanager
def running_coturn(tmp: Path) -> Iterator[Turn]:
    """Start coturn with ``TURN_USER``/``TURN_PASSWORD``, wait for its UDP listener, stop it at the end."""
    port = free_port()
    log = tmp / "turnserver.log"
    proc = subprocess.Popen(
        ["/usr/bin/turnserver", "-n", "--listening-ip", "127.0.0.1", "--relay-ip", "127.0.0.1",
         "--listening-port", str(port), "--min-port", str(RELAY_PORTS[0]), "--max-port", str(RELAY_PORTS[1]),
         "--lt-cred-mech", "--user", f"{TURN_USER}:{TURN_PASSWORD}", "--realm", "kame.test",
         "--allow-loopback-peers", "--no-tls", "--no-dtls", "--no-cli", "--no-tcp-relay",
         "--log-file", str(log), "--simple-log", "-v"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while not (log.exists() and re.search(r"listener opened on|IPv4. UDP listener", log.read_text())):
            assert proc.poll() is None, f"turnserver exited: {log.read_text() if log.exists() else ''}"
            assert time.monotonic() < deadline, "turnserver did not start"
            time.sleep(0.1)
        yield Turn(port, log)
    finally:
        proc.terminate()
        proc.wait(10)
