"""Run Pipecat's own GPT-Live service (``OpenAILiveLLMService``, pipecat-ai 1.14) against kame.

Not part of the test suite: it needs the full ``pipecat-ai[openai]==1.14.0`` with its dependencies,
which kame does not install. Run it from a separate virtual environment::

    python3 -m venv /tmp/pipecat-venv
    /tmp/pipecat-venv/bin/pip install 'pipecat-ai[openai]==1.14.0' soxr
    # everything started here: the scripted LLM (scripts/pipecat_live_llm.py) and kame's CPU model
    /tmp/pipecat-venv/bin/python scripts/pipecat_live_check.py --kame-python .venv/bin/python
    # or against a running kame whose default back-end can call get_weather:
    /tmp/pipecat-venv/bin/python scripts/pipecat_live_check.py --url ws://HOST:PORT/v1/live/sessions \
        --api-key "$KAME_AUTH_TOKEN" --llm-base-url http://HOST:PORT/v1 --llm-model MODEL --responses-model MODEL

Two pipelines run one after the other, each a real Pipecat ``PipelineWorker`` under a ``WorkerRunner``:
an audio source (espeak-ng questions as ``InputAudioRawFrame`` at 24 kHz, paced at real time, with
silence between), Pipecat's ``OpenAILiveLLMService`` pointed at kame by ``base_url``, and a sink that
records what comes out (audio, transcripts, function results). A subclass of the service copies each
server event Pipecat parsed into the record and changes nothing else.

- ``client``: ``ClientDelegation`` with a ``BackendLLMWorker`` running Pipecat's ``OpenAILLMService``
  on ``--llm-base-url``; prior conversation in the context (``session.start`` ``input``), a trailing
  developer message (Pipecat's opening commentary, ``delegation_id: null``), ``voice`` and ``store``
  set; two questions, each a delegation answered with a thinking and a commentary append that reach
  kame's oracle (``kame.oracle.reset``).
- ``responses``: ``ResponsesDelegation`` (``max_completion_tokens``, ``reasoning``, ``service_tier``
  set) with Pipecat-registered functions: kame's back-end calls ``get_weather``, Pipecat runs it on
  ``response.output_item.done`` and answers; the tools change mid-session (Pipecat's sparse
  ``session.update``); a second question makes two calls at once, one answered after its response
  has completed; each answer built on the outputs reaches kame's oracle (``kame.responses.answer``).

Prints one line per check (``PASS``/``FAIL name: detail``) and exits 1 when any failed. Every
pipeline error Pipecat reports (each kame ``error`` event becomes one) is a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    FunctionCallResultFrame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    LLMContextFrame,
    LLMSetToolsFrame,
    SpeechOutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.live import events
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService, OpenAIResponsesReasoningConfig
from pipecat.workers.llm.backend_llm_worker import BackendLLMWorker
from pipecat.workers.runner import WorkerRunner

RATE = 24000
CHUNK_S = 0.02


@dataclass
class Record:
    """What one run saw: Pipecat's frames and the server events behind them."""

    server_events: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    audio_out_bytes: int = 0
    user_transcripts: list[str] = field(default_factory=list)
    assistant_text: list[str] = field(default_factory=list)
    function_results: list[str] = field(default_factory=list)
    audio_in_s: float = 0.0
    session_started: asyncio.Event = field(default_factory=asyncio.Event)

    def types(self) -> list[str]:
        return [e.get("type", "") for e in self.server_events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.server_events if e.get("type") == kind]

    def inner(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.of("response.event") if (e.get("event") or {}).get("type") == kind]


class ObservedLiveService(OpenAILiveLLMService):
    """Pipecat's service, unchanged, with every parsed server event copied into a ``Record``."""

    def __init__(self, record: Record, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record

    async def _handle_server_event(self, evt: events.ServerEvent) -> None:
        self.record.server_events.append({**evt.model_dump(exclude_none=True), "_received": time.monotonic()})
        if isinstance(evt, events.SessionStartedEvent):
            self.record.session_started.set()
        await super()._handle_server_event(evt)


class WavSource(FrameProcessor):
    """Pushes a question (24 kHz PCM16) at real time once the session has started, then silence."""

    def __init__(self, record: Record, pcm: bytes, seconds: float) -> None:
        super().__init__()
        self.record = record
        self.pcm = pcm
        self.seconds = seconds
        self._task: asyncio.Task[None] | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame) and direction == FrameDirection.UPSTREAM:
            self.record.user_transcripts.append(frame.text)
        if isinstance(frame, ErrorFrame):
            self.record.errors.append(frame.error)
        if isinstance(frame, StartFrame):
            self._task = self.create_task(self._play())
        if isinstance(frame, (TranscriptionFrame, InterimTranscriptionFrame, ErrorFrame)) and direction == FrameDirection.UPSTREAM:
            return
        await self.push_frame(frame, direction)

    async def _play(self) -> None:
        await asyncio.wait_for(self.record.session_started.wait(), 15)
        step = int(RATE * CHUNK_S) * 2
        total = int(self.seconds * RATE) * 2
        pcm = self.pcm + b"\0" * max(0, total - len(self.pcm))
        start = time.monotonic()
        for n, offset in enumerate(range(0, len(pcm), step)):
            await self.push_frame(InputAudioRawFrame(audio=pcm[offset:offset + step], sample_rate=RATE, num_channels=1))
            self.record.audio_in_s += CHUNK_S
            delay = start + (n + 1) * CHUNK_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)


class Sink(FrameProcessor):
    """Records what the service sends downstream."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SpeechOutputAudioRawFrame):
            self.record.audio_out_bytes += len(frame.audio)
            return
        if isinstance(frame, TTSTextFrame):
            self.record.assistant_text.append(frame.text)
        if isinstance(frame, FunctionCallResultFrame):
            self.record.function_results.append(json.dumps(frame.result))
        await self.push_frame(frame, direction)


def pcm_silence(seconds: float) -> bytes:
    return b"\0" * (int(seconds * RATE) * 2)


def espeak(text: str) -> bytes:
    """The question as 24 kHz mono PCM16 (espeak-ng writes 22.05 kHz; soxr, which Pipecat uses, resamples)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "q.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
        with wave.open(str(path)) as w:
            rate, raw = w.getframerate(), w.readframes(w.getnframes())
    import numpy as np
    import soxr

    samples = np.frombuffer(raw, dtype=np.int16).astype(np.float32) / 32768.0
    out = soxr.resample(samples, rate, RATE)
    return (np.clip(out, -1, 1) * 32767).astype(np.int16).tobytes()


async def run_pipeline(service: ObservedLiveService, record: Record, pcm: bytes, seconds: float,
                       context: LLMContext, wait_s: float,
                       later: list[tuple[float, Callable[[], Any], Frame]] | None = None) -> None:
    source, sink = WavSource(record, pcm, seconds), Sink(record)
    worker = PipelineWorker(Pipeline([source, service, sink]), idle_timeout_secs=None, enable_rtvi=False)

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker: Any, frame: ErrorFrame) -> None:
        record.errors.append(frame.error)

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await worker.queue_frame(LLMContextFrame(context))

    async def finish() -> None:
        await asyncio.wait_for(record.session_started.wait(), 15)
        started = time.monotonic()
        for at, before, frame in later or []:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            before()  # what Pipecat's context aggregator does with the tools before the frame reaches the service
            await worker.queue_frame(frame)
        await asyncio.sleep(max(0.0, started + wait_s - time.monotonic()))
        await worker.queue_frame(EndFrame())

    ender = asyncio.create_task(finish())
    await asyncio.wait_for(runner.run(), wait_s + 40)
    await ender


KAME_CONFIG = """
device: cpu
frontend:
  checkpoint: "tiny:0"
asr:
  kind: whisper
  device: cpu
backends:
  llm:
    base_url: "{base_url}"
    model: test-model
    api_key_env: ""
    allow_tools: true
default_backend: llm
server:
  max_sessions: 2
  idle_timeout_s: 20
"""


@contextlib.contextmanager
def started_kame(args: argparse.Namespace) -> Iterator[None]:
    """The scripted LLM and ``kame serve`` (tiny CPU model, Whisper ASR) on free ports, stopped after."""
    root = Path(__file__).resolve().parent.parent
    kame_python = str(args.kame_python.absolute())
    with tempfile.TemporaryDirectory() as tmp:
        llm = subprocess.Popen([kame_python, str(root / "scripts" / "pipecat_live_llm.py")],
                               stdout=subprocess.PIPE, text=True)
        kame: subprocess.Popen[bytes] | None = None
        try:
            assert llm.stdout is not None
            base_url = llm.stdout.readline().strip()
            if not base_url.startswith("http"):
                raise RuntimeError("the scripted LLM did not start")
            config = Path(tmp) / "kame.yaml"
            config.write_text(KAME_CONFIG.replace("{base_url}", base_url))
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            token = "pipecat-check"
            env = {k: v for k, v in os.environ.items() if not k.startswith("KAME_")}
            env.update({"KAME_AUTH_TOKEN": token, "NO_TORCH_COMPILE": "1"})
            log = open(Path(tmp) / "kame.log", "wb")  # noqa: SIM115
            kame = subprocess.Popen([str(Path(kame_python).parent / "kame"), "serve", "--config", str(config), "--port", str(port)],
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                        if resp.status == 200 and json.loads(resp.read()).get("status") == "ok":
                            break
                except OSError:
                    pass
                if kame.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("kame did not become ready:\n" + (Path(tmp) / "kame.log").read_text()[-3000:])
                time.sleep(0.5)
            args.url, args.api_key = f"ws://127.0.0.1:{port}/v1/live/sessions", token
            args.llm_base_url, args.llm_model, args.responses_model = base_url, "pipecat-backend", "test-model"
            yield
        finally:
            for proc in (kame, llm):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()


def check(results: list[bool], name: str, ok: bool, detail: str) -> None:
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


async def client_mode(args: argparse.Namespace, pcm: bytes, results: list[bool]) -> None:
    record = Record()
    backend = BackendLLMWorker(
        llm=OpenAILLMService(api_key=args.llm_api_key, base_url=args.llm_base_url,
                             settings=OpenAILLMService.Settings(model=args.llm_model)),
        context=LLMContext([{"role": "system", "content": "Answer the user's question briefly."}]),
    )
    service = ObservedLiveService(
        record, api_key=args.api_key, base_url=args.url,
        settings=OpenAILiveLLMService.Settings(system_instruction="You are a helpful voice assistant.", store=False,
                                               voice="marin"),
        delegation=OpenAILiveLLMService.ClientDelegation(backend=backend, timeout_secs=30),
    )
    # Prior conversation (sent as session.start ``input``) and a trailing developer message, which
    # Pipecat turns into an opening commentary with ``delegation_id: null`` once the session starts.
    context = LLMContext([
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "developer", "content": "Hello! Ask me anything."},
    ])
    await run_pipeline(service, record, pcm + pcm_silence(args.gap) + pcm, 2 * args.seconds + args.gap,
                       context, 2 * args.seconds + args.gap + 6)
    dump(args, record, "client")
    report(record, "client", results)
    commentary = record.of("session.commentary.appended")
    check(results, "client.delegation", bool(record.of("session.delegation.created")),
          f"{len(record.of('session.delegation.created'))} delegation(s)")
    check(results, "client.commentary", bool(commentary), f"{len(commentary)} commentary appended")
    resets = record.of("kame.oracle.reset")
    check(results, "client.oracle", bool(resets), f"{len(resets)} kame.oracle.reset")
    delegations = record.of("session.delegation.created")
    check(results, "client.second_question", len(delegations) >= 2 and len(commentary) >= 3,
          f"{len(delegations)} delegations, {len(commentary)} commentaries (opening included)")
    thinking = record.of("session.thinking.appended")
    check(results, "client.thinking", bool(thinking), f"{len(thinking)} thinking appended (the back-end's notes)")


async def responses_mode(args: argparse.Namespace, pcm: bytes, second: bytes, results: list[bool]) -> None:
    record = Record()
    calls: list[dict[str, Any]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        await params.result_callback({"sky": "sunny", "temp_c": 21})

    tools = ToolsSchema(standard_tools=[FunctionSchema(
        name="get_weather", description="Current weather of a city.",
        properties={"city": {"type": "string"}}, required=["city"])])
    service = ObservedLiveService(
        record, api_key=args.api_key, base_url=args.url,
        settings=OpenAILiveLLMService.Settings(system_instruction="You are a helpful voice assistant.", store=False),
        delegation=OpenAILiveLLMService.ResponsesDelegation(
            settings=OpenAIResponsesLLMService.Settings(
                model=args.responses_model, system_instruction="Use get_weather for weather.",
                max_completion_tokens=300, reasoning=OpenAIResponsesReasoningConfig(effort="low", summary="auto")),
            service_tier="auto"),
    )
    async def get_time(params: FunctionCallParams) -> None:
        calls.append({"get_time": dict(params.arguments)})
        await asyncio.sleep(1.5)  # answered well after the response has completed
        await params.result_callback({"time": "noon"})

    service.register_function("get_weather", get_weather)
    service.register_function("get_time", get_time)
    context = LLMContext([{"role": "system", "content": "You are a helpful voice assistant."}], tools=tools)
    more_tools = ToolsSchema(standard_tools=[*tools.standard_tools, FunctionSchema(
        name="get_time", description="The local time of a city.",
        properties={"city": {"type": "string"}}, required=["city"])])
    # Pipecat sends a sparse session.update (only delegation.responses.tools) when the tools change.
    # Two questions in one session: the second one (after the tools update) needs both functions.
    audio = pcm + pcm_silence(args.seconds - len(pcm) / 2 / RATE) + second
    await run_pipeline(service, record, audio, 2 * args.seconds, context, 2 * args.seconds + 8,
                       later=[(1.0, lambda: context.set_tools(more_tools), LLMSetToolsFrame(tools=more_tools))])
    dump(args, record, "responses")
    report(record, "responses", results)
    delegations = record.of("session.delegation.created")
    check(results, "responses.delegation", any((d.get("delegation") or {}).get("target") == "responses" for d in delegations),
          f"{len(delegations)} delegation(s)")
    check(results, "responses.function", bool(calls), f"functions ran {len(calls)} time(s): {calls}")
    check(results, "responses.second_question", len(delegations) >= 2 and any("get_time" in c for c in calls),
          f"{len(delegations)} delegations; get_time ran: {any('get_time' in c for c in calls)}")
    completed = record.inner("response.completed")
    check(results, "responses.completed", len(completed) >= 4, f"{len(completed)} response.completed")
    bad = record.inner("response.failed") + record.inner("response.incomplete")
    check(results, "responses.no_failed", not bad, f"{len(bad)} failed/incomplete responses")
    # In Responses delegation kame reports each round's text that reached Moshi as kame.responses.answer
    # (kame.oracle.reset is only for its own speculative guesses there).
    answers = [a for a in record.of("kame.responses.answer") if a.get("after_tools") and a.get("standing") != "superseded"]
    check(results, "responses.oracle", len(answers) >= 2,
          f"{len(answers)} answers built on the functions' outputs reached Moshi: {[a.get('text') for a in answers]}")
    updated = record.of("session.updated")
    names = [t.get("name") for t in ((((updated[-1].get("session") or {}).get("delegation") or {}).get("responses") or {})
                                     .get("tools") or [])] if updated else []
    check(results, "responses.tools_update", names == ["get_weather", "get_time"], f"session.updated tools {names}")


def dump(args: argparse.Namespace, record: Record, mode: str) -> None:
    if args.dump is None:
        return
    with open(args.dump, "a") as f:
        for e in record.server_events:
            if e.get("type") == "session.output_audio.delta":
                continue
            f.write(json.dumps({"mode": mode, **e}) + "\n")


def report(record: Record, mode: str, results: list[bool]) -> None:
    types = record.types()
    closed = record.of("session.closed")
    check(results, f"{mode}.started", bool(record.of("session.started")), "session.started")
    check(results, f"{mode}.errors", not record.errors, f"{len(record.errors)} pipeline error(s) {record.errors[:5]}")
    seconds = record.audio_out_bytes / 2 / RATE
    check(results, f"{mode}.audio_out", seconds > 0.5 * record.audio_in_s,
          f"{seconds:.1f} s of output audio for {record.audio_in_s:.1f} s in")
    # Pipecat ends a user turn after 0.8 s without a transcript delta: each question must stay one turn.
    check(results, f"{mode}.user_turns", len(record.user_transcripts) == 2,
          f"Pipecat's user turns (TranscriptionFrame) for 2 questions: {record.user_transcripts!r}")
    check(results, f"{mode}.output_transcript", bool(record.assistant_text),
          f"{len(record.assistant_text)} assistant text frames")
    check(results, f"{mode}.closed", bool(closed) and closed[-1].get("reason") == "close_requested",
          f"session.closed {[c.get('reason') for c in closed]}")
    kinds = sorted(set(types))
    logger.info(f"{mode}: server event types {kinds}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="ws://HOST:PORT/v1/live/sessions of a running kame")
    parser.add_argument("--kame-python", type=Path,
                        help="kame's Python (e.g. .venv/bin/python): start the scripted LLM and kame here instead")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--llm-base-url", help="OpenAI-compatible server for the client-delegation back-end")
    parser.add_argument("--llm-model", default="pipecat-backend")
    parser.add_argument("--llm-api-key", default="none")
    parser.add_argument("--responses-model", default="test-model", help="delegation.responses.model")
    parser.add_argument("--question", default="What is the capital of France?")
    parser.add_argument("--weather-question", default="What is the weather in Paris?")
    parser.add_argument("--seconds", type=float, default=7.0, help="audio sent: the question, then silence")
    parser.add_argument("--both-question", default="What is the weather and the time in Paris?")
    parser.add_argument("--gap", type=float, default=1.0, help="silence between the two client-mode questions")
    parser.add_argument("--mode", choices=["client", "responses", "both"], default="both")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--dump", type=Path, help="write each run's server events (audio elided) as JSON lines here")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="DEBUG" if args.verbose else "WARNING")
    results: list[bool] = []
    with contextlib.ExitStack() as stack:
        if args.kame_python is not None:
            stack.enter_context(started_kame(args))
        elif not args.url:
            parser.error("give --url (a running kame) or --kame-python (start one)")
        await run_modes(args, parser, results)
    print(f"{sum(results)}/{len(results)} checks passed", flush=True)
    return 0 if all(results) else 1


async def run_modes(args: argparse.Namespace, parser: argparse.ArgumentParser, results: list[bool]) -> None:
    if args.mode in ("client", "both"):
        if not args.llm_base_url:
            parser.error("--llm-base-url is needed for client delegation")
        await client_mode(args, espeak(args.question), results)
    if args.mode in ("responses", "both"):
        await responses_mode(args, espeak(args.weather_question), espeak(args.both_question), results)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
