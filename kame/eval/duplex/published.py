"""Full-Duplex-Bench v1's published figures (its paper and the PersonaPlex report), shown only beside
runs on the benchmark's released data: kame's generated set is another data set."""

from __future__ import annotations

SOURCE = ("Full-Duplex-Bench v1 (Lin et al., 2025, arXiv 2503.04721) and its later published rows; "
          "released data, NeMo/CrisperWhisper word times, the benchmark's own clients")

#: system -> pause TOR (synthetic, Candor), turn-taking (TOR, latency s), interruption (TOR, rating, latency s)
PUBLISHED: dict[str, dict[str, float]] = {
    "Moshi": {"pause_synthetic_tor": 0.985, "pause_candor_tor": 0.980, "turn_tor": 0.941, "turn_latency_s": 0.265,
              "interrupt_tor": 1.000, "interrupt_rating": 0.765, "interrupt_latency_s": 0.257},
    "Gemini Live": {"pause_synthetic_tor": 0.255, "pause_candor_tor": 0.310, "turn_tor": 0.655,
                    "turn_latency_s": 1.301, "interrupt_tor": 0.891, "interrupt_rating": 3.376,
                    "interrupt_latency_s": 1.183},
    "GPT-Realtime": {"pause_synthetic_tor": 0.010, "pause_candor_tor": 0.120, "turn_tor": 1.000,
                     "turn_latency_s": 1.47, "interrupt_tor": 0.970, "interrupt_rating": 3.85,
                     "interrupt_latency_s": 1.50},
    "PersonaPlex": {"pause_synthetic_tor": 0.584, "pause_candor_tor": 0.662, "turn_tor": 0.992,
                    "turn_latency_s": 0.070, "interrupt_tor": 1.000, "interrupt_rating": 4.21,
                    "interrupt_latency_s": 0.400},
}
