"""``server.client_dir``: a web client build served at ``/`` (as ``moshi.server --static`` does).

The build here is a stand-in folder in the layout Vite gives (``index.html``,
``assets/*.js``, ``assets/*.wasm``); the real Kyutai client is checked by
``scripts/kyutai_web_client_check.py --from-kame`` (docs/protocol.md, "Clients tested").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kame.server.app.factory import create_app
from kame.server.app.static import ClientDirError, check_client_dir
from kame.server.config import AppConfig


def build(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text('<!doctype html><div id="root">client build</div>')
    (dist / "assets" / "index-abc.js").write_text("console.log('client');")
    (dist / "assets" / "decoderWorker.min.wasm").write_bytes(b"\0asm\x01\0\0\0")
    (tmp_path / "secret.txt").write_text("outside the build")
    return dist


def client(cfg: AppConfig) -> TestClient:
    return TestClient(create_app(cfg, device="cpu", environ={}))  # no lifespan: nothing loads


def test_client_build_is_served_at_root_and_kame_routes_win(tmp_path: Path) -> None:
    dist = build(tmp_path)
    http = client(AppConfig.model_validate({"server": {"client_dir": str(dist)}}))
    root = http.get("/?worker_addr=127.0.0.1:8998")
    assert root.status_code == 200 and "client build" in root.text
    js = http.get("/assets/index-abc.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    wasm = http.get("/assets/decoderWorker.min.wasm")  # instantiateStreaming needs this type
    assert wasm.status_code == 200 and wasm.headers["content-type"] == "application/wasm"
    assert http.get("/assets/missing.js").status_code == 404
    assert http.get("/../secret.txt").status_code == 404
    assert http.get("/assets/..%2F..%2Fsecret.txt").status_code == 404
    page = http.get("/kame")  # kame's own page moved, its relative URLs still resolve from /
    assert page.status_code == 200 and 'src="static/app.js"' in page.text
    assert http.get("/static/app.js").status_code == 200
    assert http.get("/ready").status_code == 503  # kame's routes are not shadowed (not loaded yet)
    with http.websocket_connect("/api/chat") as ws:  # nor its websockets: kame's refusal, not a file
        notice = ws.receive_bytes()
    assert notice[0] == 0x05 and b"starting" in notice


def test_default_root_is_kames_page(tmp_path: Path) -> None:
    http = client(AppConfig())
    root = http.get("/")
    assert root.status_code == 200 and 'src="static/app.js"' in root.text
    assert http.get("/assets/index-abc.js").status_code == 404
    assert http.get("/kame").status_code == 404


def test_client_dir_without_index_is_a_one_sentence_error(tmp_path: Path) -> None:
    with pytest.raises(ClientDirError, match="no index.html"):
        check_client_dir(tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "kame.cli", "serve", "--config", "cpu-demo", "--client-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode != 0
    assert "no index.html" in res.stderr and "Traceback" not in res.stderr
