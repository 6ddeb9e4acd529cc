"""Prometheus metrics of SIP calls (beside ``kame_webrtc_calls_total``; labels are fixed words)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class SipMetrics:
    """Calls by outcome, webhook deliveries, DTMF, and restarts of the SIP child."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.calls = Counter("kame_sip_calls", "SIP calls answered (result=answered) or refused (the reason: busy, "
                             "forbidden, rejected, timeout, draining, ...).", ["result"], registry=r)
        self.webhooks = Counter("kame_sip_webhooks", "Webhook deliveries (result=delivered, failed, gave_up).",
                                ["result"], registry=r)
        self.dtmf = Counter("kame_sip_dtmf", "DTMF keypresses (direction=in from the phone, out to it).",
                            ["direction"], registry=r)
        self.refers = Counter("kame_sip_refers", "Transfers asked for (SIP REFER), by final result.", ["result"],
                              registry=r)
        self.restarts = Counter("kame_sip_stack_restarts", "Times the SIP child process was restarted after exiting.",
                                registry=r)
