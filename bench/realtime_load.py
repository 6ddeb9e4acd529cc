"""Load test of ``/v1/realtime``: N real-time Realtime clients, optionally with abusive clients, and the
server's memory through the run.

Each well-behaved client streams espeak speech (looped with silence; ``--noise`` for noise) through
``input_audio_buffer.append`` at real time and timestamps every output frame (``response.output_audio
.delta`` and ``kame.output_audio.delta``). Measured exactly as ``bench/server_load.py`` measures the
Moshi protocol: real-time factor (audio received / wall time from the first audio sent to the last
received) and the lateness of each output frame against an 80 ms schedule anchored at its first frame.

``--abusers K`` adds K clients (in a process of their own, so that their CPU does not delay the
well-behaved clients' timestamps) that cycle through the abuse matrix of ``tests/test_abuse.py`` on both
websockets (bad events, floods, oversized messages, message storms, clients that never read or vanish)
for the whole run. The server's RSS is sampled every ``--rss-every`` seconds (``/proc/PID/status``; the
PID comes from ``--server-pid``, or the server is started here with ``--start-server``) and printed at
the start and the end, with its growth after the first minute.

    KAME_ASR__KIND=none .venv/bin/kame serve --config cpu-demo &
    .venv/bin/python bench/realtime_load.py -n 8 --duration 60
    .venv/bin/python bench/realtime_load.py --start-server -n 8 --abusers 2 --duration 300

Targets on the CPU demo (2 cores, asr none): 8 sessions at RTF >= 0.98 and p99 lateness < 80 ms; RSS
flat (no growth over the second half of the run) with abusive clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_load import (
    _gap_at,
    histogram_mean,
    histogram_quantile,
    http_base,
    http_get,
    noise_audio,
    speech_audio,
)

from kame.client.realtime_client import RealtimeClient
from tests.support.moshi_client import percentile


def realtime_url(url: str) -> str:
    base = http_base(url)
    return base.replace("http", "ws", 1) + "/v1/realtime"


def chat_url(url: str) -> str:
    return http_base(url).replace("http", "ws", 1) + "/api/chat"


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def one_realtime_session(url: str, pcm: np.ndarray, chunk: int, token: str | None, stagger: float) -> RealtimeClient:
    """Connect, stream ``pcm`` at real time, collect the tail, close (the shape server_load.py expects)."""
    await asyncio.sleep(stagger)
    client = await RealtimeClient.connect(realtime_url(url), token=token, keep_audio=False)
    if await client.wait_for_type("session.created", 30):
        await client.send_pcm(pcm, chunk=chunk)
        await client.drain_output(3.0, until_complete=True)
    await client.close()
    return client


async def abuser(index: int, url: str, stop: asyncio.Event, counts: dict[str, int], pause: float = 0.5) -> None:
    """Cycle through the abuse matrix on both websockets until ``stop`` (``pause`` s between cases)."""
    from test_abuse import Matrix

    m = Matrix(realtime_url(url), chat_url(url))
    cases = [
        m.rt_bad_events_keep_the_session, m.rt_too_many_errors, m.rt_oversized, m.rt_flood, m.rt_message_storm,
        m.rt_vanish, m.chat_bad_messages, m.chat_oversized, m.chat_flood, m.chat_vanish,
        lambda: m.never_reads(m.rt, "realtime"), lambda: m.never_reads(m.chat, "chat"),
    ]
    rng = random.Random(index)
    while not stop.is_set():
        k = rng.randrange(len(cases))
        try:
            await asyncio.wait_for(cases[k](), 30)
            counts["done"] = counts.get("done", 0) + 1
        except Exception as exc:  # noqa: BLE001 - e.g. refused because the server is full: try again
            counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1
        await asyncio.sleep(pause)


async def _abuse_process(cmd: list[str], counts: dict[str, int]) -> None:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    lines = out.decode().strip().splitlines()
    if lines:
        counts.update(json.loads(lines[-1]))


async def sample_rss(pid: int | None, every: float, samples: list[tuple[float, float]], stop: asyncio.Event) -> None:
    if pid is None:
        return
    t0 = time.monotonic()
    while True:
        samples.append((time.monotonic() - t0, rss_mb(pid)))
        try:
            await asyncio.wait_for(stop.wait(), every)
            samples.append((time.monotonic() - t0, rss_mb(pid)))
            return
        except asyncio.TimeoutError:
            pass


async def run(args: argparse.Namespace, pid: int | None) -> int:
    base = http_base(args.url)
    status, body = http_get(base, "/health", None)
    if status != 200:
        print(f"realtime_load: {base}/health answered {status}", file=sys.stderr)
        return 2
    health = json.loads(body)
    print("# realtime_load: versions " + " ".join(f"{k}={v}" for k, v in health.get("versions", {}).items()))
    print(f"# server: sessions={health['sessions']} asr={health['models']['asr']['kind']} pid={pid}")
    make = noise_audio if args.noise else speech_audio
    audio = [make(args.duration, i) for i in range(args.sessions)]
    stop = asyncio.Event()
    rss: list[tuple[float, float]] = []
    abuse_counts: dict[str, int] = {}
    sampler = asyncio.create_task(sample_rss(pid, args.rss_every, rss, stop))
    abusers = []
    if args.abusers:
        cmd = [sys.executable, __file__, "--abuse-only", "--url", args.url, "--abusers", str(args.abusers),
               "--duration", str(args.duration)]
        abusers.append(asyncio.create_task(_abuse_process(cmd, abuse_counts)))
    t0 = time.monotonic()
    clients = await asyncio.gather(
        *[one_realtime_session(args.url, audio[i], args.chunk, args.token, i * args.stagger) for i in range(args.sessions)]
    )
    wall = time.monotonic() - t0
    stop.set()
    await asyncio.gather(sampler, *abusers, return_exceptions=True)
    after = http_get(base, "/metrics", args.token)

    print(f"# {args.sessions} realtime sessions x {args.duration:g} s, {args.chunk}-sample appends, "
          f"{args.abusers} abusers, wall {wall:.1f} s")
    print(
        "session  created   sent_s  recv_s    rtf  first_audio_ms  late_p50_ms  late_p99_ms  max_gap_ms  (at s)  errors  close"
    )
    rtfs, p99s, all_late = [], [], []
    failed = 0
    for i, c in enumerate(clients):
        s = c.stats
        if s.created_t is None:
            failed += 1
            print(f"{i:7d}  refused ({c.close_code} {c.close_reason})")
            continue
        all_late += s.lateness_s()
        rtfs.append(s.rtf)
        p99s.append(s.lateness_ms(99))
        ttfa = s.time_to_first_audio_s
        print(
            f"{i:7d}  {1000 * (s.created_t - s.connected_t):6.0f}ms  {s.audio_sent_s:6.1f}  {s.audio_received_s:6.1f}  "
            f"{s.rtf:5.3f}  {1000 * ttfa if ttfa is not None else float('nan'):14.0f}  {s.lateness_ms(50):11.1f}  "
            f"{s.lateness_ms(99):11.1f}  {1000 * s.max_gap_s():10.0f}  {_gap_at(s.frame_arrivals) - t0:6.1f}  "
            f"{len(c.errors):6d}  {c.close_code}"
        )
    if not rtfs:
        print("realtime_load: no session got through", file=sys.stderr)
        return 1
    p99_all = 1000 * percentile(all_late, 99)
    print(f"# total: rtf min {min(rtfs):.3f} mean {statistics.mean(rtfs):.3f}; lateness p50 "
          f"{1000 * percentile(all_late, 50):.1f} ms p99 {p99_all:.1f} ms (worst session p99 {max(p99s):.1f} ms)")
    if args.abusers:
        print(f"# abusive cases run: {abuse_counts}")
    if after[0] == 200:
        step_mean = histogram_mean(after[1], "kame_step_seconds") or 0.0
        step_p99 = histogram_quantile(after[1], "kame_step_seconds", 0.99) or 0.0
        late_p99 = histogram_quantile(after[1], "kame_frame_lateness_seconds", 0.99) or 0.0
        print(
            f"# server side: step mean {1000 * step_mean:.1f} ms, step p99 <= {1000 * step_p99:.0f} ms, "
            f"frame lateness at send p99 <= {1000 * late_p99:.0f} ms"
        )
        gc_mean = histogram_mean(after[1], "kame_gc_seconds")
        if gc_mean is not None:
            print(f"# scheduled garbage collections: mean {1000 * gc_mean:.2f} ms, p99 <= "
                  f"{1000 * (histogram_quantile(after[1], 'kame_gc_seconds', 0.99) or 0.0):.1f} ms")
        wanted = ("kame_sessions_ended_total{", "kame_frames_dropped_total{", "kame_audio_dropped_seconds_total{",
                  "kame_sessions_rejected_total{")
        for line in after[1].splitlines():
            if line.startswith(wanted) and not line.endswith(" 0.0"):
                print(f"#   {line}")
    ok = min(rtfs) >= args.target_rtf and p99_all < args.target_p99_ms and not failed
    if rss:
        start, end = rss[0][1], rss[-1][1]
        half = rss[-1][0] / 2  # the allocator warms up for a minute or two: judge the second half
        warm = [(t, v) for t, v in rss if t >= half]
        span = warm[-1][0] - warm[0][0] if warm else 0.0
        slope = (warm[-1][1] - warm[0][1]) / span * 60 if span > 0 else float("nan")
        print(f"# server RSS: start {start:.1f} MB, end {end:.1f} MB, max {max(v for _, v in rss):.1f} MB, "
              f"growth over the second half {slope:+.2f} MB/min")
        print("# server RSS samples (s: MB): " + " ".join(f"{t:.0f}:{v:.1f}" for t, v in rss))
    print(f"# target rtf >= {args.target_rtf} and p99 < {args.target_p99_ms:g} ms: {'MET' if ok else 'MISSED'}")
    return 0 if ok else 1


async def abuse_only(url: str, count: int, seconds: float, seed: int) -> None:
    """The abusive clients alone, for ``seconds`` (run in their own process: their CPU must not delay the
    well-behaved clients' timestamps)."""
    stop = asyncio.Event()
    counts: dict[str, int] = {}
    tasks = [asyncio.create_task(abuser(seed * 100 + i, url, stop, counts)) for i in range(count)]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(counts))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8998", help="Server base URL (ws:// or http://).")
    p.add_argument("-n", "--sessions", type=int, default=8, help="Concurrent well-behaved sessions.")
    p.add_argument("-t", "--duration", "--seconds", dest="duration", type=float, default=30.0,
                   help="Audio each session streams (seconds); 300 for the 5-minute memory run.")
    p.add_argument("--chunk", type=int, default=960, help="Samples per append (960 = 40 ms).")
    p.add_argument("--noise", action="store_true", help="Stream noise instead of espeak speech.")
    p.add_argument("--stagger", type=float, default=0.05, help="Seconds between session starts.")
    p.add_argument("--abusers", type=int, default=0, help="Abusive clients cycling through the abuse matrix.")
    p.add_argument("--token", default=None, help="Bearer token (server.auth_token).")
    p.add_argument("--server-pid", type=int, default=None, help="PID of the server, for its RSS.")
    p.add_argument("--start-server", action="store_true",
                   help="Start `kame serve --config cpu-demo` (asr none) here, with --max-sessions slots.")
    p.add_argument("--max-sessions", type=int, default=None,
                   help="Slots of the server started here (default: sessions + abusers).")
    p.add_argument("--rss-every", type=float, default=5.0)
    p.add_argument("--abuse-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--target-rtf", type=float, default=0.98)
    p.add_argument("--target-p99-ms", type=float, default=80.0)
    args = p.parse_args()
    if args.abuse_only:
        asyncio.run(abuse_only(args.url, args.abusers, args.duration, args.seed))
        return 0
    server = None
    pid = args.server_pid
    if args.start_server:
        from tests.support.moshi_client import ServerProcess

        tmp = Path(tempfile.mkdtemp(prefix="kame-realtime-load-"))
        server = ServerProcess(
            cache_dir=Path.home() / ".cache" / "kame",
            log_path=tmp / "server.log",
            env={"KAME_ASR__KIND": "none", "KAME_FRONTEND__BATCH_SIZE": str(args.max_sessions or args.sessions + args.abusers),
                 "KAME_SERVER__SLOW_CLIENT_TIMEOUT_S": "3"},
        ).start()
        args.url = server.http_url
        pid = server.proc.pid
        print(f"# started {' '.join(server.cmd[2:])} (log {tmp / 'server.log'})")
    try:
        return asyncio.run(run(args, pid))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
