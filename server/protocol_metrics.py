"""Metrics that tell the two protocols apart, registered in the server's own registry.

The shared ``kame_sessions_*`` metrics keep their label sets (dashboards and
tests read them as they are); these add the per-protocol view. Labels take
bounded values only: protocol names and the fixed error codes of
docs/protocol.md (anything else is counted as ``other``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

PROTOCOLS = ("chat", "realtime")
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
            "kame_realtime_client_errors", "/v1/realtime client events answered with an error, by code.", ["code"],
            registry=registry,
        )
        for protocol in PROTOCOLS:  # export zeros from the start
            self.sessions.labels(protocol=protocol)
            self.audio_dropped_s.labels(protocol=protocol)

    def client_error(self, code: str) -> None:
        self.client_errors.labels(code=code if code in CLIENT_ERROR_CODES else "other").inc()
