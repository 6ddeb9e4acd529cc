"""A rollout that loses no call: two kame replicas behind a real HAProxy running the shipped
``deploy/haproxy.cfg``, a real Redis with a password as the resume store, each replica with its own
back-end (a real OpenAI-compatible server on loopback, tests/support/llm_server.py).

A Realtime client (kame events on) talks on replica A; its connection drops and the resume goes back to A
through HAProxy (the stick table on the session id: the voice continues). Then A gets SIGTERM: the client
is told (``kame.session.ending``, ``draining``, with its handle), reconnects through HAProxy and finishes
the conversation on B, whose back-end sees the turns said on A. A standard client's session on A meanwhile
drains as today: no kame event, closed with 1001 once ``server.drain_grace_s`` has passed. A Live API
client (``?kame_events=1``, Responses delegation) on A is told too, and resumes on B, whose back-end sees
the Responses conversation said on A.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.haproxy import Backend, HAProxy
from tests.support.llm_server import LlmServer, RecordedRequest, Reply
from tests.support.moshi_client import ServerProcess
from tests.support.redis_server import RedisServer
from tests.support.resume import RealtimeConn, history_text, resume

#: The servers here are the subject (replicas behind HAProxy, one of them stopped): not counted.
pytestmark = pytest.mark.server_process_subject

TOKEN = "rollout-token"
DRAIN_GRACE_S = 5.0
CONFIG = """device: cpu
asr:
  kind: none
frontend:
  checkpoint: "tiny:0"
  batch_size: 3
backends:
  llm:
    base_url: "{llm}"
    model: plain-model
    api_key_env: ""
    breaker: {enabled: false}
default_backend: llm
"""


class Fleet:
    def __init__(self, lb: HAProxy, replicas: list[ServerProcess], llms: list[LlmServer]) -> None:
        self.lb = lb
        self.replicas = replicas
        self.llms = llms

    def url(self, resume: str | None = None, kame: bool = True, port: int | None = None) -> str:
        base = f"ws://127.0.0.1:{port or self.lb.port}/v1/realtime?model=kame" + ("&kame_events=1" if kame else "")
        return base + (f"&resume={resume}" if resume else "")

    def active(self) -> list[int]:
        out = []
        for r in self.replicas:
            try:
                out.append(json.loads(r.get("/health", timeout=2)[1])["sessions"]["active"])
            except OSError:
                out.append(-1)
        return out


@pytest.fixture(scope="module")
def fleet(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    run = tmp_path_factory.mktemp("rollout")
    redis = RedisServer(run / "redis", password="rollout-redis-secret").start()
    llms = [LlmServer(models=["plain-model"]).start() for _ in range(2)]
    replicas = []
    for i, llm in enumerate(llms):
        config = run / f"kame{i + 1}.yaml"
        config.write_text(CONFIG.replace("{llm}", llm.base_url))
        replicas.append(ServerProcess(
            cache_dir=kame_cache_dir, log_path=run / f"kame{i + 1}.log", config=str(config), label=f"rollout{i + 1}",
            env={"KAME_AUTH_TOKEN": TOKEN, "KAME_SERVER__RESUME_STORE_URL": redis.url,
                 "KAME_SERVER__DRAIN_GRACE_S": str(DRAIN_GRACE_S), "KAME_SERVER__RESUME_GRACE_S": "15",
                 "KAME_SERVER__IDLE_TIMEOUT_S": "30", "KAME_SERVER__WARMUP_STEPS": "1",
                 "KAME_FRONTEND__CPU_THREADS": "1"}))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: p.start(timeout=240.0), replicas))
    lb = HAProxy(run, [Backend(f"kame{i + 1}", r.port, 3) for i, r in enumerate(replicas)])
    try:
        lb.start()
        for i in range(2):
            lb.wait_status(f"kame{i + 1}", "UP")
        yield Fleet(lb, replicas, llms)
    finally:
        lb.stop()
        for r in replicas:
            r.stop(signal.SIGKILL)
        for llm in llms:
            llm.stop()
        redis.stop()


LIVE_START = {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {"model": "llm"}}}


async def wait_completed(conn: RealtimeConn, timeout: float = 20.0) -> None:
    """A Live Responses round completed (its nested ``response.completed``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(e["type"] == "response.event" and e["event"]["type"] == "response.completed" for e in conn.events):
        assert loop.time() < deadline, [e["type"] for e in conn.events]
        await asyncio.sleep(0.05)


async def asked_with(llm: LlmServer, words: str, timeout: float = 20.0) -> RecordedRequest:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        for rec in llm.chat_requests():
            if words in (rec.last_user_message or ""):
                return rec
        assert loop.time() < deadline, f"no request asking {words!r}: {[r.last_user_message for r in llm.chat_requests()]}"
        await asyncio.sleep(0.1)


def test_sigterm_hands_a_resumable_call_to_another_replica_and_drains_a_standard_one(fleet: Fleet) -> None:
    for llm in fleet.llms:
        llm.reset()
        llm.set_default(Reply(text="Hello Ada, nice to meet you.", first_token_delay_s=0.05))

    async def main() -> None:
        call = await RealtimeConn.open(fleet.url(), TOKEN)
        created = await call.wait_for("session.created")
        handle = (await call.wait_for("kame.session.resumable"))["handle"]
        a = fleet.active().index(1)
        b = 1 - a
        feeding = asyncio.create_task(call.stream_silence(60))
        await call.say_text("Hello, my name is Ada Lovelace.")
        await asked_with(fleet.llms[a], "my name is Ada")

        # a dropped connection comes back through HAProxy to the replica holding the session
        call.abort()
        feeding.cancel()
        await asyncio.sleep(0.3)
        call = await resume(fleet.url(handle), TOKEN)
        assert (await call.wait_for("kame.session.resumed"))["voice"] == "continued"
        handle = (await call.wait_for("kame.session.resumable"))["handle"]
        assert fleet.active()[a] == 1 and fleet.active()[b] == 0
        sid = created["session"]["id"].removeprefix("sess_")
        table = fleet.lb.command("show table kame")
        assert sid in table, table  # HAProxy learned the session's replica from the upgrade's answer
        feeding = asyncio.create_task(call.stream_silence(60))
        await call.wait_for("response.done", timeout=30)

        # a standard client on A, straight to A's port: it must drain as today
        standard = await RealtimeConn.open(fleet.url(kame=False, port=fleet.replicas[a].port), TOKEN)
        await standard.wait_for("session.created")
        standard_feed = asyncio.create_task(standard.stream_silence(60))

        # a Live API client on A (opted in), one Responses-delegation turn
        live_url = f"ws://127.0.0.1:{fleet.replicas[a].port}/v1/live/sessions?kame_events=1"
        live = await RealtimeConn.open(live_url, TOKEN)
        await live.send({"type": "session.start", "session": LIVE_START})
        live_started = await live.wait_for("session.started")
        live_handle = (await live.wait_for("kame.session.resumable"))["handle"]
        await live.send({"type": "response.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "My favourite colour is teal."}]}})
        await live.send({"type": "response.create"})
        await asked_with(fleet.llms[a], "favourite colour is teal")
        await wait_completed(live)

        sigterm_at = time.monotonic()
        fleet.replicas[a].proc.send_signal(signal.SIGTERM)
        live_ending = await live.wait_for("kame.session.ending", timeout=10)
        assert live_ending["reason"] == "draining" and live_ending["handle"] == live_handle
        await live.close()
        ending = await call.wait_for("kame.session.ending", timeout=10)
        assert ending["reason"] == "draining" and ending["handle"] == handle and ending["seconds_left"] > 0
        await call.close()
        feeding.cancel()

        moved = await resume(fleet.url(handle), TOKEN, timeout=20)
        assert (await moved.wait_for("session.created"))["session"]["id"] == created["session"]["id"]
        resumed = await moved.wait_for("kame.session.resumed")
        assert resumed["voice"] == "fresh" and resumed["turns_restored"] >= 1
        assert fleet.active()[b] == 1
        feeding = asyncio.create_task(moved.stream_silence(30))
        fleet.llms[b].set_default(Reply(text="Your name is Ada.", first_token_delay_s=0.05))
        await moved.say_text("What is my name?")
        asked = await asked_with(fleet.llms[b], "What is my name?")
        assert "my name is Ada Lovelace" in history_text(asked.body)  # B's back-end has A's turns
        assert not [r for r in fleet.llms[a].chat_requests() if "What is my name" in (r.last_user_message or "")]
        feeding.cancel()
        await moved.close()

        # the Live session too: on B, same id, its Responses conversation whole, the voice fresh
        lb_live = f"ws://127.0.0.1:{fleet.lb.port}/v1/live/sessions?kame_events=1&resume={live_handle}"
        live = await resume(lb_live, TOKEN, timeout=20, first="session.started")
        again = await live.wait_for("session.started")
        assert again["session"]["id"] == live_started["session"]["id"]
        assert again["session"]["delegation"]["type"] == "responses"
        live_resumed = await live.wait_for("kame.session.resumed")
        assert live_resumed["voice"] == "fresh" and live_resumed["turns_restored"] >= 2, live_resumed
        fleet.llms[b].set_default(Reply(text="You like teal.", first_token_delay_s=0.05))
        await live.send({"type": "response.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Which colour do I like?"}]}})
        await live.send({"type": "response.create"})
        asked = await asked_with(fleet.llms[b], "Which colour do I like?")
        assert "favourite colour is teal" in history_text(asked.body)  # B's back-end has A's Live turn
        assert "Hello Ada" in history_text(asked.body)  # and the back-end's own answer there
        assert not [e for e in live.events if e["type"] == "error"], live.events
        await live.close()

        code, reason = await standard.wait_closed(timeout=DRAIN_GRACE_S + 15)
        assert code == 1001 and "shutting down" in reason
        assert time.monotonic() - sigterm_at >= DRAIN_GRACE_S - 0.5
        assert not [e for e in standard.events if e["type"].startswith("kame.")]
        standard_feed.cancel()
        assert fleet.replicas[a].proc.wait(15) is not None
        assert "session handed over to the resume store" in fleet.replicas[a].logs()
        assert "session resumed from another replica" in fleet.replicas[b].logs()
        assert "rollout-redis-secret" not in fleet.replicas[a].logs() + fleet.replicas[b].logs()
        assert handle.partition(".")[2] not in fleet.replicas[a].logs() + fleet.lb.logs()

    asyncio.run(main())
