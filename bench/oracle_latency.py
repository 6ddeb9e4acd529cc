"""Oracle loop latency: how fast user words become LLM requests, and LLM words oracle tokens.

Prints, measured in one run against a real OpenAI-compatible server on
127.0.0.1 (the test server) through the real ``openai`` client:
  * ASR partial handed to the loop -> the LLM request arriving at the server
    (p50/p99; target p99 <= 10 ms);
  * the LLM's first complete word leaving the server -> its tokens queued for
    the engine (p50/p99; target p99 <= 10 ms), so the oracle trails the LLM by
    at most one 80 ms frame;
  * how many requests a 10 s utterance triggers under the default policy
    (pure debounce on a simulated ASR: a partial every 0.2 s, 2.5 words/s).

    .venv/bin/python bench/oracle_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support

from kame.backend.registry import BackendRegistry  # noqa: E402
from kame.config import KameConfig  # noqa: E402
from kame.oracle.config import OracleConfig  # noqa: E402
from kame.oracle.debounce import Debouncer  # noqa: E402
from kame.oracle.loop import OracleLoop  # noqa: E402
from kame.versions import versions_line  # noqa: E402
from tests.support.llm_server import Reply, running_llm_server  # noqa: E402


class TimedSink:
    def __init__(self) -> None:
        self.reset_at: list[float] = []

    def oracle_reset(self, ids: list[int]) -> None:
        self.reset_at.append(time.monotonic())

    def oracle_push(self, ids: list[int]) -> None:
        pass

    def oracle_clear(self) -> None:
        pass


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def measure(base_url: str, server, trials: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    cfg = KameConfig.model_validate({"backends": {"b": {"base_url": base_url, "model": "m", "api_key_env": ""}}})
    reg = BackendRegistry.from_config(cfg, {})
    to_request, to_tokens = [], []
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    for i in range(trials):
        sink = TimedSink()
        loop = OracleLoop(config=OracleConfig(), registry=reg, sink=sink, encode=lambda t: [ord(c) % 100 for c in t],
                          piece_of=None, emit=lambda k, d: None)
        n_before = len(server.chat_requests())
        t_call = time.monotonic()
        loop.on_user_final(f"question number {i} please")
        while len(server.chat_requests()) == n_before:
            await asyncio.sleep(0.0005)
        rec = server.chat_requests()[-1]
        to_request.append(rec.received_at - t_call)
        while not sink.reset_at:
            await asyncio.sleep(0.0005)
        # The first word is complete (settled) once the second word's chunk arrives.
        to_tokens.append(sink.reset_at[0] - rec.chunk_sent_at[1])
        await loop.aclose()
    await reg.aclose()
    del words
    return to_request, to_tokens


def requests_per_utterance(seconds: float = 10.0, words_per_s: float = 2.5, partial_every_s: float = 0.2) -> int:
    deb = Debouncer.from_config(OracleConfig())
    starts = 0
    t = 0.0
    pending_retry: float | None = None
    while t <= seconds:
        if pending_retry is not None and t >= pending_retry:
            trig = deb.poll(t)
            starts += trig.start
            pending_retry = trig.retry_at if trig.pending else None
        n = int(t * words_per_s)
        if n:
            trig = deb.on_partial(t, 1, " ".join(f"w{i}" for i in range(n)))
            starts += trig.start
            pending_retry = trig.retry_at if trig.pending else pending_retry
        t = round(t + partial_every_s, 6)
    starts += deb.on_final(seconds + 0.7, 1, " ".join(f"w{i}" for i in range(int(seconds * words_per_s)))).start
    return starts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    trials = 20 if args.quick else 100
    print(f"# oracle_latency: {versions_line()}")
    with running_llm_server() as server:
        server.set_default(Reply(text="Paris is the capital of France.", first_token_delay_s=0.02, chunk_delay_s=0.03))
        to_request, to_tokens = asyncio.run(measure(server.base_url, server, trials))
    for name, vals in (("ASR partial -> LLM request at the server", to_request),
                       ("LLM first complete word -> tokens queued", to_tokens)):
        print(f"{name}: p50 {statistics.median(vals) * 1e3:.2f} ms, p99 {pct(vals, 0.99) * 1e3:.2f} ms "
              f"(n={len(vals)}, target p99 <= 10 ms)")
    print(f"requests triggered by a 10 s utterance (default policy): {requests_per_utterance()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
