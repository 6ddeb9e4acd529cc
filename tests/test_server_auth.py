"""Bearer token (header, query, subprotocol) and origin allow-list on the real server; secrets stay secret."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.moshi_client import MoshiClient, ServerProcess
from tests.support.servers import GOOD_ORIGIN, SECURED_TOKEN

TOKEN = SECURED_TOKEN


@pytest.fixture(scope="module")
def server(secured_server: ServerProcess) -> Iterator[ServerProcess]:
    """The shared ``secured`` server (tests/support/servers.py): a bearer token and an origin allow-list."""
    yield secured_server


def _session(server: ServerProcess, **kwargs: Any) -> MoshiClient:
    async def main() -> MoshiClient:
        c = await MoshiClient.connect(server.ws_url, **kwargs)
        if await c.wait_handshake(10):
            await c.send_silence(0.3)
            await c.close()
        else:
            await c.wait_closed(5)
        return c

    return asyncio.run(main())


def test_token_in_header_query_or_subprotocol_opens_a_session(server: ServerProcess) -> None:
    assert _session(server, token=TOKEN).handshake.is_set()
    assert _session(server, query={"token": TOKEN}).handshake.is_set()
    c = _session(server, subprotocols=[f"openai-insecure-api-key.{TOKEN}", "realtime"])
    assert c.handshake.is_set()
    assert c.subprotocol == "realtime"


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"token": "wrong"}, {"query": {"token": TOKEN[:-1]}}, {"subprotocols": ["openai-insecure-api-key.nope", "realtime"]}],
    ids=["missing", "wrong-header", "wrong-query", "wrong-subprotocol"],
)
def test_missing_or_wrong_token_closes_with_1008(server: ServerProcess, kwargs: dict[str, Any]) -> None:
    before = server.metric("kame_sessions_rejected_total", 'reason="unauthorized"', {"Authorization": f"Bearer {TOKEN}"})
    c = _session(server, **kwargs)
    assert not c.handshake.is_set()
    assert (c.close_code, c.close_reason) == (1008, "unauthorized")
    after = server.metric("kame_sessions_rejected_total", 'reason="unauthorized"', {"Authorization": f"Bearer {TOKEN}"})
    assert after == before + 1


def test_origin_allow_list(server: ServerProcess) -> None:
    assert _session(server, token=TOKEN, origin=GOOD_ORIGIN).handshake.is_set()
    c = _session(server, token=TOKEN, origin="http://evil.example")
    assert not c.handshake.is_set()
    assert (c.close_code, c.close_reason) == (1008, "origin not allowed")


def test_http_endpoints_need_the_token_except_health(server: ServerProcess) -> None:
    assert server.get("/health")[0] == 200
    assert server.get("/ready")[0] == 200
    assert server.get("/metrics")[0] == 401
    assert server.get("/v1/backends")[0] == 401
    assert server.get("/metrics", {"Authorization": "Bearer nope"})[0] == 401
    assert server.get("/metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert server.get(f"/metrics?token={TOKEN}")[0] == 200
    status, body = server.get("/v1/backends", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "scripted" in body


def test_the_token_never_shows_in_logs_metrics_or_responses(server: ServerProcess) -> None:
    hdr = {"Authorization": f"Bearer {TOKEN}"}
    # make sure the token has passed through every path first
    _session(server, query={"token": TOKEN})
    _session(server, query={"token": "wrong-" + TOKEN})
    server.get(f"/metrics?token={TOKEN}")
    for path in ("/health", "/ready", "/metrics", "/v1/backends"):
        assert TOKEN not in server.get(path, hdr)[1], path
    logs = server.logs()
    assert "/api/chat" in logs  # uvicorn logged the websocket requests...
    assert TOKEN not in logs  # ...with the token masked
