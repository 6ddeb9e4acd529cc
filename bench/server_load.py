"""Load test of a running server: N real-time Moshi-protocol clients for T seconds.

Each client streams audio at real time (espeak speech looped with silence,
or noise with ``--noise``) in 80 ms frames (``--chunk 480`` for browser-like
20 ms pages) and timestamps every output frame. Printed per session and in
total: real-time factor (audio received / wall time from the first frame
sent to the last received), time to first audio, and the lateness of each
output frame against an 80 ms schedule anchored at its first frame
(p50/p99). Also prints the server's versions (``/health``) and, when it can
read ``/metrics``, the server-side step time and frame lateness.

Start a server first, e.g. the CPU demo without ASR:

    KAME_ASR__KIND=none .venv/bin/kame serve --config cpu-demo
    .venv/bin/python bench/server_load.py --url ws://127.0.0.1:8998 -n 8 -t 30

Targets on the CPU demo (2 cores, asr none): 8 sessions at RTF >= 0.98 and
p99 lateness < 80 ms.

``--protocol realtime`` uses OpenAI Realtime clients on /v1/realtime,
``--protocol webrtc`` the same sessions as WebRTC calls (aiortc peers on
/v1/realtime/calls, RTP audio; bench/webrtc_load.py says what is measured),
``--protocol live`` Live API applications on /v1/live/sessions (the official
SDK's ``client.live.connect()``; each also appends a commentary every 2 s,
and the server's commentary -> oracle FIFO latency is printed, target p99
<= 10 ms), ``--protocol twilio`` phone calls on /twilio/media as Twilio places them
(G.711 mu-law at 8 kHz in 20 ms messages; bench/twilio_load.py),
``--protocol all`` the three one after the other against the
same server, with a summary line per protocol.

Each run also prints the server's CPU per thread (``kame_thread_cpu_seconds_total``, grouped by
thread name: ``event_loop``, ``kame-engine``, ``kame-opus`` (WebRTC's codec), ``other`` for
torch's own threads) as percent of one core per real-time session (CPU seconds over the seconds
of audio the sessions received), so the host's share of N GPU sessions can be read off;
``--cpu-json FILE`` appends it as one JSON line per protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from tests.support.moshi_client import FRAME, FRAME_S, RATE, MoshiClient, percentile

SENTENCES = (
    "Hello there. What is the capital of France?",
    "Can you tell me a joke about turtles?",
    "How far away is the moon from the earth?",
)


def http_base(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def ws_url(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else "/api/chat"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def http_get(base: str, path: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def speech_audio(seconds: float, seed: int) -> np.ndarray:
    """espeak sentences separated by silence, looped to ``seconds``."""
    from tests.support.speech import silence, synthesize

    parts: list[np.ndarray] = [silence(0.3 * (seed % 4))]
    i = seed
    while sum(p.size for p in parts) < seconds * RATE:
        parts += [synthesize(SENTENCES[i % len(SENTENCES)]), silence(1.5)]
        i += 1
    return np.concatenate(parts)[: int(seconds * RATE)]


def noise_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.05 * rng.standard_normal(int(seconds * RATE))).astype(np.float32)


def histogram_quantile(body: str, name: str, q: float) -> float | None:
    """Quantile estimate from a Prometheus histogram (upper bound of the bucket)."""
    buckets: list[tuple[float, float]] = []
    for line in body.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    for bound, count in buckets:
        if count >= q * total:
            return bound
    return None


def histogram_mean(body: str, name: str) -> float | None:
    vals = {}
    for line in body.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(name + suffix + " "):
                vals[suffix] = float(line.split()[-1])
    if vals.get("_count"):
        return vals["_sum"] / vals["_count"]
    return None


def histogram_delta_quantile(before: str, after: str, name: str, q: float) -> tuple[float | None, int]:
    """Quantile (bucket upper bound) of what a histogram observed between two scrapes, and how many."""

    def buckets(body: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for line in body.splitlines():
            if line.startswith(f"{name}_bucket{{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                out[bound] = out.get(bound, 0.0) + float(line.split()[-1])
        return out

    b, a = buckets(before), buckets(after)
    counts = sorted((bound, a[bound] - b.get(bound, 0.0)) for bound in a)
    if not counts or counts[-1][1] <= 0:
        return None, 0
    total = counts[-1][1]
    for bound, count in counts:
        if count >= q * total:
            return bound, int(total)
    return None, int(total)


def histogram_sum(body: str, name: str) -> float:
    """The sum of every sample of ``name`` (all label sets) in a /metrics body."""
    return sum(float(line.split()[-1]) for line in body.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def thread_cpu(body: str) -> dict[str, float]:
    """CPU seconds by thread group from a /metrics body (``kame_thread_cpu_seconds_total``)."""
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("kame_thread_cpu_seconds_total{"):
            out[line.split('thread="', 1)[1].split('"', 1)[0]] = float(line.split()[-1])
    return out


def cpu_per_session(before: str, after: str, session_s: float) -> dict[str, float]:
    """Percent of one core per real-time session, by thread group, between two scrapes: CPU seconds
    over ``session_s``, the seconds of audio the sessions received in between (a server that falls
    behind real time serves less audio, so the wall time would understate a session's cost)."""
    b, a = thread_cpu(before), thread_cpu(after)
    return {k: 100 * (a[k] - b.get(k, 0.0)) / max(session_s, 1e-9) for k in sorted(a)}


def steady_lateness(arrivals: list[float], after: float) -> list[float]:
    """Lateness against an 80 ms schedule anchored at the first frame that arrived after ``after``.

    Anchoring at the session's very first frame (the definition above) also
    counts the one-time phase shift a session sees when the engine's tick
    phase moves as later sessions join; this one shows the steady cadence.
    """
    tail = [t for t in arrivals if t >= after]
    if not tail:
        return []
    t0 = tail[0]
    return [max(0.0, t - (t0 + k * FRAME_S)) for k, t in enumerate(tail)]


def _gap_at(arrivals: list[float]) -> float:
    """When (monotonic) the longest pause between two output frames ended."""
    if len(arrivals) < 2:
        return float("nan")
    gaps = np.diff(np.asarray(arrivals))
    return float(arrivals[int(np.argmax(gaps)) + 1])


async def one_session(url: str, pcm: np.ndarray, chunk: int, token: str | None, stagger: float) -> MoshiClient:
    await asyncio.sleep(stagger)
    client = await MoshiClient.connect(url, token=token)
    if await client.wait_handshake(30):
        await client.send_pcm(pcm, chunk=chunk)
        await client.drain_output(3.0, until_complete=True)
    await client.close()
    return client


async def run(args: argparse.Namespace) -> int:
    if args.protocol != "all":
        return (await run_protocol(args, args.protocol))[0]
    summary = []
    for protocol in args.all_protocols.split(","):
        print(f"\n## protocol {protocol}")
        summary.append((protocol, *await run_protocol(args, protocol)))
        await asyncio.sleep(2.0)  # sessions of the previous protocol are gone
    print("\n# summary (same server, one protocol after the other)")
    for protocol, code, line in summary:
        print(f"#   {protocol:8s} {'MET   ' if code == 0 else 'MISSED'} {line}")
    return 0 if all(code == 0 for _, code, _ in summary) else 1


async def run_protocol(args: argparse.Namespace, protocol: str) -> tuple[int, str]:
    base = http_base(args.url)
    status, body = http_get(base, "/health", None)
    if status != 200:
        print(f"server_load: {base}/health answered {status}", file=sys.stderr)
        return 2, "server not healthy"
    health = json.loads(body)
    print("# server_load: versions " + " ".join(f"{k}={v}" for k, v in health.get("versions", {}).items()))
    print(f"# machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other processes skew timing)")
    print(
        f"# server: status={health['status']} device={health.get('device')} "
        f"sessions={health['sessions']} checkpoint={health['models']['frontend']['checkpoint']} "
        f"asr={health['models']['asr']['kind']}"
    )
    make = noise_audio if args.noise else speech_audio
    audio = [make(args.seconds, i) for i in range(args.sessions)]
    before = http_get(base, "/metrics", args.token)
    t0 = t_scrape = time.monotonic()
    session = one_session
    if protocol == "realtime":  # /v1/realtime clients, same measurements (bench/realtime_load.py)
        from realtime_load import one_realtime_session as session  # type: ignore[assignment]
    elif protocol == "webrtc":  # /v1/realtime/calls with aiortc peers, RTP audio (bench/webrtc_load.py)
        from webrtc_load import one_webrtc_session as session  # type: ignore[assignment]
    elif protocol == "live":  # /v1/live/sessions applications on the official SDK (bench/live_load.py)
        from functools import partial

        from live_load import one_live_session

        session = partial(one_live_session, fmt=args.live_format)  # type: ignore[assignment]
    elif protocol == "twilio":  # phone calls on /twilio/media, mu-law 8 kHz in 20 ms messages (bench/twilio_load.py)
        from functools import partial

        from twilio_load import one_twilio_session

        session = partial(one_twilio_session, twilio_token=args.twilio_token)  # type: ignore[assignment]
    clients = await asyncio.gather(
        *[
            session(ws_url(args.url), audio[i], args.chunk, args.token, i * args.stagger)
            for i in range(args.sessions)
        ]
    )
    wall = time.monotonic() - t0
    after = http_get(base, "/metrics", args.token)
    scrape_wall = time.monotonic() - t_scrape
    cpu: dict[str, float] = {}
    session_s = sum(c.stats.audio_received_s for c in clients if c.stats.handshake_t is not None)
    if after[0] == 200 and before[0] == 200 and session_s > 0:
        cpu = cpu_per_session(before[1], after[1], session_s)

    print(f"# {args.sessions} sessions x {args.seconds:g} s, {args.chunk}-sample frames, total wall {wall:.1f} s")
    print("session  handshake  sent_s  recv_s    rtf  first_audio_ms  late_p50_ms  late_p99_ms  max_gap_ms  (at s)  close")
    rtfs, p50s, p99s, ttfas, all_late, all_steady = [], [], [], [], [], []
    # steady state: from 1 s after the last session's first frame
    firsts = [c.stats.frame_arrivals[0] for c in clients if c.stats.frame_arrivals]
    steady_from = (max(firsts) + 1.0) if firsts else 0.0
    failed = 0
    for i, c in enumerate(clients):
        s = c.stats
        if s.handshake_t is None:
            failed += 1
            print(f"{i:7d}  refused ({c.close_code} {c.close_reason})")
            continue
        late = s.lateness_s()
        all_late += late
        all_steady += steady_lateness(s.frame_arrivals, steady_from)
        ttfa = s.time_to_first_audio_s
        rtfs.append(s.rtf)
        p50s.append(s.lateness_ms(50))
        p99s.append(s.lateness_ms(99))
        if ttfa is not None:
            ttfas.append(ttfa)
        print(
            f"{i:7d}  {1000 * (s.handshake_t - s.connected_t):7.0f}ms  {s.audio_sent_s:6.1f}  {s.audio_received_s:6.1f}  "
            f"{s.rtf:5.3f}  {1000 * ttfa if ttfa is not None else float('nan'):14.0f}  "
            f"{s.lateness_ms(50):11.1f}  {s.lateness_ms(99):11.1f}  {1000 * s.max_gap_s():10.0f}  "
            f"{_gap_at(s.frame_arrivals) - t0:6.1f}  {c.close_code}"
        )
    if not rtfs:
        print("server_load: no session got through", file=sys.stderr)
        return 1, "no session got through"
    p99_all = 1000 * percentile(all_late, 99)
    p99_steady = 1000 * percentile(all_steady, 99)
    print(
        f"# steady state (anchored 1 s after the last session started): lateness p50 "
        f"{1000 * percentile(all_steady, 50):.1f} ms p99 {1000 * percentile(all_steady, 99):.1f} ms"
    )
    print(
        f"# total: rtf min {min(rtfs):.3f} mean {statistics.mean(rtfs):.3f}; "
        f"lateness p50 {1000 * percentile(all_late, 50):.1f} ms p99 {p99_all:.1f} ms (worst session p99 {max(p99s):.1f} ms); "
        f"first audio median {1000 * statistics.median(ttfas):.0f} ms"
    )
    if after[0] == 200 and before[0] == 200:
        step_mean = histogram_mean(after[1], "kame_step_seconds")
        step_p99 = histogram_quantile(after[1], "kame_step_seconds", 0.99)
        late_p99 = histogram_quantile(after[1], "kame_frame_lateness_seconds", 0.99)
        dropped = sum(
            float(line.split()[-1]) for line in after[1].splitlines() if line.startswith("kame_frames_dropped_total{")
        )
        print(
            f"# server side (whole run of the server): step mean {1000 * (step_mean or 0):.1f} ms, step p99 <= "
            f"{1000 * (step_p99 or 0):.0f} ms, frame lateness p99 <= {1000 * (late_p99 or 0):.0f} ms, frames dropped {dropped:.0f}"
        )
        reply_p50, n_replies = histogram_delta_quantile(before[1], after[1], "kame_first_reply_seconds", 0.5)
        reply_p99, _ = histogram_delta_quantile(before[1], after[1], "kame_first_reply_seconds", 0.99)
        if n_replies:  # from a session's connection to its first reply frame (a PersonaPlex session's prompts first)
            print(f"# server side (this run): connect to first reply frame p50 <= {1000 * (reply_p50 or 0):.0f} ms, "
                  f"p99 <= {1000 * (reply_p99 or 0):.0f} ms ({n_replies:.0f} sessions)")
    if protocol == "webrtc" and after[0] == 200 and before[0] == 200:
        def delta(name: str) -> float:
            return histogram_sum(after[1], name) - histogram_sum(before[1], name)

        print(f"# webrtc (server side, this run): output underruns {delta('kame_webrtc_output_underruns_total'):.0f}, "
              f"input concealed {delta('kame_webrtc_input_concealed_seconds_total'):.1f} s, late input dropped "
              f"{delta('kame_webrtc_input_late_seconds_total'):.2f} s, packets lost "
              f"{delta('kame_webrtc_packets_lost_total'):.0f}")
    fifo = ""
    if protocol == "live" and after[0] == 200 and before[0] == 200:
        p50, n = histogram_delta_quantile(before[1], after[1], "kame_answer_fifo_seconds", 0.5)
        p99, _ = histogram_delta_quantile(before[1], after[1], "kame_answer_fifo_seconds", 0.99)
        if n:
            fifo = f"; commentary -> oracle FIFO p50 <= {1000 * (p50 or 0):.1f} ms p99 <= {1000 * (p99 or 0):.1f} ms ({n})"
            print(f"# commentary -> oracle FIFO (server side, {n} commentaries): p50 <= {1000 * (p50 or 0):.1f} ms, "
                  f"p99 <= {1000 * (p99 or 0):.1f} ms (target p99 <= 10 ms)")
    if cpu:
        print(f"# server CPU per real-time session (% of one core; {args.sessions} sessions = "
              f"{session_s / scrape_wall:.1f} real-time sessions over {scrape_wall:.0f} s): "
              + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()) + f"; total {sum(cpu.values()):.2f}")
        if args.cpu_json:
            with open(args.cpu_json, "a") as f:
                f.write(json.dumps({"protocol": protocol, "sessions": args.sessions, "rtf_min": round(min(rtfs), 3),
                                    "realtime_sessions": round(session_s / scrape_wall, 2),
                                    "cpu_pct_per_session": {k: round(v, 3) for k, v in cpu.items()}}) + "\n")
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ok = min(rtfs) >= args.target_rtf and p99_steady < args.target_p99_ms and not failed
    print(f"# target rtf >= {args.target_rtf} and steady p99 < {args.target_p99_ms:g} ms: {'MET' if ok else 'MISSED'}")
    line = (f"rtf min {min(rtfs):.3f}, lateness p99 {p99_all:.1f} ms (steady {p99_steady:.1f} ms), "
            f"{len(rtfs)}/{args.sessions} sessions{fifo}")
    return (0 if ok else 1), line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="ws://127.0.0.1:8998/api/chat", help="Server URL (ws:// or http://; /api/chat added).")
    p.add_argument("-n", "--sessions", type=int, default=8, help="Concurrent sessions.")
    p.add_argument("-t", "--seconds", type=float, default=30.0, help="Audio each session streams.")
    p.add_argument("--chunk", type=int, default=FRAME, help="Samples per client frame (1920 = 80 ms, 480 = 20 ms).")
    p.add_argument("--noise", action="store_true", help="Stream noise instead of espeak speech.")
    p.add_argument("--stagger", type=float, default=0.05, help="Seconds between session starts.")
    p.add_argument("--token", default=None, help="Bearer token (server.auth_token).")
    p.add_argument("--protocol", choices=("chat", "realtime", "webrtc", "live", "twilio", "all"), default="chat",
                   help="chat: Moshi protocol on /api/chat; realtime: OpenAI Realtime events on /v1/realtime; webrtc: "
                   "the same over WebRTC calls (/v1/realtime/calls, RTP audio); live: the Live API on "
                   "/v1/live/sessions; twilio: phone calls on /twilio/media (Twilio Media Streams); all: those of "
                   "--all-protocols, one after the other.")
    p.add_argument("--all-protocols", default="chat,realtime,live",
                   help="What --protocol all runs, in order (e.g. realtime,webrtc to compare the two transports).")
    p.add_argument("--live-format", choices=("pcm24", "pcm16", "pcmu", "pcma"), default="pcm24",
                   help="Audio format of the Live sessions (both ways).")
    p.add_argument("--twilio-token", default=None, help="The server's twilio.auth_token: calls are signed with it.")
    p.add_argument("--cpu-json", default=None, help="Append the server's CPU per thread and session here (JSON lines).")
    p.add_argument("--target-rtf", type=float, default=0.98)
    p.add_argument("--target-p99-ms", type=float, default=80.0)
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
