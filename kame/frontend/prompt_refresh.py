"""When a PersonaPlex slot steps its prompts again in a long call (``frontend.refresh_prompts: at_pause``).

The voice prompt and persona take the first P positions of the LM's ring
KV cache; once the conversation is ``context - P`` frames old they start to
leave the attention window. With ``at_pause``, a slot whose prompts have
begun to leave waits for a pause (its own text silent and the caller quiet
for ``pause_frames`` frames in a row) and then steps them again, at the
latest positions, keeping its cache: the window then holds the recent
conversation and the prompts, as it did early in the call. The count of
frames restarts after each refresh, so refreshes are at least ``context``
LM steps apart. Pure bookkeeping: the engine feeds it one observation a
conversation frame (docs/personaplex.md, "Long calls").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

RefreshMode = Literal["never", "at_pause"]


def frame_dbfs(rms: float) -> float:
    """A frame's level in dBFS from its RMS (float samples in -1..1); -inf for digital silence."""
    return 20.0 * math.log10(rms) if rms > 0 else -math.inf


@dataclass
class PromptRefresh:
    """One slot's clock: conversation frames since its prompts were last stepped, and the current pause."""

    context: int  #: the LM's attention window, in frames (moshi's ``context``)
    prompt_frames: int  #: P: cache positions the prompts take (moshi steps that heard no caller)
    pause_frames: int  #: frames of quiet on both sides that make a pause
    age: int = 0  #: conversation frames since the prompts were last stepped
    quiet: int = 0  #: frames in a row with the slot silent and the caller quiet
    refreshes: int = 0

    @property
    def due_after(self) -> int:
        """Conversation frames after which the prompts' first position leaves the window."""
        return max(1, self.context - self.prompt_frames)

    @property
    def due(self) -> bool:
        return self.age >= self.due_after

    def observe(self, agent_silent: bool, caller_quiet: bool) -> bool:
        """One conversation frame; True when the prompts must be stepped again now (the count restarts)."""
        self.age += 1
        self.quiet = self.quiet + 1 if agent_silent and caller_quiet else 0
        if self.due and self.quiet >= self.pause_frames:
            self.age = 0
            self.quiet = 0
            self.refreshes += 1
            return True
        return False
