"""The registry: choosing back-ends by name, caps, circuit breaker, fallback, metrics hooks."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from kame.backend.breaker import CircuitBreaker
from kame.backend.errors import (
    BackendBusy,
    BackendCircuitOpen,
    BackendError,
    BackendServerError,
    BackendTimeout,
    BackendUnavailable,
    UnknownBackend,
)
from kame.backend.limits import Busy, RateLimiter
from kame.backend.registry import BackendRegistry
from kame.backend.stats import BackendEvent
from kame.config import KameConfig
from tests.support.llm_server import LlmServer, Reply, running_llm_server

USER = [{"role": "user", "content": "Hello?"}]


def registry(backends: dict[str, Any], *, llm: dict[str, Any] | None = None, environ: dict[str, str] | None = None,
             default: str | None = None, observers: list[Callable[[BackendEvent], None]] = []) -> BackendRegistry:  # noqa: B006
    cfg = KameConfig.model_validate({"backends": backends, "llm": llm or {}, "default_backend": default})
    return BackendRegistry.from_config(cfg, environ or {}, observers=observers)


def oa(server: LlmServer | str, **fields: Any) -> dict[str, Any]:
    url = server if isinstance(server, str) else server.base_url
    return {"base_url": url, "model": "test-model", **fields}


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def first_chunk_then_hold(reg: BackendRegistry, name: str, started: list[str], release: asyncio.Event) -> str:
    async with reg.stream(name, USER) as reply:
        async for chunk in reply:
            started.append(chunk)
            await release.wait()
            return chunk
    return ""


# ---------------------------------------------------------------------- names


def test_requests_go_to_the_named_backend() -> None:
    with running_llm_server() as fast, running_llm_server() as smart:
        fast.set_default(Reply(text="fast answer"))
        smart.set_default(Reply(text="smart answer"))
        reg = registry({"fast": oa(fast), "smart": oa(smart)}, default="fast")

        async def main() -> list[str]:
            try:
                return [
                    await reg.stream("smart", USER).text(),
                    await reg.stream("fast", USER).text(),
                    await reg.stream(None, USER).text(),
                ]
            finally:
                await reg.aclose()

        assert asyncio.run(main()) == ["smart answer", "fast answer", "fast answer"]
        assert len(smart.chat_requests()) == 1 and len(fast.chat_requests()) == 2


def test_unknown_name_lists_valid_names(llm_server: LlmServer) -> None:
    reg = registry({"a": oa(llm_server), "b": {"kind": "scripted"}})
    with pytest.raises(UnknownBackend) as info:
        reg.stream("https://evil.example/v1", USER)
    assert "'https://evil.example/v1'" in str(info.value) and "a, b" in str(info.value)
    assert info.value.valid == ["a", "b"]
    empty = registry({})
    with pytest.raises(UnknownBackend, match="no default back-end"):
        empty.stream(None, USER)


def test_reply_stream_reports_backend_and_ttft(llm_server: LlmServer) -> None:
    llm_server.push(Reply(first_token_delay_s=0.15))
    reg = registry({"a": oa(llm_server)})

    async def main() -> Any:
        reply = reg.stream("a", USER)
        text = await reply.text()
        return reply, text

    reply, text = asyncio.run(main())
    assert text == "Hello there, how can I help you today?"
    assert reply.backend == "a" and reply.requested == "a" and not reply.fell_back
    assert reply.ttft_s is not None and 0.14 <= reply.ttft_s < 1.0


def test_cancelling_a_registry_stream_disconnects_the_server(llm_server: LlmServer) -> None:
    llm_server.push(Reply(text=" ".join(["w"] * 100), chunk_delay_s=0.1))
    events: list[BackendEvent] = []
    reg = registry({"a": oa(llm_server, caps={"max_concurrent": 1})}, observers=[events.append])

    async def main() -> float:
        async def consume() -> None:
            async for _ in reg.stream("a", USER):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.4)
        stopped = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The slot is free again: a new request (KAME's superseding one) starts at once.
        llm_server.push(Reply(text="next"))
        assert await reg.stream("a", USER).text() == "next"
        return stopped

    stopped = asyncio.run(main())
    req = llm_server.chat_requests()[0]
    assert req.wait_ended(3) and req.disconnected and not req.completed
    assert req.disconnected_at is not None and req.disconnected_at - stopped < 1.0
    kinds = [e.kind for e in events]
    assert kinds.count("cancelled") == 1 and kinds.count("done") == 1
    assert reg.breaker_state("a") == "closed"


# ---------------------------------------------------------------------- caps


def test_concurrency_cap_rejects_after_short_wait_and_frees_on_close(llm_server: LlmServer) -> None:
    llm_server.set_default(Reply(hang_after_chunks=1))
    reg = registry({"a": oa(llm_server, caps={"max_concurrent": 2, "max_wait_s": 0.1})})

    async def main() -> None:
        release = asyncio.Event()
        started: list[str] = []
        holders = [asyncio.create_task(first_chunk_then_hold(reg, "a", started, release)) for _ in range(2)]
        while len(started) < 2:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(BackendBusy):
            await reg.stream("a", USER).text()
        assert 0.09 <= time.monotonic() - t0 < 1.0
        assert len(llm_server.chat_requests()) == 2  # the refused request never reached the server
        # A request waiting within max_wait_s gets the slot freed by a finished one.
        waiter = asyncio.create_task(first_chunk_then_hold(reg, "a", started, release))
        await asyncio.sleep(0.02)
        holders[0].cancel()
        while len(started) < 3:
            await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(holders[1], waiter)
        assert reg.stats.get("a").busy == 1

    asyncio.run(main())
    assert len(llm_server.chat_requests()) == 3


def test_global_concurrency_cap_spans_backends(llm_server: LlmServer) -> None:
    llm_server.set_default(Reply(hang_after_chunks=1))
    reg = registry({"a": oa(llm_server), "b": oa(llm_server)}, llm={"max_concurrent_requests": 1, "max_wait_s": 0})

    async def main() -> None:
        release = asyncio.Event()
        started: list[str] = []
        holder = asyncio.create_task(first_chunk_then_hold(reg, "a", started, release))
        while not started:
            await asyncio.sleep(0.01)
        with pytest.raises(BackendBusy, match="all back-ends together"):
            await reg.stream("b", USER).text()
        release.set()
        await holder

    asyncio.run(main())
    assert len(llm_server.chat_requests()) == 1


@pytest.mark.realtime  # the cap's spacing against the wall clock
def test_rate_cap_spaces_requests_and_rejects_beyond_the_wait_bound(llm_server: LlmServer) -> None:
    llm_server.set_default(Reply(text="ok"))
    reg = registry({
        "spaced": oa(llm_server, caps={"max_requests_per_s": 5, "burst": 1, "max_wait_s": 0.5}),
        "strict": oa(llm_server, caps={"max_requests_per_s": 5, "burst": 1, "max_wait_s": 0.05}),
    })

    async def main() -> None:
        for _ in range(3):
            assert await reg.stream("spaced", USER).text() == "ok"
        assert await reg.stream("strict", USER).text() == "ok"
        with pytest.raises(BackendBusy):
            await reg.stream("strict", USER).text()

    asyncio.run(main())
    times = [r.received_at for r in llm_server.chat_requests()]
    assert len(times) == 4  # 3 spaced + 1 strict; the refused one never left
    # 5/s with a burst of 1: about 0.2 s apart (less a little network jitter; unlimited would be ~ms).
    gaps = [b - a for a, b in zip(times[:3], times[1:3])]
    assert all(g >= 0.1 for g in gaps) and times[2] - times[0] >= 0.3, gaps


def test_rate_limiter_token_bucket_with_fake_clock() -> None:
    now = [0.0]
    bucket = RateLimiter(rate=2, burst=2, max_wait_s=0, clock=lambda: now[0])

    async def main() -> None:
        await bucket.acquire()
        await bucket.acquire()
        with pytest.raises(Busy):
            await bucket.acquire()
        now[0] += 0.5  # one token back
        await bucket.acquire()
        with pytest.raises(Busy):
            await bucket.acquire()
        bucket.refund()
        await bucket.acquire()

    asyncio.run(main())


# ---------------------------------------------------------------------- breaker


def test_breaker_opens_after_failures_and_recovers_after_cooldown(llm_server: LlmServer) -> None:
    llm_server.set_default(Reply(status=500))
    events: list[BackendEvent] = []
    reg = registry({"a": oa(llm_server, breaker={"failure_threshold": 2, "cooldown_s": 0.3})},
                   observers=[events.append])

    async def main() -> None:
        for _ in range(2):
            with pytest.raises(BackendServerError):
                await reg.stream("a", USER).text()
        assert reg.breaker_state("a") == "open"
        with pytest.raises(BackendCircuitOpen) as info:
            await reg.stream("a", USER).text()
        assert 0 < info.value.retry_in_s <= 0.3
        assert len(llm_server.chat_requests()) == 2  # open: the server was not called
        await asyncio.sleep(0.35)
        assert reg.breaker_state("a") == "half_open"
        llm_server.set_default(Reply(text="back"))
        assert await reg.stream("a", USER).text() == "back"
        assert reg.breaker_state("a") == "closed"

    asyncio.run(main())
    states = [e.breaker_state for e in events if e.kind == "breaker"]
    assert states == ["open", "half_open", "closed"]
    desc = {d["name"]: d for d in reg.describe()}
    assert desc["a"]["breaker"]["times_opened"] == 1
    assert desc["a"]["stats"]["errors"] == {"server_error": 2}


def test_breaker_backoff_with_fake_clock() -> None:
    now = [0.0]
    b = CircuitBreaker(failure_threshold=2, cooldown_s=1.0, backoff_factor=2.0, max_cooldown_s=3.0, clock=lambda: now[0])
    t = b.try_acquire()
    assert t is not None and not t.probe
    b.failure(t)
    b.success(b.try_acquire())  # a success resets the count
    for _ in range(2):
        b.failure(b.try_acquire())
    assert b.state == "open" and b.try_acquire() is None
    now[0] = 1.0
    probe = b.try_acquire()
    assert probe is not None and probe.probe
    assert b.try_acquire() is None  # only one probe at a time
    b.failure(probe)  # failed probe: cooldown doubles
    assert b.snapshot().cooldown_s == 2.0
    now[0] = 2.9
    assert b.state == "open"
    now[0] = 3.0
    probe = b.try_acquire()
    b.neutral(probe)  # cancelled probe: still half-open, the next request probes
    probe = b.try_acquire()
    b.failure(probe)
    assert b.snapshot().cooldown_s == 3.0  # capped
    now[0] = 6.0
    b.success(b.try_acquire())
    assert b.state == "closed" and b.snapshot().cooldown_s == 1.0


def test_cancelled_requests_do_not_open_the_breaker(llm_server: LlmServer) -> None:
    llm_server.set_default(Reply(hang_after_chunks=0))
    reg = registry({"a": oa(llm_server, breaker={"failure_threshold": 1})})

    async def main() -> None:
        for _ in range(3):
            task = asyncio.create_task(reg.stream("a", USER).text())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert reg.breaker_state("a") == "closed"
    assert reg.stats.get("a").cancelled == 3


# ---------------------------------------------------------------------- fallback


def test_fallback_when_primary_is_down_and_when_its_breaker_is_open(llm_server: LlmServer) -> None:
    llm_server.set_default(Reply(text="from the fallback"))
    events: list[BackendEvent] = []
    reg = registry(
        {"main": oa(dead_url(), fallback="spare", breaker={"failure_threshold": 2, "cooldown_s": 30}),
         "spare": oa(llm_server)},
        observers=[events.append],
    )

    async def main() -> None:
        for _ in range(3):
            reply = reg.stream("main", USER)
            assert await reply.text() == "from the fallback"
            assert reply.requested == "main" and reply.backend == "spare" and reply.fell_back

    asyncio.run(main())
    assert reg.breaker_state("main") == "open"
    errors = [e for e in events if e.kind == "error"]
    assert [e.error for e in errors] == ["unavailable", "unavailable"]  # third went straight to the fallback
    assert reg.stats.get("spare").fallbacks_used == 3
    assert reg.stats.get("main").busy == 1  # skipped once because open


def test_fallback_on_first_token_timeout_but_not_after_first_chunk() -> None:
    with running_llm_server() as primary, running_llm_server() as spare:
        spare.set_default(Reply(text="spare"))
        reg = registry({"main": oa(primary, fallback="spare", timeouts={"first_token_s": 0.3, "total_s": 0.8}),
                        "spare": oa(spare)})

        async def main() -> None:
            primary.push(Reply(hang_after_chunks=0))
            assert await reg.stream("main", USER).text() == "spare"
            primary.push(Reply(text="one two three four", hang_after_chunks=2))
            got: list[str] = []
            with pytest.raises(BackendTimeout):
                async for chunk in reg.stream("main", USER):
                    got.append(chunk)
            assert got == ["one", " two"]  # committed to the primary: no switch mid-answer

        asyncio.run(main())
        assert len(spare.chat_requests()) == 1


def test_primary_error_is_raised_when_there_is_no_fallback() -> None:
    reg = registry({"main": oa(dead_url())})
    with pytest.raises(BackendUnavailable):
        asyncio.run(reg.stream("main", USER).text())


# ---------------------------------------------------------------------- observers


def test_observer_sees_request_lifecycle_and_bad_observer_is_harmless(llm_server: LlmServer) -> None:
    events: list[BackendEvent] = []

    def broken(event: BackendEvent) -> None:
        raise RuntimeError("exporter bug")

    reg = registry({"a": oa(llm_server)}, observers=[broken, events.append])
    llm_server.push(Reply(text="a b c"), Reply(status=429))

    async def main() -> None:
        assert await reg.stream("a", USER).text() == "a b c"
        with pytest.raises(BackendError):
            await reg.stream("a", USER).text()

    asyncio.run(main())
    assert [e.kind for e in events] == ["request", "first_token", "done", "request", "error"]
    done = events[2]
    assert done.chunks == 3 and done.duration_s is not None
    assert events[1].ttft_s is not None and events[4].error == "rate_limited"
    stats = reg.stats.get("a")
    assert stats.requests == 2 and stats.completed == 1 and stats.errors["rate_limited"] == 1
    assert stats.ttft_count == 1 and stats.ttft_mean_s is not None


def test_describe_and_check_all_expose_no_urls_or_keys(llm_server: LlmServer) -> None:
    reg = registry({"a": oa(llm_server, api_key_env="K", description="local"), "s": {"kind": "scripted"}},
                   environ={"K": "sk-very-secret-key"})
    health = asyncio.run(reg.check_all())
    assert health["a"].ok and health["s"].ok
    text = repr(reg.describe()) + repr(health)
    assert "sk-very-secret-key" not in text and llm_server.base_url not in text
    assert [d["name"] for d in reg.describe()] == ["a", "s"]
    assert reg.describe()[0]["default"] is True and reg.describe()[0]["description"] == "local"
