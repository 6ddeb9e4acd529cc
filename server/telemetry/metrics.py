"""Prometheus metrics of one server instance (own registry: two apps in a process never mix).

Engine metrics come from ``EngineThread(on_tick=...)`` (engine thread;
prometheus_client is thread-safe), LLM/oracle/ASR metrics from the
sessions' pipeline events (:mod:`kame.session.events`), the rest from the
session code. Labels carry only bounded values (back-end names from the
config, fixed reasons), never session ids, text or URLs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kame.server.telemetry.threads import ThreadCpuCollector

if TYPE_CHECKING:  # both pull in torch; metrics must stay importable without it
    from kame.backend.speculation import ToolCallEvent
    from kame.backend.stats import BackendEvent
    from kame.frontend.engine_thread import TickStats
    from kame.session.events import PipelineEvent

CONTENT_TYPE = CONTENT_TYPE_LATEST

_STEP_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)
_LATE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.12, 0.16, 0.25, 0.5, 1.0, 2.0)
_LLM_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_ASR_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
_TOOL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: Label of every function a client defines (its names are unbounded; configured MCP tools keep theirs).
CLIENT_FUNCTION_LABEL = "client_function"


class ServerMetrics:
    """Every metric the server exports, in one :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        r.register(ThreadCpuCollector())
        self.sessions_active = Gauge("kame_sessions_active", "Sessions holding an engine slot now.", registry=r)
        self.sessions_max = Gauge("kame_sessions_max", "Session cap (engine slots).", registry=r)
        self.ready = Gauge("kame_ready", "1 once models are loaded and warmed up.", registry=r)
        self.draining = Gauge("kame_draining", "1 from SIGTERM on: no new sessions, live ones are drained.", registry=r)
        self.sessions_total = Counter("kame_sessions", "Sessions started.", registry=r)
        self.sessions_rejected = Counter(
            "kame_sessions_rejected",
            "Websockets refused (full, starting, draining, unauthorized, origin, bad_params).",
            ["reason"],
            registry=r,
        )
        self.sessions_ended = Counter(
            "kame_sessions_ended", "Sessions ended, by reason.", ["reason"], registry=r
        )
        self.session_seconds = Histogram(
            "kame_session_seconds",
            "Session length.",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600),
            registry=r,
        )
        self.first_reply_seconds = Histogram(
            "kame_first_reply_seconds",
            "From a session's connection to its first reply frame (a PersonaPlex session's system prompts "
            "come first: voice, silence, role, silence).",
            buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 4, 6, 8, 10, 15, 30),
            registry=r,
        )
        self.step_seconds = Histogram(
            "kame_step_seconds", "Duration of one engine tick (all slots stepped together).", buckets=_STEP_BUCKETS, registry=r
        )
        self.step_slots = Histogram(
            "kame_step_slots", "Slots stepped per engine tick.", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r
        )
        self.frame_lateness = Histogram(
            "kame_frame_lateness_seconds",
            "How late each output frame left against its 80 ms schedule (anchored at the session's first frame).",
            buckets=_LATE_BUCKETS,
            registry=r,
        )
        self.frames_dropped = Counter(
            "kame_frames_dropped",
            "Audio frames dropped: out = towards a slow client, in = client audio ahead of real time, "
            "engine = engine output queue full.",
            ["direction"],
            registry=r,
        )
        self.protocol_errors = Counter(
            "kame_protocol_errors", "Client messages that broke the protocol.", ["kind"], registry=r
        )
        self.gc_seconds = Histogram(
            "kame_gc_seconds",
            "Duration of the scheduled full garbage collections (server.gc_interval_s), which hold the GIL.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5),
            registry=r,
        )
        self.gc_collected = Counter(
            "kame_gc_collected_objects", "Unreachable objects found by the scheduled collections.", registry=r
        )
        self.llm_ttft = Histogram(
            "kame_llm_ttft_seconds", "LLM time to first token.", ["backend"], buckets=_LLM_BUCKETS, registry=r
        )
        self.llm_errors = Counter("kame_llm_errors", "LLM requests that failed.", ["backend"], registry=r)
        self.llm_tools_refused = Counter(
            "kame_llm_tools_refused",
            "Back-ends whose server refused function tools (HTTP 400, e.g. vLLM without --enable-auto-tool-choice); "
            "counted once per back-end and process, their requests go without tools from then on.",
            ["backend"],
            registry=r,
        )
        self.prompt_refreshes = Counter(
            "kame_prompt_refreshes",
            "PersonaPlex prompts (voice, persona) stepped again mid-call at a pause (frontend.refresh_prompts).",
            registry=r,
        )
        self.oracle_resets = Counter("kame_oracle_resets", "Oracle sequences started (new answers fed).", registry=r)
        self.oracle_tokens = Counter("kame_oracle_tokens", "Oracle tokens queued for the front-end.", registry=r)
        self.asr_partial_latency = Histogram(
            "kame_asr_partial_latency_seconds",
            "Delay of ASR partial transcripts behind the audio.",
            buckets=_ASR_BUCKETS,
            registry=r,
        )
        self.echo_guard = Counter(
            "kame_echo_guard_utterances",
            "Utterances the echo guard held back because the assistant had just spoken, by verdict: echo (they "
            "only repeated the assistant's words: no user turn, no barge-in) or user (released as the user's turn).",
            ["verdict"],
            registry=r,
        )

        self.tool_calls = Counter(
            "kame_tool_calls",
            "Tool calls executed, by tool (configured MCP tool names; client_function for client-defined ones) "
            "and outcome (ok, error, refused, timeout).",
            ["tool", "outcome"],
            registry=r,
        )
        self.tool_call_seconds = Histogram(
            "kame_tool_call_seconds", "Duration of executed tool calls.", ["tool"], buckets=_TOOL_BUCKETS, registry=r
        )

    # ------------------------------------------------------------------ feeds
    def on_tool_call(self, event: ToolCallEvent, *, tool: str) -> None:
        """A finished tool execution (``SpeculativeCalls`` observer); ``tool`` is a bounded label."""
        if event.kind != "finished":
            return
        self.tool_calls.labels(tool=_label(tool), outcome=event.outcome or "error").inc()
        if event.duration_s is not None and event.duration_s >= 0:
            self.tool_call_seconds.labels(tool=_label(tool)).observe(event.duration_s)

    def on_backend_event(self, event: BackendEvent) -> None:
        """A back-end registry observer: what concerns the process, not one session."""
        if event.kind == "tools_refused":
            self.llm_tools_refused.labels(backend=_label(event.backend)).inc()

    def on_tick(self, stats: TickStats) -> None:
        """``EngineThread(on_tick=...)`` callback (engine thread)."""
        self.step_seconds.observe(stats.duration_s)
        self.step_slots.observe(stats.slots)
        if stats.prompt_refreshes:
            self.prompt_refreshes.inc(stats.prompt_refreshes)

    def on_event(self, event: PipelineEvent) -> None:
        """Count what a session's pipeline reports."""
        from kame.session import events as pe

        if isinstance(event, pe.LlmFirstToken):
            self.llm_ttft.labels(backend=_label(event.backend)).observe(float(event.ttft_s))
        elif isinstance(event, pe.LlmError):
            self.llm_errors.labels(backend=_label(event.backend)).inc()
        elif isinstance(event, pe.OracleReset):
            self.oracle_resets.inc()
        elif isinstance(event, pe.OracleText):
            if event.tokens > 0:
                self.oracle_tokens.inc(event.tokens)
        elif isinstance(event, pe.UserPartial):
            if event.latency_s is not None and event.latency_s >= 0:
                self.asr_partial_latency.observe(float(event.latency_s))
        elif isinstance(event, pe.EchoJudged):
            self.echo_guard.labels(verdict="echo" if event.echo else "user").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _label(value: object) -> str:
    return value if isinstance(value, str) and value else "unknown"
