"""Tools bench: how fast an answer built on a tool reaches Moshi, and how often tools finish before the user does.

Prints, measured against the real local OpenAI-compatible server (tests/support/llm_server.py,
streaming ``tool_calls`` in the chat-completions format) through the real ``openai``
client, with the real oracle loop, tool loop and speculation:

1. **Tool result -> first oracle token** of the answer built on it, minus the LLM's
   own time to first token of that request (server side: request received -> first
   chunk written), p50/p99 over N turns. Target: p99 <= 20 ms.
2. **Tool results ready before the end of the user's turn**, for 10 spoken questions
   (espeak-ng, 3-6 s each) fed at real time through the configured streaming ASR
   (Whisper tiny.en on CPU), with an LLM that answers in 300 ms and calls a read-only
   tool as soon as the question's subject has been heard (the subject word is in the
   transcript it is sent), and a tool that takes 500 ms. KAME (requests on partial
   transcripts, read-only calls shared by the requests that supersede each other)
   against a cascade (one request once the turn is over). Target: at least half.

    .venv/bin/python bench/tools.py [--quick] [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support

from kame.backend.registry import BackendRegistry  # noqa: E402
from kame.backend.tool_loop import ToolLoopLimits  # noqa: E402
from kame.backend.tools import ToolCall, ToolResult, ToolSpec  # noqa: E402
from kame.config import KameConfig  # noqa: E402
from kame.oracle.config import OracleConfig  # noqa: E402
from kame.oracle.loop import OracleLoop  # noqa: E402
from kame.oracle.session_tools import SessionTools  # noqa: E402
from kame.versions import versions_line  # noqa: E402
from tests.support.llm_server import RecordedRequest, Reply, ToolCallScript, running_llm_server  # noqa: E402
from tests.support.speech import RATE, synthesize, word_end_times  # noqa: E402

LOOKUP = ToolSpec(
    "lookup",
    "Look up facts about a subject (a city, a company, a person).",
    {"type": "object", "properties": {"subject": {"type": "string"}}, "required": ["subject"]},
    read_only=True,
)

#: (question, its subject: the LLM calls the tool once this word is in the transcript)
QUESTIONS: list[tuple[str, str]] = [
    ("What will the weather be like in Tokyo tomorrow morning, and should I bring an umbrella with me?", "tokyo"),
    ("How many people live in Berlin these days, and is the city still growing every year?", "berlin"),
    ("What is the price of Apple shares right now, and did it go up or down since last week?", "apple"),
    ("What time is it right now in Sydney, and is it too late to call my friend there?", "sydney"),
    ("Is the big museum in Rome open on Tuesdays, or should I plan my visit for another day?", "rome"),
    ("How long does the train from London take to reach Edinburgh on a normal weekday?", "london"),
    ("When does the next flight to Madrid leave this evening, and is there still a seat free?", "madrid"),
    ("What is the dollar worth in euros today, and is it a good moment to change money?", "dollar"),
    ("Who won the football match in Manchester last night, and what was the final score?", "manchester"),
    ("How tall is the highest tower in Chicago, and in which year did they finish building it?", "chicago"),
]


class Sink:
    def __init__(self) -> None:
        self.resets: list[float] = []

    def oracle_reset(self, ids: list[int]) -> None:
        self.resets.append(time.monotonic())

    def oracle_push(self, ids: list[int]) -> None:
        pass

    def oracle_clear(self) -> None:
        pass


class TimedTool:
    """A read-only tool taking ``delay_s``; stamps when each result is ready."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.ready_at: list[float] = []
        self.calls: list[str] = []

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        self.calls.append(call.arguments)
        await asyncio.sleep(self.delay_s)
        self.ready_at.append(time.monotonic())
        return ToolResult(call.id, call.name, "ok", "the answer is forty two")


def registry(base_url: str) -> BackendRegistry:
    cfg = KameConfig.model_validate({"backends": {"llm": {
        "base_url": base_url, "model": "m", "api_key_env": "", "allow_tools": True, "breaker": {"enabled": False},
        "timeouts": {"first_token_s": 10, "total_s": 30}}}})
    return BackendRegistry.from_config(cfg, {})


def encode(text: str) -> list[int]:
    return [ord(c) % 100 + 4 for c in text]


def make_loop(reg: BackendRegistry, tool: TimedTool, sink: Sink, oracle: OracleConfig,
              events: list[tuple[float, str, dict[str, Any]]]) -> OracleLoop:
    tools = SessionTools.create(ToolLoopLimits(call_timeout_s=5.0))
    tools.routes.set("bench", [LOOKUP], tool)
    return OracleLoop(config=oracle, registry=reg, sink=sink, encode=encode, piece_of=None,
                      emit=lambda e: events.append((time.monotonic(), e.name, e.fields())), tools=tools)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


# ---------------------------------------------------------------------- 1. result -> first oracle token


def _lookup_llm(rec: RecordedRequest) -> Reply:
    if rec.tool_messages:
        return Reply(text="The answer is forty two, as far as I know.", first_token_delay_s=0.1)
    return Reply(text="Let me check.", tool_calls=[ToolCallScript("lookup", {"subject": "x"})])


def _serve(conn: Any) -> None:
    """Child process: the LLM server (its own process, like a real one: no GIL shared with kame)."""
    with running_llm_server() as server:
        server.responder = _lookup_llm
        conn.send(server.base_url)
        conn.recv()  # "dump"
        conn.send([(r.received_at, r.first_chunk_at) for r in server.chat_requests()])


async def result_to_oracle(turns: int) -> dict[str, float]:
    import multiprocessing as mp

    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_serve, args=(child,), daemon=True)
    proc.start()
    base_url = parent.recv()
    overheads: list[float] = []
    to_request: list[float] = []
    from_chunk: list[float] = []
    stamps: list[tuple[float, float]] = []  # (tool result ready, second sequence reset), per turn
    reg = registry(base_url)
    try:
        for i in range(-3, turns):  # three warm-up turns, not counted
            if i == 0:
                gc.collect()
                gc.freeze()  # as the server does once its models are loaded (server/host.py)
            tool = TimedTool(0.05)
            sink = Sink()
            events: list[tuple[float, str, dict[str, Any]]] = []
            loop = make_loop(reg, tool, sink, OracleConfig(), events)
            loop.on_user_final(f"question number {i}, what is the answer?")
            deadline = time.monotonic() + 10
            while len(sink.resets) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.002)
            await loop.aclose()
            if i >= 0 and len(sink.resets) == 2 and len(tool.ready_at) == 1:
                stamps.append((tool.ready_at[0], sink.resets[1]))
    finally:
        await reg.aclose()
        parent.send("dump")
        records = parent.recv()
        proc.join(10)
    # CLOCK_MONOTONIC is one clock for every process of the machine: server stamps compare with ours.
    for ready, reset in stamps:
        second = next(r for r in records if r[0] >= ready)  # the request made after this result
        if second[1] is None:
            continue
        ttft = second[1] - second[0]
        overheads.append((reset - ready) - ttft)
        to_request.append(second[0] - ready)
        from_chunk.append(reset - second[1])
    return {"n": len(overheads), "p50_ms": 1000 * statistics.median(overheads), "p99_ms": 1000 * pct(overheads, 99),
            "max_ms": 1000 * max(overheads),
            "req_p50_ms": 1000 * statistics.median(to_request), "req_p99_ms": 1000 * pct(to_request, 99),
            "chunk_p50_ms": 1000 * statistics.median(from_chunk), "chunk_p99_ms": 1000 * pct(from_chunk, 99)}


# ---------------------------------------------------------------------- 2. tools ready before the end of the turn


@dataclass
class TurnResult:
    question: str
    speech_end_s: float  #: end of the last word, from the start of the audio
    ready_s: float | None  #: first tool result ready, same clock (None: never called)
    requests: int
    executions: int  #: real tool executions (requests that superseded each other share one)


def subject_llm(subjects: list[str]) -> Any:
    def llm(rec: RecordedRequest) -> Reply:
        if rec.tool_messages:
            return Reply(text="Here is what I found, the answer is forty two.", first_token_delay_s=0.3)
        heard = (rec.last_user_message or "").lower()
        subject = next((s for s in subjects if s in heard), None)
        if subject is not None and "lookup" in rec.tool_names:
            return Reply(text="", first_token_delay_s=0.3, tool_calls=[ToolCallScript("lookup", {"subject": subject})])
        return Reply(text="Let me think about that for a second.", first_token_delay_s=0.3)
    return llm


async def spoken_turn(recognizer: Any, reg: BackendRegistry, question: str, oracle: OracleConfig) -> TurnResult:
    from kame.asr import EventType

    pcm = synthesize(question)
    ends = word_end_times(question)
    lead = np.zeros(int(0.3 * RATE), np.float32)
    trail = np.zeros(int(2.0 * RATE), np.float32)
    audio = np.concatenate([lead, pcm, trail])
    speech_end_s = 0.3 + ends[-1]
    tool = TimedTool(0.5)
    sink = Sink()
    events: list[tuple[float, str, dict[str, Any]]] = []
    loop = make_loop(reg, tool, sink, oracle, events)
    stream = recognizer.open_stream()

    async def consume() -> None:
        async for ev in stream.events():
            if ev.type is EventType.PARTIAL:
                loop.on_user_partial(ev.text)
            elif ev.type is EventType.FINAL:
                loop.on_user_final(ev.text)

    consumer = asyncio.create_task(consume())
    frame = 1920
    start = time.monotonic()
    for i in range(0, len(audio), frame):
        stream.feed(audio[i:i + frame])
        await asyncio.sleep(max(0.0, start + (i + frame) / RATE - time.monotonic()))
    await stream.aclose(flush=True)
    await consumer
    deadline = time.monotonic() + 5
    while not tool.ready_at and tool.calls and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await loop.aclose()
    ready = tool.ready_at[0] - start if tool.ready_at else None
    return TurnResult(question, speech_end_s, ready, sum(1 for _, k, _ in events if k == "llm.request_started"),
                      len(tool.calls))


async def spoken(quick: bool) -> dict[str, Any]:
    from kame.asr.factory import create_recognizer

    cfg = KameConfig.model_validate({"asr": {"kind": "whisper"}})
    recognizer = create_recognizer(cfg.asr)
    assert recognizer is not None
    questions = QUESTIONS[:3] if quick else QUESTIONS
    out: dict[str, Any] = {}
    try:
        with running_llm_server() as server:
            server.responder = subject_llm([s for _, s in QUESTIONS])
            reg = registry(server.base_url)
            for mode, oracle in (
                ("kame", OracleConfig()),
                # the cascade: a request only once the turn is over (no word count ever triggers one)
                ("cascade", OracleConfig(min_new_words=10_000)),
            ):
                results = [await spoken_turn(recognizer, reg, q, oracle) for q, _ in questions]
                before = sum(1 for r in results if r.ready_s is not None and r.ready_s <= r.speech_end_s)
                out[mode] = {"before_end": before, "of": len(results), "turns": results}
            await reg.aclose()
    finally:
        recognizer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer turns and 3 spoken questions")
    ap.add_argument("--turns", type=int, default=None, help="turns for the result -> oracle latency (default 100)")
    ap.add_argument("--skip-speech", action="store_true", help="only the latency part")
    args = ap.parse_args(argv)
    print(versions_line())
    turns = args.turns or (20 if args.quick else 100)
    lat = asyncio.run(result_to_oracle(turns))
    print(f"tool result -> first oracle token, beyond the LLM's own TTFT ({lat['n']} turns): "
          f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms "
          f"(target p99 <= 20 ms: {'met' if lat['p99_ms'] <= 20 else 'NOT met'})")
    print(f"    of which: result -> the next request at the server p50 {lat['req_p50_ms']:.1f} / p99 "
          f"{lat['req_p99_ms']:.1f} ms; first chunk sent -> oracle reset p50 {lat['chunk_p50_ms']:.1f} / p99 "
          f"{lat['chunk_p99_ms']:.1f} ms")
    if args.skip_speech:
        return 0
    res = asyncio.run(spoken(args.quick))
    for mode in ("kame", "cascade"):
        r = res[mode]
        print(f"{mode:8s}: tool results ready before the end of the user's turn: {r['before_end']}/{r['of']}")
        for t in r["turns"]:
            ready = "never called" if t.ready_s is None else f"ready at {t.ready_s:.2f} s ({t.ready_s - t.speech_end_s:+.2f} s)"
            print(f"    speech ends {t.speech_end_s:.2f} s, {ready}, {t.requests} requests, "
                  f"{t.executions} tool execution(s)  | {t.question}")
    k = res["kame"]
    print(f"target (at least half before the end, cascade 0): "
          f"{'met' if 2 * k['before_end'] >= k['of'] and res['cascade']['before_end'] == 0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
