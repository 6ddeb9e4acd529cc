"""Published MT-Bench-in-speech numbers to put beside ours.

Source: KAME (Sakana AI), "KAME: Tandem Architecture for Enhancing
Knowledge in Real-Time Speech-to-Speech Conversational AI", arXiv
2510.02327 (ICASSP 2026), the MT-Bench table (speech input; reasoning,
STEM and humanities categories, judged as MT-Bench does), as summarised in
the project's KAME_NOTES §6. Latency is the paper's median response
latency; "~0 s" means the system starts speaking about when the user
stops (it often starts before).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

SOURCE = "KAME, arXiv 2510.02327 (ICASSP 2026), MT-Bench table"
CATEGORIES = ("reasoning", "stem", "humanities")
CATEGORY_TITLES = MappingProxyType({"reasoning": "reasoning", "stem": "STEM", "humanities": "humanities"})


@dataclass(frozen=True)
class PublishedRow:
    system: str
    reasoning: float
    stem: float
    humanities: float
    average: float
    median_latency: str  # as published (approximate)
    median_latency_s: float  # for plotting


PUBLISHED: tuple[PublishedRow, ...] = (
    PublishedRow("Moshi", 1.32, 1.94, 2.88, 2.05, "~0 s", 0.0),
    PublishedRow("KAME + GPT-4.1", 5.44, 6.65, 7.19, 6.43, "~0 s", 0.0),
    PublishedRow("KAME + Claude Opus 4.1", 5.72, 6.53, 6.43, 6.23, "~0 s", 0.0),
    PublishedRow("Unmute (cascade, GPT-4.1)", 7.08, 8.35, 7.67, 7.70, "2.1 s", 2.1),
)
