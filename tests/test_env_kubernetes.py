"""``kame serve`` starts inside a Kubernetes namespace whose Service ``kame`` injects service links."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.environment import K8S_SERVICE_LINKS
from tests.support.moshi_client import ServerProcess

#: The servers here are the subject (environment variables, replicas behind HAProxy): not counted.
#: the real-time lane under xdist (tests/conftest.py): its own server process
pytestmark = [pytest.mark.server_process_subject, pytest.mark.realtime]


def test_serve_starts_with_kubernetes_service_link_variables(kame_cache_dir: Path, tmp_path: Path) -> None:
    srv = ServerProcess(
        cache_dir=kame_cache_dir,
        log_path=tmp_path / "server.log",
        env={**K8S_SERVICE_LINKS, "KAME_ASR__KIND": "none", "KAME_FRONTEND__BATCH_SIZE": "1"},
    ).start()
    try:
        status, body = srv.get_json("/health")
        assert status == 200 and body["status"] == "ok"
    finally:
        srv.stop(signal.SIGTERM)
    logs = srv.logs().splitlines()
    for name in K8S_SERVICE_LINKS:
        lines = [line for line in logs if f"environment variable {name} is not a kame setting" in line]
        assert len(lines) == 1, (name, lines)
        assert "WARNING" in lines[0]
    assert "no such setting" not in srv.logs()
