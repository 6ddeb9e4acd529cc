"""A real Redis (Debian's ``redis-server``) on loopback with a password and no persistence, for the resume
tests (tests/calls/test_resume_*.py): the store a draining replica hands its sessions over through."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


class RedisServer:
    def __init__(self, run_dir: Path, password: str) -> None:
        from tests.support.moshi_client import free_port

        self.run_dir = Path(run_dir)
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server missing: scripts/install.sh --test installs Debian's redis-server"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.run_dir / "redis.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", self.password,
             "--save", "", "--appendonly", "no", "--dir", str(self.run_dir)],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5) as sock:
                    sock.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                    if b"PONG" in sock.recv(100):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
