"""Resume on one replica: a Realtime client (OpenAI's events over a raw websocket) loses its TCP connection
in the middle of a reply and comes back with ``?resume=HANDLE`` within ``server.resume_grace_s``.

Real parts: ``kame serve`` (CPU demo, tiny model) with a token, its back-end a real OpenAI-compatible HTTP
server on loopback (tests/support/llm_server.py) reached through the real ``openai`` client. Checked: the
same session (id, items) goes on; the back-end's next request holds the turns before the drop; a client
that never comes back frees its slot after the window; a replayed, expired, forged or credential-less
handle is refused and the session it names is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.llm_server import LlmServer, RecordedRequest, Reply, ToolCallScript
from tests.support.moshi_client import ServerProcess
from tests.support.resume import RealtimeConn, history_text

_CONNS: list[RealtimeConn] = []
TOKEN = "resume-test-token"
GRACE_S = 4.0
CONFIG = """device: cpu
asr:
  kind: none
frontend:
  checkpoint: "tiny:0"
  batch_size: 2
backends:
  llm:
    base_url: "{llm}"
    model: plain-model
    api_key_env: ""
    allow_tools: true
    breaker: {enabled: false}
default_backend: llm
"""


@pytest.fixture(scope="module")
def llm() -> Iterator[LlmServer]:
    srv = LlmServer(models=["plain-model"]).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server(llm: LlmServer, kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("resume")
    config = tmp / "kame.yaml"
    config.write_text(CONFIG.replace("{llm}", llm.base_url))
    proc = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp / "kame.log", config=str(config), label="resume",
                         env={"KAME_AUTH_TOKEN": TOKEN, "KAME_SERVER__RESUME_GRACE_S": str(GRACE_S),
                              "KAME_SERVER__IDLE_TIMEOUT_S": "20"})
    proc.start(timeout=240.0)
    yield proc
    proc.stop()


def url(server: ServerProcess, resume: str | None = None) -> str:
    base = f"ws://127.0.0.1:{server.port}/v1/realtime?model=kame&kame_events=1"
    return base + (f"&resume={resume}" if resume is not None else "")


def health(server: ServerProcess) -> dict[str, int]:
    status, body = server.get("/health")
    assert status == 200
    return dict(json.loads(body)["sessions"])


async def wait_free(server: ServerProcess, free: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while health(server)["free"] != free:
        assert loop.time() < deadline, f"slots not freed: {health(server)}"
        await asyncio.sleep(0.2)


async def asked_with(llm: LlmServer, words: str, timeout: float = 20.0) -> RecordedRequest:
    """The first back-end request whose last user message holds ``words``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        for rec in llm.chat_requests():
            if words in (rec.last_user_message or ""):
                return rec
        seen = [r.last_user_message for r in llm.chat_requests()]
        seen += [e for c in _CONNS for e in c.events if e["type"] in ("error", "response.done", "response.created")]
        assert loop.time() < deadline, f"no request asking {words!r}: {seen}"
        await asyncio.sleep(0.1)


def test_dropped_mid_reply_resumes_the_same_session(server: ServerProcess, llm: LlmServer) -> None:
    llm.reset()
    llm.set_default(Reply(text="Nice to meet you Ada, I will remember your name for the rest of our talk.",
                          first_token_delay_s=0.1, chunk_delay_s=0.15))

    async def main() -> None:
        first = await RealtimeConn.open(url(server), TOKEN)
        created = await first.wait_for("session.created")
        offered = await first.wait_for("kame.session.resumable")
        assert offered["expires_in_s"] == GRACE_S and len(offered["handle"]) >= 32
        await first.say_text("Hello, my name is Ada Lovelace.")
        added = await first.wait_for("conversation.item.added")
        feeding = asyncio.create_task(first.stream_silence(30))
        await llm.await_requests(1, timeout=15)
        await first.wait_for("response.created")
        await asyncio.sleep(0.6)  # mid-reply: the back-end is still streaming its words
        first.abort()
        feeding.cancel()
        await asyncio.sleep(0.5)

        second = await RealtimeConn.open(url(server, offered["handle"]), TOKEN)
        _CONNS.append(second)
        again = await second.wait_for("session.created")
        assert again["session"]["id"] == created["session"]["id"]
        resumed = await second.wait_for("kame.session.resumed")
        assert resumed["voice"] == "continued" and resumed["session_id"] == created["session"]["id"]
        assert resumed["lost"], "what was lost is said"
        fresh = await second.wait_for("kame.session.resumable")
        assert fresh["handle"] != offered["handle"]
        # the item made before the drop is still the conversation's
        await second.send({"type": "conversation.item.retrieve", "item_id": added["item"]["id"]})
        retrieved = await second.wait_for("conversation.item.retrieved")
        assert retrieved["item"]["id"] == added["item"]["id"]
        assert health(server)["active"] == 1

        llm.set_default(Reply(text="Your name is Ada.", first_token_delay_s=0.05))
        feeding = asyncio.create_task(second.stream_silence(20))
        done = await second.wait_for("response.done", timeout=20)  # the voice finishes the reply it was speaking
        assert done["response"]["status"] == "completed"
        await second.say_text("What is my name?")
        asked = await asked_with(llm, "What is my name?")
        history = history_text(asked.body)
        assert "my name is Ada Lovelace" in history
        feeding.cancel()

        # the old handle is dead: replaying it is refused and the session goes on
        replay = await RealtimeConn.open(url(server, offered["handle"]), TOKEN)
        error = await replay.wait_for("error")
        assert "resume handle" in error["error"]["message"]
        assert (await replay.wait_closed())[0] == 1008
        await second.send({"type": "conversation.item.retrieve", "item_id": added["item"]["id"]})
        n = len(second.events)
        await second.wait_for("conversation.item.retrieved", after=n - 1)
        await second.close()
        await wait_free(server, 2, GRACE_S + 10)

    asyncio.run(main())


def test_refused_handles_leave_the_session_alone_and_an_abandoned_one_frees_its_slot(server: ServerProcess) -> None:
    async def main() -> None:
        await wait_free(server, 2, 10)
        conn = await RealtimeConn.open(url(server), TOKEN)
        created = await conn.wait_for("session.created")
        handle = (await conn.wait_for("kame.session.resumable"))["handle"]
        conn.abort()
        await asyncio.sleep(0.3)

        for label, bad_url, token in (
            ("no credentials", url(server, handle), None),
            ("wrong credentials", url(server, handle), "someone-else"),
            ("forged", url(server, handle.partition(".")[0] + "." + "A" * 32), TOKEN),
        ):
            refused = await RealtimeConn.open(bad_url, token)
            code, _ = await refused.wait_closed()
            assert code == 1008, label
            assert any(e.get("type") == "error" for e in refused.events), label
        assert health(server)["active"] == 1  # the held session is untouched

        back = await RealtimeConn.open(url(server, handle), TOKEN)
        assert (await back.wait_for("session.created"))["session"]["id"] == created["session"]["id"]
        handle = (await back.wait_for("kame.session.resumable"))["handle"]
        back.abort()

        # never coming back: after the window the slot is free and the handle refused as expired
        await asyncio.sleep(GRACE_S + 1.5)
        await wait_free(server, 2, 10)
        late = await RealtimeConn.open(url(server, handle), TOKEN)
        error = await late.wait_for("error")
        assert "expired" in error["error"]["message"]
        assert (await late.wait_closed())[0] == 1008
        assert health(server)["active"] == 0

    asyncio.run(main())


def test_a_standard_client_sees_no_resume_events_and_ends_as_today(server: ServerProcess) -> None:
    async def main() -> None:
        await wait_free(server, 2, 10)
        conn = await RealtimeConn.open(f"ws://127.0.0.1:{server.port}/v1/realtime?model=kame", TOKEN)
        await conn.wait_for("session.created")
        await conn.stream_silence(0.8)
        assert not [e for e in conn.events if e["type"].startswith("kame.")]
        conn.abort()
        await wait_free(server, 2, 5)  # not held: the slot is free at once, no resume window

        # a client that turns kame's events on later gets its handle then
        late = await RealtimeConn.open(f"ws://127.0.0.1:{server.port}/v1/realtime?model=kame", TOKEN)
        await late.wait_for("session.created")
        await late.send({"type": "session.update", "session": {"type": "realtime", "kame": {"events": True}}})
        assert (await late.wait_for("kame.session.resumable"))["handle"]
        await late.close()
        await wait_free(server, 2, 5)

    asyncio.run(main())


def test_api_chat_resumes_only_with_kame_resume(server: ServerProcess) -> None:
    """``/api/chat``: the handle comes as 0x04 JSON only with ``kame_resume=1``; a reconnect with it gets the
    handshake again and the same session."""
    from websockets.asyncio.client import connect

    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def messages(ws: object, until: str, timeout: float = 15.0) -> list[bytes]:
        got: list[bytes] = []
        async with asyncio.timeout(timeout):
            while True:
                msg = await ws.recv()  # type: ignore[attr-defined]
                got.append(msg)
                if msg[:1] == b"\x04" and until.encode() in msg:
                    return got

    async def main() -> None:
        await wait_free(server, 2, 10)
        plain = await connect(f"ws://127.0.0.1:{server.port}/api/chat", additional_headers=auth)
        first = await asyncio.wait_for(plain.recv(), 15)
        assert first == b"\x00"
        seen: list[bytes] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.5):
                while True:
                    seen.append(await plain.recv())
        assert seen and not [m for m in seen if b"resumable" in m]  # kame's 0x04 server info, no handle
        await plain.close()

        ws = await connect(f"ws://127.0.0.1:{server.port}/api/chat?kame_resume=1", additional_headers=auth)
        got = await messages(ws, "kame.session.resumable")
        assert got[0] == b"\x00"
        handle = json.loads(got[-1][1:])["handle"]
        ws.transport.abort()
        await asyncio.sleep(0.3)
        assert health(server)["active"] == 1
        back = await connect(f"ws://127.0.0.1:{server.port}/api/chat?kame_resume=1&resume={handle}", additional_headers=auth)
        got = await messages(back, "kame.session.resumed")
        assert got[0] == b"\x00"
        assert json.loads(got[-1][1:])["voice"] == "continued"
        assert health(server)["active"] == 1
        await back.close()
        await wait_free(server, 2, 10)

    asyncio.run(main())


@pytest.mark.parametrize("protocol", ["realtime", "moshi"])
def test_kame_mic_resumes_after_its_connection_is_cut(server: ServerProcess, llm: LlmServer, tmp_path: Path,
                                                      protocol: str) -> None:
    """``kame mic --input-wav`` through a TCP link that the test cuts mid-session: it reconnects with the handle,
    says so, and the server keeps one session (no new one was opened)."""
    import subprocess
    import sys
    import time

    import numpy as np

    from kame.audio.files import write_wav
    from tests.support.resume import CuttableLink

    llm.reset()
    llm.set_default(Reply(text="Fine.", first_token_delay_s=0.05))
    wav = tmp_path / "in.wav"
    write_wav(wav, np.zeros(24000 * 8, np.float32))
    link = CuttableLink(server.port).start()
    before = health(server)
    assert before["active"] == 0
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kame.cli", "mic", "--server", f"http://127.0.0.1:{link.port}", "--protocol", protocol,
             "--token", TOKEN, "--input-wav", str(wav), "--output-wav", str(tmp_path / "out.wav"), "--tail", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while health(server)["active"] == 0:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.1)
        time.sleep(2.0)
        link.cut()
        out, _ = proc.communicate(timeout=90)
    finally:
        link.stop()
    assert proc.returncode == 0, out[-3000:]
    assert "the connection dropped" in out and "resumed" in out and "the same conversation goes on" in out, out
    assert "a new conversation" not in out, out
    assert "reconnected 1 time(s)" in out, out


def test_the_page_resumes_after_its_connection_is_cut(server: ServerProcess, llm: LlmServer, tmp_path: Path) -> None:
    """The browser page (Chromium, a fake microphone) through a TCP link the test cuts: the page takes the same
    session back and says so, without starting a new conversation."""
    from playwright.sync_api import sync_playwright

    from kame.audio.files import write_wav
    from tests.support.browser import BASE_ARGS, CHROMIUM, Console, kame, wait_until
    from tests.support.resume import CuttableLink
    from tests.support.speech import silence

    llm.reset()
    llm.set_default(Reply(text="Fine.", first_token_delay_s=0.05))
    wav = tmp_path / "mic.wav"
    write_wav(wav, silence(2.0))
    link = CuttableLink(server.port).start()
    console = Console()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                *BASE_ARGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={wav}"])
            try:
                page = console.watch(browser.new_page(), "page")
                page.goto(f"http://127.0.0.1:{link.port}/?transport=websocket")
                page.fill("#token", TOKEN)
                page.click("#connect")

                def dump() -> object:
                    return page.evaluate("({phase: window.kame.phase, notice: document.querySelector('#notice').innerText,"
                                         " types: window.kame.events.slice(-8).map((e) => e.type)})")

                wait_until(page, "() => window.kame.phase === 'live'", 30, "live", dump)
                wait_until(page, "() => window.kame.events.some((e) => e.type === 'kame.session.resumable')", 10,
                           "a resume handle", dump)
                first_id = kame(page, "k.session.id")
                link.cut()
                wait_until(page, "() => window.kame.resumes === 1 && window.kame.phase === 'live'", 30, "resumed", dump)
                assert kame(page, "k.session.id") == first_id
                assert kame(page, "k.reconnects") == 0
                assert "Resumed: the same conversation goes on" in page.inner_text("#notice")
                assert health(server)["active"] == 1
                page.click("#connect")  # hang up: a clean close ends the session
            finally:
                browser.close()
    finally:
        link.stop()
    # the page asks for the back-ends before the token is typed: that 401 is the only error allowed
    assert not [e for e in console.errors if "401 (Unauthorized)" not in e], console.errors
    asyncio.run(wait_free(server, 2, 10))


def test_an_ephemeral_keys_session_resumes_with_its_grant_not_with_another(server: ServerProcess) -> None:
    """A session opened with an ``ek_`` key is bound to the key's grant: the same key, or a fresh key minted
    with the same session config, resumes it; the server's own token or a key with another config does not."""
    import httpx

    def mint(instructions: str) -> str:
        r = httpx.post(f"{server.http_url}/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {TOKEN}"},
                       json={"expires_after": {"anchor": "created_at", "seconds": 60},
                             "session": {"type": "realtime", "instructions": instructions}})
        assert r.status_code == 200, r.text
        return str(r.json()["value"])

    async def main() -> None:
        await wait_free(server, 2, 10)
        key = mint("Be brief.")
        conn = await RealtimeConn.open(url(server), key)
        created = await conn.wait_for("session.created")
        handle = (await conn.wait_for("kame.session.resumable"))["handle"]
        conn.abort()
        await asyncio.sleep(0.3)
        for other in (TOKEN, mint("Be verbose.")):
            refused = await RealtimeConn.open(url(server, handle), other)
            assert (await refused.wait_closed())[0] == 1008
            assert "not issued to these credentials" in refused.events[0]["error"]["message"]
        same_grant = mint("Be brief.")
        assert same_grant != key
        back = await RealtimeConn.open(url(server, handle), same_grant)
        assert (await back.wait_for("session.created"))["session"]["id"] == created["session"]["id"]
        await back.wait_for("kame.session.resumed")
        await back.close()
        await wait_free(server, 2, 10)

    asyncio.run(main())


def test_a_function_call_pending_across_a_drop_is_answered_after_the_resume(server: ServerProcess, llm: LlmServer) -> None:
    """The back-end asks for a client function; the connection drops before the client answers; after the resume
    the client's ``function_call_output`` is accepted and reaches the back-end."""
    weather = {"type": "function", "name": "get_weather", "description": "The weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}

    def reply(rec: RecordedRequest) -> Reply:
        if rec.tool_messages:
            return Reply(text=f"Good news: {rec.tool_messages[-1]['content']}.", first_token_delay_s=0.05)
        return Reply(text="Let me check.", first_token_delay_s=0.05,
                     tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])

    llm.reset()
    llm.responder = reply

    async def main() -> None:
        await wait_free(server, 2, 10)
        conn = await RealtimeConn.open(url(server), TOKEN)
        await conn.wait_for("session.created")
        handle = (await conn.wait_for("kame.session.resumable"))["handle"]
        await conn.send({"type": "session.update", "session": {"type": "realtime", "tools": [weather]}})
        await conn.wait_for("session.updated")
        feeding = asyncio.create_task(conn.stream_silence(30))
        await conn.say_text("What is the weather in Paris?")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not (calls := [e["item"] for e in conn.events if e["type"] == "response.output_item.done"
                             and e["item"]["type"] == "function_call"]):
            assert loop.time() < deadline and conn.closed is None, [e["type"] for e in conn.events][-20:]
            await asyncio.sleep(0.02)
        call = calls[0]
        conn.abort()  # gone before answering the call
        feeding.cancel()
        await asyncio.sleep(0.5)

        back = await RealtimeConn.open(url(server, handle), TOKEN)
        await back.wait_for("kame.session.resumed")
        feeding = asyncio.create_task(back.stream_silence(30))
        await back.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21 degrees"}})
        await back.send({"type": "response.create"})
        deadline = loop.time() + 10
        while not [e for e in back.events if e["type"] == "conversation.item.added"
                   and e["item"]["type"] == "function_call_output" and e["item"]["call_id"] == call["call_id"]]:
            assert loop.time() < deadline, [e["type"] for e in back.events]
            await asyncio.sleep(0.05)
        deadline = loop.time() + 20
        while not any("sunny, 21 degrees" in str(m.get("content")) for r in llm.chat_requests() for m in r.tool_messages):
            assert loop.time() < deadline, [r.tool_messages for r in llm.chat_requests()]
            await asyncio.sleep(0.1)
        assert not [e for e in back.events if e["type"] == "error"], back.events
        feeding.cancel()
        await back.close()
        await wait_free(server, 2, 10)

    try:
        asyncio.run(main())
    finally:
        llm.responder = None
