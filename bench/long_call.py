"""Long calls stay flat: the server's memory and tick time over a call of 15 to 60 minutes.

``realtime`` (default): starts ``kame serve --config cpu-demo`` (Whisper tiny.en, the scripted
back-end, ``server.max_duration_s: 0``) and holds one ``/v1/realtime`` session at real time for
``--minutes``, streaming espeak sentences with pauses (so turns end, the LLM answers and the
conversation grows). Every ``--every`` s it samples the server's RSS (/proc) and the engine tick
(``kame_step_seconds``: the mean over the last window). ``fast``: the loop of ``kame run --fast``
(:func:`kame.frontend.runner.run_offline`) on a ``--minutes`` input, in this process: RSS and the
mean step time per minute of audio. Both print figures at minutes 1, 2, 5, 15, 30, 60 and check the
end against minute 2: RSS within 25 MB, tick within 10 %.

    .venv/bin/python bench/long_call.py --minutes 15            # ~16 min wall
    .venv/bin/python bench/long_call.py fast --minutes 60        # ~15-30 min wall on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from server_load import http_base, http_get, speech_audio  # noqa: E402

MARKS_MIN = (1, 2, 5, 15, 30, 60)
RSS_SLACK_MB = 25.0
TICK_SLACK = 0.10


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def step_totals(body: str) -> tuple[float, float]:
    """(sum, count) of the ``kame_step_seconds`` histogram in a /metrics scrape."""
    vals = {"_sum": 0.0, "_count": 0.0}
    for line in body.splitlines():
        for suffix in vals:
            if line.startswith(f"kame_step_seconds{suffix} "):
                vals[suffix] = float(line.split()[-1])
    return vals["_sum"], vals["_count"]


def cpu_s(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: (t s, RSS MB, mean tick wall s, CPU s per tick) over the window ending at t
Sample = tuple[float, float, float, float]


def report(samples: list[Sample], minutes: float) -> bool:
    """Prints the marks and the end against minute 2. The tick's wall time follows the machine's load (other
    processes take the cores); its CPU time does not, so flatness is judged on RSS and CPU per tick."""
    def at(minute: float) -> Sample:
        return min(samples, key=lambda s: abs(s[0] - 60 * minute))

    print("minute   RSS_MB   tick_wall_ms   tick_cpu_ms")
    for m in [m for m in MARKS_MIN if m <= minutes + 1e-9] + ([minutes] if minutes not in MARKS_MIN else []):
        t, rss, tick, cpu = at(m)
        print(f"{m:6g}  {rss:7.1f}  {1000 * tick:13.2f}  {1000 * cpu:12.2f}   (sample at {t:.0f} s)")
    ref, end = at(2), samples[-1]
    # the end: the last minute's samples, averaged (one window is noisy)
    last = [s for s in samples if s[0] >= samples[-1][0] - 60]
    end_rss = end[1]
    end_wall = sum(s[2] for s in last) / len(last)
    end_cpu = sum(s[3] for s in last) / len(last)
    near2 = [s for s in samples if 60 <= s[0] <= 180]
    ref_wall = sum(s[2] for s in near2) / len(near2) if near2 else ref[2]
    ref_cpu = sum(s[3] for s in near2) / len(near2) if near2 else ref[3]
    drss = end_rss - ref[1]
    dwall = (end_wall - ref_wall) / ref_wall if ref_wall > 0 else float("nan")
    dcpu = (end_cpu - ref_cpu) / ref_cpu if ref_cpu > 0 else float("nan")
    ok = drss <= RSS_SLACK_MB and dcpu <= TICK_SLACK
    print(f"# last minute vs minutes 1-3: RSS {drss:+.1f} MB (target <= {RSS_SLACK_MB:g}), tick CPU {100 * dcpu:+.1f} % "
          f"(target <= {100 * TICK_SLACK:g} %): {'MET' if ok else 'MISSED'}; tick wall {100 * dwall:+.1f} % "
          f"(follows the machine's load; load average now {os.getloadavg()[0]:.1f})")
    print("# samples (s: MB/wall ms/cpu ms): " + " ".join(f"{t:.0f}:{r:.1f}/{1000 * k:.1f}/{1000 * c:.1f}"
                                                        for t, r, k, c in samples))
    return ok


async def realtime_call(args: argparse.Namespace) -> int:
    from kame.client.realtime_client import RealtimeClient
    from tests.support.moshi_client import ServerProcess

    tmp = Path(tempfile.mkdtemp(prefix="kame-long-call-"))
    env = {"KAME_SERVER__MAX_DURATION_S": "0", "KAME_FRONTEND__BATCH_SIZE": "1", "KAME_ASR__KIND": args.asr}
    server = ServerProcess(cache_dir=Path.home() / ".cache" / "kame", log_path=tmp / "server.log", env=env,
                           port=args.port).start()
    pid = server.proc.pid
    base = http_base(server.http_url)
    print(f"# long_call realtime: {args.minutes:g} min, asr {args.asr}, server pid {pid} (log {tmp / 'server.log'})")
    seconds = 60 * args.minutes
    pcm = speech_audio(seconds, 0)
    samples: list[Sample] = []
    try:
        client = await RealtimeClient.connect(http_base(server.http_url).replace("http", "ws", 1) + "/v1/realtime",
                                              keep_audio=False)
        if not await client.wait_for_type("session.created", 60):
            print("long_call: no session.created", file=sys.stderr)
            return 2
        sender = asyncio.create_task(client.send_pcm(pcm, chunk=1920))
        t0 = time.monotonic()
        last, last_cpu = step_totals(http_get(base, "/metrics", None)[1]), cpu_s(pid)
        while not sender.done():
            await asyncio.sleep(args.every)
            now, now_cpu = step_totals((await asyncio.to_thread(http_get, base, "/metrics", None))[1]), cpu_s(pid)
            n = now[1] - last[1]
            tick = (now[0] - last[0]) / n if n > 0 else float("nan")
            cpu = (now_cpu - last_cpu) / n if n > 0 else float("nan")  # the whole server's CPU per tick
            last, last_cpu = now, now_cpu
            samples.append((time.monotonic() - t0, rss_mb(pid), tick, cpu))
        await sender
        events = client.events if hasattr(client, "events") else []
        print(f"# session: {len(client.user_transcripts())} user turns, "
              f"{len(client.assistant_transcripts())} assistant turns, {len(client.errors)} errors, "
              f"{len(events)} events, closed {client.close_code}")
        await client.close()
    finally:
        server.stop()
    return 0 if report(samples, args.minutes) else 1


def fast_run(args: argparse.Namespace) -> int:
    """The loop of ``kame run --fast`` on a ``--minutes`` input, sampled per minute of audio."""
    import os

    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend
    from kame.frontend.runner import run_offline
    from kame.oracle.answer_text import encode_answer_text
    from kame.server.config import load_app_config

    cfg = load_app_config("cpu-demo")
    import torch

    models = load_frontend(cfg.frontend, torch.device("cpu"), cache_dir=cfg.cache_dir)
    core = EngineCore(models, cfg.frontend, batch_size=1)
    pcm = speech_audio(60 * args.minutes, 0)
    per_min = 750  # 80 ms frames in a minute
    samples: list[Sample] = []
    mark = [time.perf_counter(), time.process_time(), 0.0, 0.0]
    steps = [0]
    # Load-independent check: in minute 2 and in the last minute a fresh engine B is ticked right before each
    # tick of the long-running one (A), on the same frame; A's tick CPU over B's, within the same seconds.
    total = -(-pcm.size // FRAME_SIZE)
    windows = {"minute 2": range(per_min, 2 * per_min), "end": range(total - per_min, total)}
    fresh = EngineCore(load_frontend(cfg.frontend, torch.device("cpu"), cache_dir=cfg.cache_dir), cfg.frontend, batch_size=1)
    ab = {name: [0.0, 0.0] for name in windows}  # window -> [A's CPU, B's CPU]
    b_spent = [0.0, 0.0]  # B's wall and CPU so far: left out of A's per-minute samples
    a_started = [0.0]
    window_of = [None]

    def before_step(step: int, t_s: float) -> None:
        window_of[0] = next((name for name, r in windows.items() if step in r), None)
        if window_of[0] is not None:
            if step == windows[window_of[0]].start:
                fresh.attach(0)  # a new session on B
            frame = np.zeros(FRAME_SIZE, np.float32)
            chunk = pcm[step * FRAME_SIZE:(step + 1) * FRAME_SIZE]
            frame[: chunk.size] = chunk
            w0, c0 = time.perf_counter(), time.process_time()
            fresh.tick({0: frame})
            ab[window_of[0]][1] += time.process_time() - c0
            b_spent[0] += time.perf_counter() - w0
            b_spent[1] += time.process_time() - c0
        a_started[0] = time.process_time()

    def on_output(out: object) -> None:
        if window_of[0] is not None:
            ab[window_of[0]][0] += time.process_time() - a_started[0]
        steps[0] += 1
        if steps[0] % per_min == 0:  # one sample a minute of audio, inside the run: the mean step over it
            wall, cpu = time.perf_counter(), time.process_time()
            a_wall = wall - mark[0] - (b_spent[0] - mark[2])
            a_cpu = cpu - mark[1] - (b_spent[1] - mark[3])
            samples.append((steps[0] * FRAME_SIZE / SAMPLE_RATE, rss_mb(), a_wall / per_min, a_cpu / per_min))
            mark[:] = [wall, cpu, *b_spent]

    print(f"# long_call fast: {args.minutes:g} min of input through run_offline (kame run --fast), cpu-demo")
    t0 = time.monotonic()
    run_offline(core, pcm, encode_answer=lambda t: encode_answer_text(t, models.encode_text), seed=0, fast=True,
                before_step=before_step, on_output=on_output, keep=False)
    print(f"# wall {time.monotonic() - t0:.0f} s")
    ok = report(samples, args.minutes)
    ratios = {name: a / b for name, (a, b) in ab.items() if b > 0}
    print("# tick CPU of the long-running engine / a fresh one, interleaved: "
          + ", ".join(f"{name} {r:.3f}" for name, r in ratios.items()))
    if len(ratios) == 2:
        drift = ratios["end"] / ratios["minute 2"] - 1
        print(f"# end vs minute 2, load-independent: {100 * drift:+.1f} % (target <= {100 * TICK_SLACK:g} %): "
              f"{'MET' if drift <= TICK_SLACK else 'MISSED'}")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", choices=("realtime", "fast"), default="realtime")
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--every", type=float, default=10.0, help="Seconds between samples (realtime).")
    p.add_argument("--asr", default="whisper", help="asr.kind of the server (realtime).")
    p.add_argument("--port", type=int, default=None)
    args = p.parse_args()
    if args.mode == "fast":
        return fast_run(args)
    return asyncio.run(realtime_call(args))


if __name__ == "__main__":
    sys.exit(main())
