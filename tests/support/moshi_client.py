"""Test helpers around the Moshi-protocol client: the client itself lives in
``kame.client.moshi_client``; this module adds a real server in a subprocess."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kame.client.moshi_client import (  # noqa: F401  (re-exported for tests and benches)
    FRAME,
    FRAME_S,
    RATE,
    ClientStats,
    MoshiClient,
    percentile,
    run_session,
)

# --------------------------------------------------------------------------- a real server in a subprocess


#: pytest-xdist workers each count up through their own block of ports below Linux's ephemeral range
#: (32768 and up, what ``bind(0)`` hands out), so two workers starting servers at once never pick the
#: same port: a port found with ``bind(0)`` and released is free only until someone binds it, and a server
#: takes seconds to bind its own.
_PORT_BLOCK = 1500
_next_port: list[int] = []


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a server this process starts (see :data:`_PORT_BLOCK`)."""
    import os
    import socket

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    first = 20000 + _PORT_BLOCK * int(worker[2:])
    if not _next_port:
        _next_port.append(first)
    for _ in range(_PORT_BLOCK):
        port = _next_port[0]
        _next_port[0] = first + (port + 1 - first) % _PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + _PORT_BLOCK - 1}")


@dataclass
class ServerStart:
    """One ``kame serve`` process a run started: its label, who asked for it, how long it took to be ready."""

    label: str
    requested_by: str
    seconds: float


#: Every start in this Python process, in order (tests/conftest.py prints them at the end of a run).
SERVER_STARTS: list[ServerStart] = []
#: Who is asking for a server right now (set by tests/conftest.py around each test's set-up and call).
CURRENT_REQUESTER: list[str] = ["(outside pytest)"]
#: Set in a niced batch worker of the test run (tests/conftest.py): a server started there would run behind
#: the real-time lane's, so starting one is an error that names the test to mark ``realtime``.
BATCH_LANE_ENV = "PYTEST_KAME_BATCH_WORKER"


class ServerProcess:
    """``kame serve`` in a subprocess on 127.0.0.1 and a free port, for tests and benches.

    The environment is hermetic: every inherited ``KAME_*`` variable is
    dropped, then ``env`` is applied (settings such as
    ``KAME_SERVER__IDLE_TIMEOUT_S``). Output goes to ``log_path``.
    """

    def __init__(
        self,
        *,
        cache_dir: Any,
        log_path: Any,
        config: str = "cpu-demo",
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        port: int | None = None,
        label: str | None = None,
    ) -> None:
        import os
        import sys
        from pathlib import Path

        self.port = port or free_port()
        self.log_path = Path(log_path)
        base = {k: v for k, v in os.environ.items() if not k.startswith("KAME_")}
        base.update(
            {
                # One Whisper thread: see OMP_NUM_THREADS in tests/conftest.py (many servers, two cores).
                "KAME_ASR__WHISPER__CPU_THREADS": "1",
                "KAME_CACHE_DIR": str(cache_dir),
                "NO_TORCH_COMPILE": "1",
                # every call into moshi's models must hold kame's moshi gate: a call outside it fails the session
                "KAME_MOSHI_GATE_CHECK": "1",
                "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        base.update(env or {})
        self.env = base
        self.cmd = [sys.executable, "-m", "kame.cli", "serve", "--config", config, "--port", str(self.port), *args]
        self.proc: Any = None
        self.statuses_seen: list[str] = []
        #: where the server records its sessions, when a fixture configured that (else None)
        self.record_dir: Path | None = None
        self.label = label or (Path(config).stem if config != "cpu-demo" else "cpu-demo")

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/chat"

    def start(self, timeout: float = 180.0) -> ServerProcess:
        """Start and wait until ``/ready`` answers 200 (records every /health status seen)."""
        import subprocess

        if os.environ.get(BATCH_LANE_ENV):
            raise RuntimeError(f"{CURRENT_REQUESTER[-1]} starts a server on a niced batch worker "
                               f"({os.environ[BATCH_LANE_ENV]}): mark it @pytest.mark.realtime (tests/conftest.py)")
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        t0 = time.monotonic()
        SERVER_STARTS.append(ServerStart(self.label, CURRENT_REQUESTER[-1], float("nan")))
        record = SERVER_STARTS[-1]
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                status, body = self.get("/health", timeout=1.0)
                if status == 200:
                    state = json.loads(body)["status"]
                    if not self.statuses_seen or self.statuses_seen[-1] != state:
                        self.statuses_seen.append(state)
                    if state == "ok":
                        record.seconds = time.monotonic() - t0
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server not ready within {timeout} s:\n{self.logs()[-3000:]}")

    def get(self, path: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.http_url + path, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def get_json(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
        status, body = self.get(path, headers)
        return status, json.loads(body)

    def metric(self, name: str, labels: str = "", headers: Mapping[str, str] | None = None) -> float:
        """One sample of ``/metrics`` (0.0 when absent), e.g. ``metric("kame_sessions_rejected_total", 'reason="full"')``."""
        _, body = self.get("/metrics", headers)
        key = f"{name}{{{labels}}}" if labels else name
        for line in body.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self, sig: int | None = None, timeout: float = 10.0) -> int | None:
        import signal

        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig if sig is not None else signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return int(self.proc.returncode)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
