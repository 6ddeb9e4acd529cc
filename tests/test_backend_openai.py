"""The openai back-end against a real local HTTP server: streaming, cancellation, timeouts, errors, keys."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from typing import Any

import pytest

from kame.backend.config import BackendConfig
from kame.backend.errors import (
    BackendAuthError,
    BackendError,
    BackendMalformedStream,
    BackendRateLimited,
    BackendRequestError,
    BackendServerError,
    BackendTimeout,
    BackendUnavailable,
    error_detail,
)
from kame.backend.openai_backend import OpenAIBackend
from tests.support.llm_server import LlmServer, Reply
from tests.support.moshi_client import free_port

KEY = "sk-kametest-SECRET-7f3a9c0d1e2b"
USER = [{"role": "user", "content": "Hello?"}]


def make(server: LlmServer, environ: dict[str, str] | None = None, **fields: Any) -> OpenAIBackend:
    data: dict[str, Any] = {"base_url": server.base_url, "model": "test-model", "api_key_env": "KAME_TEST_KEY"}
    data.update(fields)
    return OpenAIBackend("t", BackendConfig.model_validate(data), {"KAME_TEST_KEY": KEY} if environ is None else environ)


async def collect(backend: OpenAIBackend, messages: Any = USER, **kw: Any) -> list[str]:
    out = []
    async for chunk in backend.stream(messages, **kw):
        out.append(chunk)
    return out



def test_streams_text_chunks_and_sends_the_request(llm_server: LlmServer) -> None:
    llm_server.push(Reply(chunks=["Hi", " there", ",", " friend."]))
    backend = make(llm_server, max_tokens=42, temperature=0.3)

    async def main() -> list[str]:
        try:
            return await collect(backend, [{"role": "system", "content": "Be brief."}, *USER])
        finally:
            await backend.aclose()

    chunks = asyncio.run(main())
    assert chunks == ["Hi", " there", ",", " friend."]
    (req,) = llm_server.chat_requests()
    assert req.completed and not req.disconnected
    assert req.body["stream"] is True
    assert req.body["model"] == "test-model"
    assert req.body["max_tokens"] == 42 and req.body["temperature"] == 0.3
    assert req.body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]


def test_per_request_overrides_of_max_tokens_and_temperature(llm_server: LlmServer) -> None:
    backend = make(llm_server, max_tokens=42)
    asyncio.run(collect(backend, max_tokens=7, temperature=1.1))
    body = llm_server.chat_requests()[0].body
    assert body["max_tokens"] == 7 and body["temperature"] == 1.1


def test_extra_headers_and_body_arrive(llm_server: LlmServer) -> None:
    backend = make(
        llm_server,
        headers={"X-Kame-Test": "yes", "HTTP-Referer": "https://example.org"},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "top_k": 5},
    )
    asyncio.run(collect(backend))
    req = llm_server.chat_requests()[0]
    assert req.headers["x-kame-test"] == "yes"
    assert req.headers["http-referer"] == "https://example.org"
    assert req.body["chat_template_kwargs"] == {"enable_thinking": False}
    assert req.body["top_k"] == 5


def test_key_from_named_env_var_is_sent_as_bearer_and_read_per_request(llm_server: LlmServer) -> None:
    environ = {"KAME_TEST_KEY": KEY}
    backend = make(llm_server, environ=environ)

    async def main() -> None:
        await collect(backend)
        environ["KAME_TEST_KEY"] = "sk-rotated"
        await collect(backend)
        del environ["KAME_TEST_KEY"]
        await collect(backend)

    asyncio.run(main())
    first, second, third = llm_server.chat_requests()
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert second.headers["authorization"] == "Bearer sk-rotated"
    assert "authorization" not in third.headers  # no key: no header (local servers)


def test_model_discovered_from_models_endpoint_when_not_configured(llm_server: LlmServer) -> None:
    llm_server.models = ["served-model", "other"]
    backend = make(llm_server, model=None)
    assert asyncio.run(collect(backend))
    assert llm_server.chat_requests()[0].model == "served-model"
    assert backend.model == "served-model"


# ---------------------------------------------------------------------- cancellation


def _assert_disconnect_seen(server: LlmServer, stopped_at: float) -> None:
    req = server.chat_requests()[-1]
    assert req.wait_ended(3), "server handler did not finish"
    assert req.disconnected, "server did not see the client go away"
    assert not req.completed
    assert req.disconnected_at is not None and req.disconnected_at - stopped_at < 1.0


@pytest.mark.parametrize("how", ["cancel_task", "aclose", "cancel_before_first_token"])
def test_stopping_the_consumer_closes_the_http_stream(llm_server: LlmServer, how: str) -> None:
    if how == "cancel_before_first_token":
        llm_server.push(Reply(hang_after_chunks=0))
    else:
        llm_server.push(Reply(text=" ".join(["word"] * 100), chunk_delay_s=0.1))
    backend = make(llm_server)
    received: list[str] = []

    async def main() -> float:
        if how == "aclose":
            gen = backend.stream(USER)
            received.append(await gen.__anext__())
            received.append(await gen.__anext__())
            stopped = time.monotonic()
            await gen.aclose()  # type: ignore[attr-defined]
            return stopped

        async def consume() -> None:
            async for chunk in backend.stream(USER):
                received.append(chunk)

        task = asyncio.create_task(consume())
        await llm_server.await_requests(1)
        await asyncio.sleep(0.35)
        stopped = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return stopped

    stopped = asyncio.run(main())
    if how == "cancel_before_first_token":
        assert received == []
    else:
        assert 1 <= len(received) < 100
    _assert_disconnect_seen(llm_server, stopped)


# ---------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("reply", [Reply(hang_after_chunks=0), Reply(hang_before_headers=True)])
def test_first_token_timeout_on_a_hung_server(llm_server: LlmServer, reply: Reply) -> None:
    llm_server.push(reply)
    backend = make(llm_server, timeouts={"first_token_s": 0.3, "total_s": 5})
    t0 = time.monotonic()
    with pytest.raises(BackendTimeout) as info:
        asyncio.run(collect(backend))
    raised_at = time.monotonic()
    assert info.value.phase == "first_token" and info.value.seconds == 0.3
    assert 0.25 <= raised_at - t0 < 2.5  # far below the 5 s total timeout
    _assert_disconnect_seen(llm_server, raised_at)


def test_total_timeout_after_some_chunks(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text=" ".join(["slow"] * 50), chunk_delay_s=0.1))
    backend = make(llm_server, timeouts={"first_token_s": 0.4, "total_s": 0.6})
    got: list[str] = []

    async def main() -> None:
        async for chunk in backend.stream(USER):
            got.append(chunk)

    t0 = time.monotonic()
    with pytest.raises(BackendTimeout) as info:
        asyncio.run(main())
    raised_at = time.monotonic()
    assert info.value.phase == "total"
    assert 0.55 <= raised_at - t0 < 2.5
    assert 2 <= len(got) < 50
    _assert_disconnect_seen(llm_server, raised_at)


def test_total_timeout_wins_when_shorter_than_first_token(llm_server: LlmServer) -> None:
    llm_server.push(Reply(hang_after_chunks=0))
    backend = make(llm_server, timeouts={"first_token_s": 5, "total_s": 0.3})
    with pytest.raises(BackendTimeout) as info:
        asyncio.run(collect(backend))
    assert info.value.phase == "total"


# ---------------------------------------------------------------------- typed errors

ERROR_CASES = [
    (Reply(status=429, retry_after="7"), BackendRateLimited),
    (Reply(status=500), BackendServerError),
    (Reply(status=503), BackendServerError),
    (Reply(status=401, echo_auth_in_error=True), BackendAuthError),
    (Reply(status=403), BackendAuthError),
    (Reply(status=404, error_message="model not found"), BackendRequestError),
    (Reply(malformed="data: {this is not json"), BackendMalformedStream),
    (Reply(malformed='data: {"unexpected": true}', malformed_after=2), BackendMalformedStream),
    (Reply(content_type="text/html"), BackendMalformedStream),
    (Reply(error_event="overloaded, echo Bearer " + KEY), BackendServerError),
]


@pytest.mark.parametrize(("reply", "expected"), ERROR_CASES, ids=lambda v: getattr(v, "__name__", None))
def test_http_errors_become_typed_errors(llm_server: LlmServer, reply: Reply, expected: type) -> None:
    llm_server.push(reply)
    backend = make(llm_server)
    with pytest.raises(expected) as info:
        asyncio.run(collect(backend))
    err = info.value
    assert isinstance(err, BackendError) and err.backend == "t"
    if reply.status != 200:
        assert err.status_code == reply.status
    if expected is BackendRateLimited:
        assert err.retry_after_s == 7.0
    if reply.status == 404:
        assert "model not found" in str(err)
    assert KEY not in str(err)


def test_connection_refused_is_unavailable() -> None:
    cfg = BackendConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m")
    backend = OpenAIBackend("down", cfg, {})
    with pytest.raises(BackendUnavailable):
        asyncio.run(collect(backend))  # type: ignore[arg-type]


def test_auth_error_names_the_missing_variable(llm_server: LlmServer) -> None:
    llm_server.push(Reply(status=401))
    backend = make(llm_server, environ={})
    with pytest.raises(BackendAuthError, match=r"\$KAME_TEST_KEY not set"):
        asyncio.run(collect(backend))


# ---------------------------------------------------------------------- the key never leaks

LEAK_CASES = [
    Reply(status=401, echo_auth_in_error=True, error_message=f"Incorrect API key provided: {KEY}"),
    Reply(status=429, echo_auth_in_error=True),
    Reply(status=500, echo_auth_in_error=True, error_message=f"crash while handling {KEY}"),
    Reply(status=400, echo_auth_in_error=True),
    Reply(malformed="data: {broken " + KEY),
    Reply(error_event="stream failed for key " + KEY),
    Reply(hang_after_chunks=0),
]


@pytest.mark.parametrize("reply", LEAK_CASES)
def test_api_key_absent_from_errors_logs_and_reprs(
    llm_server: LlmServer, reply: Reply, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    llm_server.push(reply)
    backend = make(llm_server, timeouts={"first_token_s": 0.3})
    with pytest.raises(BackendError) as info:
        asyncio.run(collect(backend))
    err = info.value
    # The server really got the key, so absence below means redaction, not a missing key.
    assert llm_server.chat_requests()[0].headers["authorization"] == f"Bearer {KEY}"
    texts = [
        str(err),
        repr(err),
        "".join(traceback.format_exception(type(err), err, err.__traceback__)),
        caplog.text,
        repr(backend),
        repr(backend.cfg),
        backend.cfg.model_dump_json(),
        str(err.__cause__),
    ]
    for text in texts:
        assert KEY not in text
    if reply.echo_auth_in_error:
        assert "Bearer ***" in str(err)


def test_key_absent_when_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = BackendConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", api_key_env="K")
    backend = OpenAIBackend("down", cfg, {"K": KEY})
    with pytest.raises(BackendUnavailable) as info:
        asyncio.run(collect(backend))  # type: ignore[arg-type]
    err = info.value
    assert KEY not in "".join(traceback.format_exception(type(err), err, err.__traceback__))
    assert KEY not in caplog.text
    health = asyncio.run(backend.check())
    assert health.status == "unreachable" and KEY not in repr(health)


def test_redact_removes_secrets_and_bearer_tokens() -> None:
    text = error_detail(f"key {KEY} and header Bearer abc.def-123 (end)", [KEY])
    assert KEY not in text and "abc.def-123" not in text
    assert text == "key *** and header Bearer *** (end)"
    assert len(error_detail("x" * 1000)) <= 200


# ---------------------------------------------------------------------- check()


def test_check_reports_ok_auth_error_and_unreachable(llm_server: LlmServer) -> None:
    backend = make(llm_server)

    async def main() -> list[Any]:
        ok = await backend.check()
        llm_server.models_status = 401
        auth = await backend.check()
        llm_server.models_status = 500
        err = await backend.check()
        llm_server.models_status = 200
        llm_server.models_delay_s = 1.0
        slow = await make(llm_server, timeouts={"check_s": 0.2}).check()
        return [ok, auth, err, slow]

    ok, auth, err, slow = asyncio.run(main())
    assert ok.ok and ok.status == "ok" and ok.latency_s is not None
    assert auth.status == "auth_error" and not auth.ok
    assert err.status == "error" and "500" in err.reason
    assert slow.status == "unreachable"
    models_reqs = [r for r in llm_server.requests if r.path.endswith("/models")]
    assert models_reqs[0].headers["authorization"] == f"Bearer {KEY}"
