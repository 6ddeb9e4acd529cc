"""Fleet bench: kame replicas behind a real HAProxy, then a rolling restart of one of them.

Starts ``--replicas`` CPU-demo servers (ASR off, ``--slots`` sessions each) and HAProxy with the
shipped ``deploy/haproxy.cfg`` (tests/support/haproxy.py adapts its addresses), then ``--clients``
Moshi-protocol clients that stream audio at real time through the load balancer and reconnect
like ``kame mic`` does (kame.client.reconnect: back-off with jitter on 1013, 1001, HTTP 503).

Printed:

* per replica over the steady phase (every client connected, before the restart): sessions,
  real-time factor (audio received / wall time) and p99 lateness of output frames against an
  80 ms schedule;
* the rolling restart: SIGTERM to the busiest replica while the clients run (it drains: its
  sessions are told, then closed with 1001 after server.drain_grace_s), its clients reconnect
  to the others; printed per displaced client: seconds from the 1001 close to the new session's
  handshake, and whether any client gave up. The replica is then started again on its port and
  HAProxy takes it back.

Which replica served a session comes from HAProxy's own log (client port -> ``kame/kameN``).

    .venv/bin/python bench/fleet.py                      # 3 replicas x 4 slots, 8 clients
    .venv/bin/python bench/fleet.py --steady 30 --drain-grace 2

Targets: RTF >= 0.98 on every replica in the steady phase; every displaced client reconnected
within 3 s; none gave up.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support

from kame.client.reconnect import Backoff  # noqa: E402
from tests.support.haproxy import Backend, HAProxy, StreamingClient, attribute_replicas, start_replicas  # noqa: E402
from tests.support.moshi_client import FRAME_S, MoshiClient, ServerProcess, percentile  # noqa: E402


def window_stats(ws: MoshiClient, t0: float, t1: float) -> tuple[float, list[float]] | None:
    """RTF and per-frame lateness of the frames that arrived in [t0, t1]."""
    arrivals = [t for t in ws.stats.frame_arrivals if t0 <= t <= t1]
    if len(arrivals) < 5:
        return None
    span = t1 - t0
    rtf = len(arrivals) * FRAME_S / span
    first = arrivals[0]
    late = [max(0.0, t - (first + k * FRAME_S)) for k, t in enumerate(arrivals)]
    return rtf, late


async def main_async(args: argparse.Namespace, lb: HAProxy, replicas: list[ServerProcess], env: dict[str, str],
                     cache_dir: Path, run_dir: Path) -> int:
    names = [f"kame{i + 1}" for i in range(len(replicas))]
    policy = Backoff(attempts=args.retries)
    t_start = time.monotonic()
    total_s = args.warmup + args.steady + args.after
    stop_at = t_start + total_s
    clients = [StreamingClient(i, lb.ws_url) for i in range(args.clients)]
    tasks = [asyncio.create_task(c.run(stop_at, policy)) for c in clients]
    await asyncio.sleep(args.warmup)
    steady0 = time.monotonic()
    await asyncio.sleep(args.steady)
    steady1 = time.monotonic()
    # ---- rolling restart of the busiest replica
    counts = [r.get_json("/health")[1]["sessions"]["active"] for r in replicas]
    victim = int(np.argmax(counts))
    print(f"\nsessions per replica before the restart: {dict(zip(names, counts))}; restarting {names[victim]}")
    sigterm_t = time.monotonic()
    replicas[victim].proc.send_signal(signal.SIGTERM)
    exit_code = await asyncio.to_thread(replicas[victim].proc.wait, 120)
    exited_t = time.monotonic()
    replicas[victim].stop()
    print(f"{names[victim]}: exited {exited_t - sigterm_t:.1f} s after SIGTERM (code {exit_code})")
    fresh = ServerProcess(cache_dir=cache_dir, log_path=run_dir / f"{names[victim]}-restarted.log", env=env,
                          port=replicas[victim].port)
    await asyncio.to_thread(fresh.start, 240.0)
    replicas[victim] = fresh
    await asyncio.to_thread(lb.wait_status, names[victim], "UP", 30.0)
    print(f"{names[victim]}: back in rotation {time.monotonic() - sigterm_t:.1f} s after SIGTERM")
    await asyncio.gather(*tasks)
    await asyncio.sleep(0.5)  # HAProxy logs a connection when it ends
    attribute_replicas(lb, clients)  # which replica served each session (HAProxy's log)
    # ---- steady phase, per replica
    print(f"\nsteady phase: {steady1 - steady0:.1f} s with {args.clients} clients "
          f"({args.replicas} replicas x {args.slots} slots)")
    print(f"{'replica':>8} {'sessions':>8} {'RTF min':>8} {'RTF mean':>9} {'p99 late ms':>12}")
    worst_rtf = 9.9
    for name in names:
        rtfs: list[float] = []
        late: list[float] = []
        n = 0
        for c in clients:
            for s in c.sessions:
                if s.replica != name or s.opened_t > steady0 or (s.closed_t or 1e18) < steady1:
                    continue
                got = window_stats(s.ws, steady0, steady1)
                if got is None:
                    continue
                n += 1
                rtfs.append(got[0])
                late += got[1]
        if rtfs:
            worst_rtf = min(worst_rtf, min(rtfs))
            print(f"{name:>8} {n:>8} {min(rtfs):>8.3f} {float(np.mean(rtfs)):>9.3f} {1000 * percentile(late, 99):>12.0f}")
        else:
            print(f"{name:>8} {0:>8} {'-':>8} {'-':>9} {'-':>12}")
    # ---- the restart, per displaced client
    print(f"\nrolling restart of {names[victim]}:")
    displaced = 0
    untold = 0
    worst_gap = 0.0
    for c in clients:
        for k, s in enumerate(c.sessions):
            if s.close_code not in (1001, 1012) or s.closed_t is None or s.closed_t < sigterm_t:
                continue
            displaced += 1
            nxt = c.sessions[k + 1] if k + 1 < len(c.sessions) else None
            if nxt is None or nxt.ws.stats.handshake_t is None:
                print(f"  client {c.index}: closed ({s.close_code}) on {s.replica}, NOT reconnected")
                worst_gap = float("inf")
                continue
            gap = nxt.ws.stats.handshake_t - s.closed_t
            worst_gap = max(worst_gap, gap)
            told = [t for t, text in zip(s.ws.error_times, s.ws.errors) if "shutting down: this session ends" in text]
            told_s = f"told {told[0] - sigterm_t:+.2f} s, " if told else "NOT told, "
            untold += 0 if told else 1
            print(f"  client {c.index}: {told_s}{s.close_code} from {s.replica} {s.closed_t - sigterm_t:.1f} s after SIGTERM, "
                  f"reconnected to {nxt.replica} in {gap:.2f} s")
    gave_up = [c for c in clients if c.gave_up]
    late_lands = [s for c in clients for s in c.sessions
                  if s.replica == names[victim] and sigterm_t < s.opened_t < exited_t]
    print(f"displaced clients: {displaced} ({displaced - untold} told first); slowest reconnect {worst_gap:.2f} s (target < 3 s); "
          f"gave up: {len(gave_up)}; sessions that landed on {names[victim]} while it drained: {len(late_lands)}")
    for c in gave_up:
        print(f"  client {c.index} gave up: {c.gave_up}")
    ok = worst_rtf >= 0.98 and worst_gap < 3.0 and not gave_up and displaced > 0 and not late_lands and not untold
    print(f"\nverdict: {'PASS' if ok else 'MISS'} (RTF >= 0.98 per session in the steady phase, reconnects < 3 s, "
          "none gave up, none landed on the draining replica)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--slots", type=int, default=4, help="Sessions per replica (frontend.batch_size).")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--warmup", type=float, default=5.0, help="Seconds for every client to connect.")
    p.add_argument("--steady", type=float, default=20.0, help="Seconds of the steady phase.")
    p.add_argument("--after", type=float, default=25.0, help="Seconds the clients run on after the restart begins.")
    p.add_argument("--drain-grace", type=float, default=2.0, help="server.drain_grace_s of the replicas.")
    p.add_argument("--retries", type=int, default=8)
    p.add_argument("--cache-dir", type=Path, default=None, help="KAME_CACHE_DIR (default: a temporary one).")
    args = p.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="kame-fleet-"))
    cache_dir = args.cache_dir or run_dir / "cache"
    from kame.frontend.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint(cache_dir, seed=0)  # once, before the replicas race for it
    env = {
        "KAME_ASR__KIND": "none",
        "KAME_FRONTEND__BATCH_SIZE": str(args.slots),
        "KAME_FRONTEND__CPU_THREADS": "1",  # three replicas share the machine: one torch thread each
        "KAME_SERVER__DRAIN_GRACE_S": str(args.drain_grace),
    }
    from kame.server.config import ServerConfig

    if "drain_grace_s" not in ServerConfig.model_fields:
        env.pop("KAME_SERVER__DRAIN_GRACE_S")
        print("(this server has no server.drain_grace_s: SIGTERM closes sessions at once)")
    print(f"starting {args.replicas} replicas ({run_dir})...")
    replicas = start_replicas(args.replicas, cache_dir=cache_dir, run_dir=run_dir, env=env)
    lb = HAProxy(run_dir, [Backend(f"kame{i + 1}", r.port, args.slots) for i, r in enumerate(replicas)])
    try:
        lb.start()
        for i in range(args.replicas):
            lb.wait_status(f"kame{i + 1}", "UP", 30)
        health = replicas[0].get_json("/health")[1]
        print(f"kame {health['versions'].get('kame')} on {health['device']}, HAProxy on {lb.http_url}")
        return asyncio.run(main_async(args, lb, replicas, env, cache_dir, run_dir))
    finally:
        lb.stop()
        for r in replicas:
            r.stop(signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
