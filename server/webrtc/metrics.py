"""Prometheus metrics of WebRTC calls (on the server's registry; labels are fixed words)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_CONNECT_BUCKETS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_JITTER_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)


class WebRtcMetrics:
    """Calls, connection set-up, and the audio clocks' concealment, loss and jitter."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.calls = Counter("kame_webrtc_calls", "WebRTC call offers answered (result=answered) or refused (the reason).",
                             ["result"], registry=r)
        self.connect_seconds = Histogram("kame_webrtc_connect_seconds", "From the answer to ICE and DTLS connected.",
                                         buckets=_CONNECT_BUCKETS, registry=r)
        self.input_concealed_s = Counter(
            "kame_webrtc_input_concealed_seconds",
            "Input audio the server's clock filled (lost, late or never sent packets: DTX, a muted track).", registry=r)
        self.input_late_s = Counter("kame_webrtc_input_late_seconds",
                                    "Input audio dropped because it arrived after its time had been played.", registry=r)
        self.input_resyncs = Counter("kame_webrtc_input_resyncs", "Input timelines re-anchored (a sender clock jump).",
                                     registry=r)
        self.packets_lost = Counter("kame_webrtc_packets_lost", "RTP packets the peers lost (RTCP/receiver statistics).",
                                    ["direction"], registry=r)
        self.jitter_seconds = Histogram("kame_webrtc_jitter_seconds", "Inbound RTP interarrival jitter, sampled.",
                                        buckets=_JITTER_BUCKETS, registry=r)
        self.output_underruns = Counter("kame_webrtc_output_underruns",
                                        "Output RTP frames that found no audio waiting (silence was sent).", registry=r)
        self.output_cleared_s = Counter("kame_webrtc_output_cleared_seconds",
                                        "Output audio dropped by output_audio_buffer.clear.", registry=r)
