"""A deterministic back-end for demos and tests: canned replies at a set pace.

Reply choice, in order: the first rule whose keyword occurs in the last user
message (case-insensitive); else the next of ``replies`` (cycled); else
``default_reply`` with ``{user}`` replaced by the start of the user's
message. The text is streamed word by word: the first word after
``first_token_delay_s``, then ``chunks_per_s`` words per second, on a fixed
schedule so timing does not drift.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence

from kame.backend.base import BackendHealth, MessageLike, last_user_text, normalize_messages
from kame.backend.config import BackendConfig, ScriptedConfig


def split_words(text: str) -> list[str]:
    """Chunks of a reply: each word with the whitespace before it (joined they give ``text`` back)."""
    return re.findall(r"\s*\S+", text)


class ScriptedBackend:
    """Streams canned replies; cancellable at any sleep."""

    kind = "scripted"

    def __init__(self, name: str, cfg: BackendConfig | ScriptedConfig | None = None) -> None:
        self.name = name
        self._default_max_tokens: int | None = None
        if isinstance(cfg, BackendConfig):
            self._default_max_tokens = cfg.max_tokens
            cfg = cfg.scripted
        self.cfg = cfg or ScriptedConfig()
        self._next_reply = 0
        self.model = "scripted"

    def __repr__(self) -> str:
        return f"ScriptedBackend(name={self.name!r})"

    def reply_for(self, messages: Sequence[MessageLike]) -> str:
        """The full reply these messages get (advances the ``replies`` cycle)."""
        user = last_user_text(normalize_messages(messages))
        lowered = user.lower()
        for keyword, answer in self.cfg.rules.items():
            if keyword.lower() in lowered:
                return answer
        if self.cfg.replies:
            answer = self.cfg.replies[self._next_reply % len(self.cfg.replies)]
            self._next_reply += 1
            return answer
        quoted = " ".join(user.split()[: self.cfg.max_user_words]).rstrip(".,!?;:") or "nothing"
        return self.cfg.default_reply.replace("{user}", quoted)

    async def stream(
        self,
        messages: Sequence[MessageLike],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> AsyncIterator[str]:
        """Yield the reply word by word (``max_tokens`` caps the number of words)."""
        words = split_words(self.reply_for(messages))
        limit = max_tokens if max_tokens is not None else self._default_max_tokens
        if limit is not None:
            words = words[:limit]
        loop = asyncio.get_running_loop()
        start = loop.time() + self.cfg.first_token_delay_s
        period = 1.0 / self.cfg.chunks_per_s
        for i, word in enumerate(words):
            delay = start + i * period - loop.time()
            await asyncio.sleep(max(delay, 0.0))
            yield word

    async def check(self) -> BackendHealth:
        return BackendHealth(self.name, self.kind, "ok", "scripted", 0.0)

    async def aclose(self) -> None:
        return None
