"""Metrics that tell the two protocols apart, registered in the server's own registry.

The shared ``kame_sessions_*`` metrics keep their label sets (dashboards and
tests read them as they are); these add the per-protocol view. Labels take
bounded values only: protocol names and the fixed error codes of
docs/protocol.md (anything else is counted as ``other``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

PROTOCOLS = ("chat", "realtime", "live")
CLIENT_ERROR_CODES = frozenset(
    {
        "invalid_json",
        "binary_not_supported",
        "invalid_event",
        "unknown_event",
        "unsupported_event",
        "missing_required_parameter",
        "invalid_base64",
        "invalid_value",
        "unknown_parameter",
        "unsupported_audio_format",
        "unknown_backend",
        "recording_disabled",
        "input_audio_buffer_overflow",
        # /v1/live/sessions
        "session_not_started",
        "session_already_started",
        "unsupported_delegation",
        "unsupported_parameter",
        "immutable_parameter",
        "unknown_delegation",
        "content_too_long",
    }
)


class ProtocolMetrics:
    """Per-protocol session and input counters."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Counter(
            "kame_protocol_sessions", "Sessions started, by protocol (chat = /api/chat, realtime = /v1/realtime).",
            ["protocol"], registry=registry,
        )
        self.audio_dropped_s = Counter(
            "kame_audio_dropped_seconds",
            "Client audio dropped because it arrived too far ahead of real time.",
            ["protocol"],
            registry=registry,
        )
        self.client_errors = Counter(
            "kame_realtime_client_errors", "/v1/realtime and /v1/live/sessions client events answered with an error, by code.",
            ["code"],
            registry=registry,
        )
        self.answer_fifo_seconds = Histogram(
            "kame_answer_fifo_seconds",
            "A client's answer (Live session.commentary.append) from its message's arrival to its oracle sequence in "
            "the engine's FIFO.",
            ["protocol"],
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.08, 0.12, 0.25, 0.5),
            registry=registry,
        )
        for protocol in PROTOCOLS:  # export zeros from the start
            self.sessions.labels(protocol=protocol)
            self.audio_dropped_s.labels(protocol=protocol)

    def client_error(self, code: str) -> None:
        self.client_errors.labels(code=code if code in CLIENT_ERROR_CODES else "other").inc()
