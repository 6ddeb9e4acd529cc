"""Prometheus metrics of Twilio calls (on the server's registry; labels are fixed words), beside
``kame_webrtc_calls_total``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class TwilioMetrics:
    """Calls by result, webhooks refused, keypad presses and barge-in clears."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.calls = Counter(
            "kame_twilio_calls",
            "Twilio media streams: answered, or refused (busy, bad_signature, unauthorized, no_start, bad_start, "
            "bad_params, refused: admission's reasons are in kame_sessions_rejected_total).",
            ["result"], registry=r)
        self.webhooks = Counter("kame_twilio_webhooks",
                                "POST /twilio/voice: connected (TwiML <Connect><Stream>), busy (<Reject reason=busy>), "
                                "bad_signature or unauthorized (403/401).", ["result"], registry=r)
        self.dtmf = Counter("kame_twilio_dtmf", "Keypad presses received (dtmf messages).", registry=r)
        self.clears = Counter("kame_twilio_clears", "clear messages sent (the caller talked over the assistant).",
                              registry=r)
        self.marks_played = Counter("kame_twilio_marks_played",
                                    "marks Twilio echoed: a response's audio played to its end (or cleared).", registry=r)
