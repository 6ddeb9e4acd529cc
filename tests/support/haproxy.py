"""A real HAProxy (Debian's ``haproxy``) in front of kame replicas on loopback, for tests and benches.

The config is the one shipped in ``deploy/haproxy.cfg``; only what names this machine is replaced:
the frontend's ``bind`` (a free loopback port), the backend's ``server`` lines (the replicas given),
the stats socket (a file in the run directory, read with HAProxy's runtime API ``show stat``) and
the global ``maxconn`` (the shipped one needs a higher file-descriptor limit than tests have).
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = ROOT / "deploy" / "haproxy.cfg"
#: The backend that websocket upgrades (sessions) go to; plain HTTP has its own (kame_http).
SESSION_BACKEND = "kame"


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    assert found is not None, "haproxy missing: scripts/install.sh --test installs Debian's haproxy"
    return found


@dataclass(frozen=True)
class Backend:
    name: str
    port: int
    maxconn: int


def local_config(shipped: str, *, port: int, servers: Sequence[Backend], stats_socket: Path) -> str:
    """``shipped`` with this machine's bind port, server lines and stats socket; everything else kept."""
    out: list[str] = []
    section = ""
    written: set[str] = set()
    for line in shipped.splitlines():
        stripped = line.strip()
        if line and not line[0].isspace():
            section = stripped
        if section == "global" and stripped.startswith("maxconn "):
            out.append("    maxconn 1000")  # the shipped 20000 needs more file descriptors than a test may open
        elif stripped.startswith("stats socket "):
            out.append(f"    stats socket {stats_socket} mode 600 level admin")
        elif section.startswith("frontend") and stripped.startswith("bind "):
            out.append(f"    bind 127.0.0.1:{port}")
        elif section.startswith("backend") and stripped.startswith("server "):
            if section not in written:  # the session backend caps each replica at its slots
                cap = section == f"backend {SESSION_BACKEND}"
                out += [f"    server {s.name} 127.0.0.1:{s.port}" + (f" maxconn {s.maxconn}" if cap else "") for s in servers]
                written.add(section)
        else:
            out.append(line)
    text = "\n".join(out) + "\n"
    assert f"backend {SESSION_BACKEND}" in written and f"127.0.0.1:{port}" in text, (
        "deploy/haproxy.cfg lost its bind or server lines")
    return text


@dataclass
class ServerStat:
    """One row of ``show stat`` for a backend server."""

    name: str
    status: str  # UP, DOWN, MAINT, "UP 1/2"...
    current: int  # scur: connections open now
    maximum: int  # smax: most at once since start
    total: int  # stot: connections ever sent to it


class HAProxy:
    """``haproxy -f`` with the shipped config adapted to loopback, in the foreground (``-db``)."""

    def __init__(self, run_dir: Path, servers: Sequence[Backend], port: int | None = None) -> None:
        from tests.support.moshi_client import free_port

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.servers = list(servers)
        self.socket_path = self.run_dir / "haproxy.sock"
        self.config_path = self.run_dir / "haproxy.cfg"
        self.log_path = self.run_dir / "haproxy.log"
        self.config_path.write_text(
            local_config(SHIPPED_CONFIG.read_text(), port=self.port, servers=self.servers, stats_socket=self.socket_path)
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/chat"

    def start(self, timeout: float = 15.0) -> HAProxy:
        binary = haproxy_binary()
        check = subprocess.run([binary, "-c", "-f", str(self.config_path)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([binary, "-db", "-f", str(self.config_path)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}:\n{self.logs()[-2000:]}")
            if self.socket_path.exists():
                try:
                    self.stats()
                    return self
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"haproxy did not start:\n{self.logs()[-2000:]}")

    def command(self, cmd: str) -> str:
        """One runtime API command on the stats socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect(str(self.socket_path))
            s.sendall(cmd.encode() + b"\n")
            chunks = []
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode()

    def stats(self) -> dict[str, ServerStat]:
        raw = self.command("show stat").lstrip("# ")
        rows: dict[str, ServerStat] = {}
        for row in csv.DictReader(io.StringIO(raw)):
            if row.get("pxname") == SESSION_BACKEND and row.get("svname") not in ("BACKEND", "FRONTEND"):
                rows[row["svname"]] = ServerStat(
                    row["svname"], row["status"], int(row["scur"] or 0), int(row["smax"] or 0), int(row["stot"] or 0)
                )
        return rows

    def wait_status(self, name: str, status: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stats()[name].status.split()[0] == status:
                return
            time.sleep(0.05)
        raise AssertionError(f"haproxy: {name} not {status} within {timeout} s: {self.stats()[name]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None:
            self._log.close()

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_lines_for(self, server: str) -> list[str]:
        """HTTP log lines of connections that HAProxy sent to ``server`` (``kame/<server>``)."""
        return [line for line in self.logs().splitlines() if re.search(rf"\bkame/{re.escape(server)}\b", line)]


@dataclass
class SessionRun:
    """One session of a :class:`StreamingClient`."""

    ws: Any  # MoshiClient
    local_port: int
    opened_t: float
    closed_t: float | None = None
    close_code: int | None = None
    close_reason: str = ""
    replica: str = "?"


@dataclass
class StreamingClient:
    """A caller that streams a tone at real time through ``url`` until ``stop_at`` (monotonic), and
    reconnects like ``kame mic`` (kame.client.reconnect) when a session is refused or drained."""

    index: int
    url: str
    sessions: list[SessionRun] = field(default_factory=list)
    gave_up: str | None = None
    said: list[str] = field(default_factory=list)

    async def run(self, stop_at: float, policy: Any = None) -> None:
        import numpy as np

        from kame.client.reconnect import Backoff, GaveUp, Refused, Retrier, open_with_retry, retry_reason
        from tests.support.moshi_client import RATE, MoshiClient

        retrier = Retrier(policy or Backoff(), say=self.said.append)
        tone = (0.05 * np.sin(2 * np.pi * 220 * np.arange(RATE) / RATE)).astype(np.float32)
        while time.monotonic() < stop_at:
            try:
                ws = await open_with_retry(lambda: MoshiClient.connect(self.url, open_timeout=10),
                                           lambda c: c.wait_handshake(15), retrier)
            except (GaveUp, Refused, OSError) as exc:
                self.gave_up = f"{type(exc).__name__}: {exc}"
                return
            run = SessionRun(ws, int(ws.ws.local_address[1]), time.monotonic())
            self.sessions.append(run)
            seconds = max(0.0, stop_at - time.monotonic())
            await ws.send_pcm(np.tile(tone, int(seconds) + 1)[: int(seconds * RATE)], realtime=True)  # early on close
            server_closed = ws.closed.is_set()
            run.closed_t = time.monotonic()
            await ws.close()
            run.close_code, run.close_reason = ws.close_code, ws.close_reason
            if not (server_closed and retry_reason(close_code=ws.close_code)):
                return
            retrier.reset()
            if not await retrier.wait(f"session closed ({ws.close_code} {ws.close_reason})"):
                self.gave_up = "retries used up"
                return


_LOG_LINE = re.compile(r"\b127\.0\.0\.1:(\d+) \[[^\]]+\] kame kame/(\S+) ")


def attribute_replicas(lb: HAProxy, clients: Sequence[StreamingClient], wait_s: float = 5.0) -> None:
    """Set each session's ``replica`` from HAProxy's log. HAProxy writes a connection's line once both of
    its sides have closed, which on a loaded machine may come a while after the client's close returned:
    wait (at most ``wait_s``) until every session has its line; one still without a line stays ``?``."""
    ports = {s.local_port for c in clients for s in c.sessions}
    deadline = time.monotonic() + wait_s
    while True:
        by_port = {int(m.group(1)): m.group(2) for m in _LOG_LINE.finditer(lb.logs())}
        if ports <= by_port.keys() or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    for c in clients:
        for s in c.sessions:
            s.replica = by_port.get(s.local_port, "?")


def start_replicas(count: int, *, cache_dir: Any, run_dir: Path, env: dict[str, str]) -> list[Any]:
    """``count`` kame servers (CPU demo) started in parallel; each waits until ready."""
    import concurrent.futures

    from tests.support.moshi_client import ServerProcess

    procs = [
        ServerProcess(cache_dir=cache_dir, log_path=Path(run_dir) / f"kame{i + 1}.log", env=env) for i in range(count)
    ]
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        started = list(pool.map(lambda p: p.start(timeout=240.0), procs))
    return started
