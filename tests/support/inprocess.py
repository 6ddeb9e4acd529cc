"""``kame serve``'s app in this process (uvicorn in a thread): for checkpoints no shared server has
(PersonaPlex, 8-bit, release layouts), without spending a server process of the run's budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.moshi_client import free_port


class InProcessServer:
    """``kame serve``'s app on a checkpoint, served by uvicorn in a thread of this process."""

    def __init__(self, ckpt: Path | str, cache_dir: Path, frontend: dict[str, Any] | None = None) -> None:
        import threading

        import uvicorn

        from kame.server.app.factory import create_app
        from kame.server.config import AppConfig

        cfg = AppConfig.model_validate({
            "cache_dir": str(cache_dir), "device": "cpu", "asr": {"kind": "none"},
            "frontend": {"checkpoint": str(ckpt), "batch_size": 2, "dtype": "float32", **(frontend or {})},
            "server": {"warmup_steps": 1, "gc_interval_s": 0},
        })
        self.app = create_app(cfg, device="cpu", environ={})
        self.port = free_port()
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> InProcessServer:
        import time

        self.thread.start()
        deadline = time.monotonic() + 60
        while True:
            status, body = self.get("/health")
            if status == 200 and json.loads(body).get("status") == "ok":
                return self
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def get(self, path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.http_url + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return 0, "{}"

    def metric(self, name: str) -> float:
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0
