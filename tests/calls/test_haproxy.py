"""Three kame replicas (CPU demo, ASR off, 2 slots each) behind a real HAProxy running the shipped
``deploy/haproxy.cfg``: leastconn, health check on ``/ready``, websockets passed through.

What is checked is where sessions land (each replica's own ``/health`` count and HAProxy's
``show stat``), with sessions opened through the load balancer by the real Moshi-protocol client.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.haproxy import Backend, HAProxy, StreamingClient, attribute_replicas, start_replicas
from tests.support.moshi_client import MoshiClient, ServerProcess

#: The servers here are the subject (environment variables, replicas behind HAProxy): not counted.
pytestmark = pytest.mark.server_process_subject

SLOTS = 2
REPLICAS = 3
DRAIN_GRACE_S = 1.5


@pytest.fixture(scope="module")
def fleet(
    kame_cache_dir: Path, tiny_kame_ckpt: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[HAProxy, list[ServerProcess]]]:
    run = tmp_path_factory.mktemp("haproxy")
    env = {
        "KAME_ASR__KIND": "none",
        "KAME_FRONTEND__BATCH_SIZE": str(SLOTS),
        "KAME_SERVER__WARMUP_STEPS": "1",
        "KAME_FRONTEND__CPU_THREADS": "1",
        "KAME_SERVER__DRAIN_GRACE_S": str(DRAIN_GRACE_S),
    }
    replicas = start_replicas(REPLICAS, cache_dir=kame_cache_dir, run_dir=run, env=env)
    lb = HAProxy(run, [Backend(f"kame{i + 1}", r.port, SLOTS) for i, r in enumerate(replicas)])
    try:
        lb.start()
        for i in range(REPLICAS):
            lb.wait_status(f"kame{i + 1}", "UP")
        yield lb, replicas
    finally:
        lb.stop()
        for r in replicas:
            r.stop(signal.SIGKILL)


def test_local_config_keeps_the_shipped_settings(tmp_path: Path) -> None:
    """Only the addresses change: both backends get the replicas, the session backend caps each at its slots."""
    from tests.support.haproxy import SHIPPED_CONFIG, local_config

    shipped = SHIPPED_CONFIG.read_text()
    text = local_config(shipped, port=18080, servers=[Backend("kame1", 18001, 2), Backend("kame2", 18002, 2)],
                        stats_socket=tmp_path / "s.sock")
    sections = {}
    for block in text.split("\nbackend ")[1:]:
        name, _, body = block.partition("\n")
        sections[name.strip()] = [line.strip() for line in body.splitlines() if line.strip().startswith("server ")]
    assert sections["kame"] == ["server kame1 127.0.0.1:18001 maxconn 2", "server kame2 127.0.0.1:18002 maxconn 2"]
    assert sections["kame_http"] == ["server kame1 127.0.0.1:18001", "server kame2 127.0.0.1:18002"]
    assert "bind 127.0.0.1:18080" in text and "10.0.0.11" not in text
    settings = ("balance", "http-check", "timeout", "option", "acl", "use_backend", "default-server")
    kept = [line for line in shipped.splitlines() if line.strip().startswith(settings)]
    assert kept and all(line in text.splitlines() for line in kept)


def active(replicas: list[ServerProcess]) -> list[int]:
    return [r.get_json("/health")[1]["sessions"]["active"] for r in replicas]


async def open_session(url: str) -> MoshiClient | None:
    """A session through ``url``, kept alive with silence; None when it was refused (1013, 503...)."""
    try:
        client = await MoshiClient.connect(url, open_timeout=10)
    except Exception:  # noqa: BLE001 - websockets' InvalidStatus (HAProxy's 503)
        return None
    if not await client.wait_handshake(10):
        await client.close()
        return None
    client.keepalive = asyncio.create_task(client.send_silence(60))  # type: ignore[attr-defined]
    return client


async def close_all(clients: list[MoshiClient | None]) -> None:
    for c in clients:
        if c is not None:
            c.keepalive.cancel()  # type: ignore[attr-defined]
            await c.close()


def wait_all_idle(replicas: list[ServerProcess], lb: HAProxy, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if active(replicas) == [0] * len(replicas) and all(s.status == "UP" for s in lb.stats().values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"replicas not idle: {active(replicas)} {lb.stats()}")


def test_sessions_spread_over_replicas_without_exceeding_their_slots(fleet: tuple[HAProxy, list[ServerProcess]]) -> None:
    lb, replicas = fleet
    wait_all_idle(replicas, lb)
    seen: list[list[int]] = []

    async def main() -> tuple[list[MoshiClient | None], MoshiClient | None]:
        clients: list[MoshiClient | None] = []
        for _ in range(REPLICAS * SLOTS):
            clients.append(await open_session(lb.ws_url))
            seen.append(await asyncio.to_thread(active, replicas))
        extra = await open_session(lb.ws_url)  # every slot is taken
        seen.append(await asyncio.to_thread(active, replicas))
        await close_all([*clients, extra])
        return clients, extra

    clients, extra = asyncio.run(main())
    assert all(c is not None for c in clients), seen
    assert seen[REPLICAS * SLOTS - 1] == [SLOTS] * REPLICAS  # every slot used, evenly
    assert seen[REPLICAS - 1] == [1] * REPLICAS  # leastconn: one each before any gets a second
    assert all(max(s) <= SLOTS for s in seen), seen
    assert extra is None  # refused (HAProxy's 503 or the replica's 1013), not squeezed in
    assert all(s.maximum <= SLOTS for s in lb.stats().values())
    assert sum(r.metric("kame_sessions_rejected_total", 'reason="full"') for r in replicas) + len(
        [line for line in lb.logs().splitlines() if " 503 " in line]
    ) >= 1


def test_a_full_replica_gets_no_new_sessions(fleet: tuple[HAProxy, list[ServerProcess]]) -> None:
    """kame1 is filled by clients that bypass the load balancer: only its /ready tells HAProxy."""
    lb, replicas = fleet
    wait_all_idle(replicas, lb)
    before = replicas[0].metric("kame_sessions_total")

    async def main() -> list[MoshiClient | None]:
        direct = [await open_session(replicas[0].ws_url) for _ in range(SLOTS)]
        assert all(c is not None for c in direct)
        await asyncio.to_thread(lb.wait_status, "kame1", "DOWN", 5.0)
        stot = lb.stats()["kame1"].total
        through = [await open_session(lb.ws_url) for _ in range((REPLICAS - 1) * SLOTS)]
        counts = await asyncio.to_thread(active, replicas)
        assert lb.stats()["kame1"].total == stot  # HAProxy sent it nothing
        await close_all([*direct, *through])
        assert all(c is not None for c in through)
        assert counts == [SLOTS, SLOTS, SLOTS], counts
        return through

    asyncio.run(main())
    assert replicas[0].metric("kame_sessions_total") - before == SLOTS  # only the direct ones
    assert replicas[0].metric("kame_sessions_rejected_total", 'reason="full"') == 0  # none even tried
    wait_all_idle(replicas, lb)
    assert lb.stats()["kame1"].status == "UP"  # back in rotation once a slot is free


def test_full_replica_stays_ready_for_kubernetes(fleet: tuple[HAProxy, list[ServerProcess]]) -> None:
    lb, replicas = fleet
    wait_all_idle(replicas, lb)

    async def main() -> tuple[int, int, int]:
        direct = [await open_session(replicas[1].ws_url) for _ in range(SLOTS)]
        lb_status = (await asyncio.to_thread(replicas[1].get, "/ready"))[0]
        k8s_status = (await asyncio.to_thread(replicas[1].get, "/ready?full_ok=1"))[0]
        other = (await asyncio.to_thread(replicas[2].get, "/ready?full_ok=1"))[0]
        await close_all(direct)
        return lb_status, k8s_status, other

    assert asyncio.run(main()) == (503, 200, 200)


def test_config_file_is_the_shipped_one(fleet: tuple[HAProxy, list[ServerProcess]]) -> None:
    lb, _ = fleet
    used = lb.config_path.read_text()
    for needle in ("balance leastconn", "http-check send meth GET uri /ready", "timeout tunnel", "option redispatch",
                   "use_backend kame if websocket", "http-check send meth GET uri /health"):
        assert needle in used
    tunnel = re.search(r"^\s*timeout tunnel (\d+)(m|h)$", used, re.M)
    assert tunnel is not None
    from kame.server.config import ServerConfig

    # the longest silence a tunnel may have covers a whole default-length call (an hour)
    assert int(tunnel.group(1)) * {"m": 60, "h": 3600}[tunnel.group(2)] >= ServerConfig().max_duration_s


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kame.audio.files import write_wav
    from tests.support.speech import silence, synthesize

    path = tmp_path_factory.mktemp("q") / "q.wav"
    write_wav(path, np.concatenate([synthesize("What is the capital of France?"), silence(0.3)]))
    return path


def mic(server_url: str, wav: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kame.cli", "mic", "--server", server_url, "--protocol", "moshi", "--input-wav", str(wav),
         "--tail", "0.5", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


class MicOutput:
    """A running ``kame mic``'s stdout, read as it comes (a thread), so a test can wait for a line
    (a refusal, a connection) instead of sleeping a guessed time: on a loaded machine the mic's own
    start can take longer than any fixed sleep."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        import threading

        self.process = process
        self.lines: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # stderr drained too, so a chatty mic never blocks on a full pipe
        self._err_reader = threading.Thread(target=lambda: self.err.extend(process.stderr or []), daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def text(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while needle not in "".join(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or (not self._reader.is_alive() and needle not in "".join(self.lines)):
                    raise AssertionError(f"kame mic did not print {needle!r} in {timeout} s: {''.join(self.lines)[-2000:]}")
                self._changed.wait(min(left, 0.5))

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Wait for the mic to exit: its return code, all its stdout and its stderr."""
        self.process.wait(timeout)
        self._reader.join(timeout)
        self._err_reader.join(timeout)
        return self.process.returncode, self.text(), "".join(self.err)


def test_kame_mic_retries_a_full_fleet_and_a_full_replica(
    fleet: tuple[HAProxy, list[ServerProcess]], question_wav: Path
) -> None:
    """Every slot taken: through HAProxy the handshake gets HTTP 503, directly the replica says 1013.
    Both mics say so, back off, and get in once a slot frees."""
    lb, replicas = fleet
    wait_all_idle(replicas, lb)

    async def main() -> tuple[tuple[int, str, str], tuple[int, str, str]]:
        holders = [await open_session(r.ws_url) for r in replicas for _ in range(SLOTS)]
        assert all(h is not None for h in holders)
        await asyncio.to_thread(lambda: [lb.wait_status(f"kame{i + 1}", "DOWN", 5.0) for i in range(REPLICAS)])
        via_lb = MicOutput(mic(lb.http_url, question_wav))
        direct = MicOutput(mic(replicas[2].http_url, question_wav))
        # both are refused and retry (waited for: a fixed sleep let a slow-starting mic make its first
        # try after the slots were freed, and meet a replica the other mic had just filled)
        await asyncio.to_thread(via_lb.wait_for, "reconnecting in", 30)
        await asyncio.to_thread(direct.wait_for, "reconnecting in", 30)
        # one slot on kame1 first: HAProxy can only send the mic there (its maxconn does not count the
        # sessions made around it), then one on kame3 for the direct mic
        await close_all(holders[:1])
        await asyncio.to_thread(via_lb.wait_for, "connected (moshi)", 30)
        await close_all(holders[-1:])
        outs = [await asyncio.to_thread(m.finish, 60) for m in (via_lb, direct)]
        await close_all(holders[1:-1])
        return outs[0], outs[1]

    (rc1, out1, err1), (rc2, out2, err2) = asyncio.run(main())
    assert rc1 == 0, err1[-2000:]
    assert rc2 == 0, err2[-2000:]
    assert "HTTP 503" in out1 and "reconnecting in" in out1, out1
    assert "1013 server full, retry later" in out2 and "reconnecting in" in out2, out2
    for out in (out1, out2):
        assert "connected (moshi)" in out and "giving up" not in out
        assert "a new conversation starts" not in out  # no conversation had started yet


def test_kame_mic_gives_up_after_its_retries(fleet: tuple[HAProxy, list[ServerProcess]], question_wav: Path) -> None:
    lb, replicas = fleet
    wait_all_idle(replicas, lb)

    async def main() -> tuple[int, str, str]:
        holders = [await open_session(replicas[0].ws_url) for _ in range(SLOTS)]
        p = mic(replicas[0].http_url, question_wav, "--retries", "2")
        out, err = await asyncio.to_thread(p.communicate, timeout=60)
        await close_all(holders)
        return p.returncode, out, err

    rc, out, err = asyncio.run(main())
    assert rc == 2 and "Traceback" not in err
    assert out.count("reconnecting in") == 2 and "gave up after 2 retries" in err, (out, err)


# the page's retries (0.25 s doubling to 8 s, 8 of them) against HAProxy's checks, with every slot held: another
# worker's load stretched the call from 10 s to 20-34 s and, once in four four-worker runs, past its 20 s wait
@pytest.mark.alone
def test_browser_page_retries_while_no_replica_has_room(fleet: tuple[HAProxy, list[ServerProcess]], question_wav: Path) -> None:
    """The browser page through HAProxy with every slot taken: the handshake gets HAProxy's 503 (the
    browser only sees a failed websocket), the page asks /ready (503 too), says so and retries with
    back-off; once a slot frees it gets in by itself. Then its replica drains: the page shows the
    notice, gets 1001, and reconnects to another replica by itself (a new conversation)."""
    import threading

    from playwright.sync_api import sync_playwright

    lb, replicas = fleet
    wait_all_idle(replicas, lb)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    async def fill() -> list[MoshiClient | None]:
        return [await open_session(r.ws_url) for r in replicas for _ in range(SLOTS)]

    holders: list[MoshiClient | None] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium",
                args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
                      "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={question_wav}"],
            )
            try:
                page = browser.new_context().new_page()
                # served through HAProxy while there is room; the HAProxy path is websocket-only (docs/server.md)
                page.goto(lb.http_url + "/?transport=websocket")
                page.wait_for_function("() => window.kame !== undefined", timeout=15000)
                holders = on_loop(fill())
                assert all(h is not None for h in holders)
                for i in range(REPLICAS):
                    lb.wait_status(f"kame{i + 1}", "DOWN", 5.0)
                console: list[str] = []
                page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
                page.click("#connect")

                def state() -> str:
                    return (f"phase={page.evaluate('window.kame.phase')} notice={page.inner_text('#notice-text')!r} "
                            f"console={console[-5:]}")

                try:
                    page.wait_for_function(
                        "() => /No server has room/.test(document.getElementById('notice-text').innerText)", timeout=15000)
                except Exception as exc:  # noqa: BLE001 - say what the page shows
                    raise AssertionError(f"no retry notice: {state()}") from exc
                text = page.inner_text("#notice-text")
                assert "Reconnecting in" in text and "of 8)" in text, text
                assert page.evaluate("window.kame.phase") in ("waiting", "connecting")
                on_loop(close_all(holders[:1]))  # a slot frees on kame1
                page.wait_for_function("() => window.kame.phase === 'live'", timeout=20000)
                assert page.evaluate("window.kame.reconnects") == 0  # its first conversation
                assert active(replicas)[0] == SLOTS  # it took the freed slot
                # ---- kame1 drains under the page: told, 1001, back on another replica by itself
                on_loop(close_all(holders[2:4]))  # room on kame2
                lb.wait_status("kame2", "UP", 5.0)
                old = replicas[0]
                old.proc.send_signal(signal.SIGTERM)
                page.wait_for_function("() => /shutting down for an update: this conversation ends in/"
                                       ".test(document.getElementById('notice-text').innerText)", timeout=5000)
                page.wait_for_function("() => window.kame.phase === 'live' && window.kame.reconnects === 1",
                                       timeout=15000)
                assert "Reconnected: this is a new conversation." in page.inner_text("#notice-text")
                assert active(replicas[1:2]) == [1]  # the page, on kame2
                page.click("#connect")
                page.wait_for_function("() => window.kame.phase === 'idle'", timeout=5000)
                old.proc.wait(15)
                old.stop()
                replicas[0] = ServerProcess(cache_dir=old.env["KAME_CACHE_DIR"], log_path=old.log_path.with_suffix(".2.log"),
                                            env=old.env, port=old.port).start(timeout=240)
                lb.wait_status("kame1", "UP", 30.0)
            finally:
                browser.close()
    finally:
        on_loop(close_all(holders[1:]))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.mark.alone  # a drain's close reaching a mic within its grace: another worker's load races it
def test_sigterm_under_load_drains_to_the_other_replicas(fleet: tuple[HAProxy, list[ServerProcess]], tmp_path: Path) -> None:
    """Three callers and a ``kame mic`` through HAProxy; SIGTERM to the replica holding two of them
    (the mic's). Its sessions are told, run on for the grace, get 1001 and reconnect to the others;
    no new session lands on it while it drains; nobody gives up; the callers on the other replicas
    keep real-time cadence. (Last in the module: the drained replica is gone afterwards.)"""
    from kame.audio.files import write_wav

    lb, replicas = fleet
    wait_all_idle(replicas, lb)
    names = [f"kame{i + 1}" for i in range(REPLICAS)]
    tone = tmp_path / "tone.wav"
    write_wav(tone, (0.05 * np.sin(2 * np.pi * 220 * np.arange(10 * 24000) / 24000)).astype(np.float32))

    async def main() -> dict[str, object]:
        t_end = time.monotonic() + 11.0
        callers = [StreamingClient(i, lb.ws_url) for i in range(3)]
        tasks = []
        for c in callers:  # one at a time: leastconn puts one on each replica ...
            tasks.append(asyncio.create_task(c.run(t_end)))
            while not c.sessions or c.sessions[-1].ws.stats.handshake_t is None:
                await asyncio.sleep(0.05)
        the_mic = mic(lb.http_url, tone)  # ... and the mic's session makes one replica hold two
        while sum(await asyncio.to_thread(active, replicas)) < 4:
            assert the_mic.poll() is None, the_mic.communicate()
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)
        counts = await asyncio.to_thread(active, replicas)
        victim = counts.index(SLOTS)
        before = await asyncio.to_thread(replicas[victim].metric, "kame_sessions_total")
        stot = lb.stats()[names[victim]].total
        t_term = time.monotonic()
        replicas[victim].proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(lb.wait_status, names[victim], "DOWN", 3.0)
        down_after = time.monotonic() - t_term
        # newcomers during the drain: they must land elsewhere (the fleet has room for them)
        newcomers = [await open_session(lb.ws_url) for _ in range(1)]
        during = await asyncio.to_thread(replicas[victim].metric, "kame_sessions_total")
        stot_during = lb.stats()[names[victim]].total
        await close_all(newcomers)
        await asyncio.gather(*tasks)
        mic_out, mic_err = await asyncio.to_thread(the_mic.communicate, timeout=60)
        code = await asyncio.to_thread(replicas[victim].proc.wait, 10)
        await asyncio.sleep(0.3)
        attribute_replicas(lb, callers)
        return {"callers": callers, "victim": victim, "counts": counts, "t_term": t_term, "down_after": down_after,
                "started_before": before, "started_during": during, "stot": stot, "stot_during": stot_during,
                "newcomers": newcomers, "exit": code, "mic": (the_mic.returncode, mic_out, mic_err)}

    r = asyncio.run(main())
    callers: list[StreamingClient] = r["callers"]  # type: ignore[assignment]
    victim = names[r["victim"]]  # type: ignore[index]
    t_term: float = r["t_term"]  # type: ignore[assignment]
    assert r["down_after"] < 1.5  # type: ignore[operator]  # /ready said 503 at once
    assert all(n is not None for n in r["newcomers"])  # type: ignore[union-attr]
    assert r["started_during"] == r["started_before"]  # no new session on the draining replica
    assert r["stot_during"] == r["stot"]  # HAProxy sent it no connection once it was DOWN
    assert all(c.gave_up is None for c in callers), [c.gave_up for c in callers]
    rc, out, err = r["mic"]  # type: ignore[misc]
    print("\nkame mic through the drain:\n" + out)
    assert rc == 0, err[-2000:]
    assert "1001 server shutting down" in out and "reconnecting in" in out and "a new conversation starts" in out, out
    assert "connected (moshi): a new conversation" in out and "reconnected 1 time(s)" in out, out
    assert re.search(r"server: the server is shutting down: this session ends in [12] s\n", out), out  # told (0x05)
    displaced = [c for c in callers if c.sessions[0].replica == victim]
    assert len(displaced) == SLOTS - 1, [[s.replica for s in c.sessions] for c in callers]  # + the mic
    for c in displaced:
        first, second = c.sessions[0], c.sessions[1]
        assert (first.close_code, first.close_reason) == (1001, "server shutting down")
        told = [t for t, e in zip(first.ws.error_times, first.ws.errors) if e.startswith("the server is shutting down")]
        assert told and told[0] - t_term < 1.0, first.ws.errors  # told at once (0x05)
        assert first.closed_t is not None and DRAIN_GRACE_S - 0.3 <= first.closed_t - t_term <= DRAIN_GRACE_S + 3.0
        assert first.ws.stats.frame_arrivals[-1] > t_term + DRAIN_GRACE_S - 0.5  # audio flowed through the grace
        assert second.replica not in (victim, "?")
        assert second.ws.stats.handshake_t is not None and second.ws.stats.handshake_t - first.closed_t < 3.0
        assert any("reconnecting in" in line for line in c.said)
    # The callers on the other replicas keep their cadence through the drain and the newcomers'
    # arrival: compared with their own cadence just before (same machine, same load), since the
    # absolute rate on a shared 2-core machine is bench/fleet.py's business.
    span = DRAIN_GRACE_S + 2.0
    for c in callers:
        if c in displaced:
            continue
        (only,) = c.sessions  # never displaced
        arrivals = only.ws.stats.frame_arrivals
        before = [t for t in arrivals if t_term - 2.0 <= t < t_term]
        during = [t for t in arrivals if t_term <= t < t_term + span]
        gaps_before = [b - a for a, b in zip(before, before[1:])]
        gaps_during = [b - a for a, b in zip(during, during[1:])]
        rate_before, rate_during = len(before) * 0.08 / 2.0, len(during) * 0.08 / span
        assert rate_during >= 0.75 * min(1.0, rate_before), (rate_before, rate_during)  # (> 1: catching up)
        assert max(gaps_during) <= max(0.6, 2 * max(gaps_before)), (max(gaps_before), max(gaps_during))
