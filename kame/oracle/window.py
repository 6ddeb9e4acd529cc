"""The conversation sent to the LLM: the longest that fits the back-end's context window.

The window holds the system message (instructions, persona, notes: never dropped), the tools'
definitions (never dropped), the reply (the back-end's ``max_tokens``) and the conversation; when
the conversation is too long its oldest messages go first. ``truncation`` is OpenAI Realtime's
(GA): ``auto`` drops just enough, ``disabled`` drops nothing (a back-end whose window is exceeded
then fails the request), ``retention_ratio`` drops down to that fraction of the limit at once and
keeps that cut until the limit is reached again, so that the prompt's prefix (and the back-end's
prompt cache) stays put for many turns. Tokens are estimated (no tokenizer file is reachable
offline): :func:`estimate_tokens`, UTF-8 bytes / 3 rounded up plus 4 a message, above the real
count for English (about 4 characters a token) and for most other scripts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Message = Mapping[str, Any]

#: Tokens a chat template adds around each message (role markers, separators): counted per message.
MESSAGE_OVERHEAD_TOKENS = 4
#: Assumed window of a back-end that states none (``context_tokens`` null and no preset value).
DEFAULT_CONTEXT_TOKENS = 8192
#: Reserved for the reply when the back-end sets no ``max_tokens``.
DEFAULT_REPLY_TOKENS = 1024


class _Sized(Protocol):
    """What the window reads of a back-end's config (:class:`kame.backend.config.BackendConfig`)."""

    @property
    def context_tokens(self) -> int | None: ...
    @property
    def max_tokens(self) -> int | None: ...


def context_tokens_of(cfg: _Sized | None) -> int:
    """The back-end's window: its ``context_tokens`` (the preset's filled in), else :data:`DEFAULT_CONTEXT_TOKENS`."""
    return cfg.context_tokens if cfg is not None and cfg.context_tokens else DEFAULT_CONTEXT_TOKENS


def reply_tokens_of(cfg: _Sized | None) -> int:
    """Tokens kept free for the reply: the back-end's ``max_tokens``, else :data:`DEFAULT_REPLY_TOKENS`."""
    return cfg.max_tokens if cfg is not None and cfg.max_tokens else DEFAULT_REPLY_TOKENS


def estimate_tokens(text: str) -> int:
    """Conservative token count of ``text``: UTF-8 bytes / 3, rounded up."""
    return math.ceil(len(text.encode("utf-8")) / 3)


def message_tokens(message: Message) -> int:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
    extra = message.get("tool_calls")
    if extra:
        text += json.dumps(extra, ensure_ascii=False, default=str)
    return estimate_tokens(text or "") + MESSAGE_OVERHEAD_TOKENS


def tools_tokens(tools: Sequence[Any]) -> int:
    """The tools' definitions as the request carries them (JSON)."""
    return estimate_tokens(json.dumps(list(tools), ensure_ascii=False, default=str)) if tools else 0


@dataclass(frozen=True)
class Truncation:
    """Realtime's ``truncation``: ``auto``, ``disabled`` or ``retention_ratio`` (with its token limit)."""

    type: Literal["auto", "disabled", "retention_ratio"] = "auto"
    #: Fraction of the limit kept when a cut is made (``retention_ratio`` only).
    retention_ratio: float = 1.0
    #: ``token_limits.post_instructions``: most conversation tokens after the instructions (None: the window's).
    post_instructions: int | None = None

    def as_wire(self) -> str | dict[str, Any]:
        """The GA shape, as ``session.updated`` reports it."""
        if self.type != "retention_ratio":
            return self.type
        out: dict[str, Any] = {"type": "retention_ratio", "retention_ratio": self.retention_ratio}
        if self.post_instructions is not None:
            out["token_limits"] = {"post_instructions": self.post_instructions}
        return out


AUTO = Truncation()


def conversation_limit(*, context_tokens: int, reply_tokens: int, instructions_tokens: int,
                       truncation: Truncation = AUTO) -> int | None:
    """Most tokens the conversation may take after the instructions (system message and tools); None: no
    limit (``disabled``). At least one token: the newest message is always sent, cut if need be."""
    if truncation.type == "disabled":
        return None
    room = context_tokens - reply_tokens - instructions_tokens
    if truncation.post_instructions is not None:
        room = min(room, truncation.post_instructions)
    return max(1, room)


class ContextWindow:
    """One session's cut of its conversation (the state ``retention_ratio`` needs; pure otherwise)."""

    def __init__(self) -> None:
        #: The first message kept at the last cut (``retention_ratio``): later requests start there.
        self._first: str | None = None
        #: How many conversation messages the last :meth:`fit` dropped (for events and tests).
        self.dropped = 0

    def fit(self, messages: Sequence[Message], *, context_tokens: int, reply_tokens: int,
            tools: Sequence[Any] = (), truncation: Truncation = AUTO) -> list[dict[str, Any]]:
        """``messages`` (a system message first, then the conversation, oldest first) as sent: the system
        message whole, the conversation's newest messages that fit, starting with a user message."""
        msgs = [dict(m) for m in messages]
        head = msgs[:1] if msgs and msgs[0].get("role") == "system" else []
        conv = msgs[len(head):]
        limit = conversation_limit(
            context_tokens=context_tokens, reply_tokens=reply_tokens,
            instructions_tokens=sum(message_tokens(m) for m in head) + tools_tokens(tools), truncation=truncation)
        self.dropped = 0
        if limit is None or not conv:
            return head + conv
        sizes = [message_tokens(m) for m in conv]
        if truncation.type == "retention_ratio":
            start = 0
            if self._first is not None:  # the last cut, found again
                start = next((i for i, m in enumerate(conv) if m.get("content") == self._first), 0)
            if sum(sizes[start:]) > limit:  # over the limit: cut down to the ratio at once
                start = max(start, _cut(sizes, max(1, int(limit * truncation.retention_ratio))))
        else:
            start = _cut(sizes, limit)  # auto: the longest suffix that fits, recomputed every time
        start = _user_first(conv, start)
        kept = conv[start:]
        if kept and sum(sizes[start:]) > limit:  # the newest message alone is too long: keep its end
            kept = [_tail(kept[-1], limit)]
        self.dropped = len(conv) - len(kept)
        self._first = kept[0].get("content") if kept and start > 0 else None
        return head + kept


def _cut(sizes: Sequence[int], limit: int) -> int:
    """The first index of the longest suffix of ``sizes`` within ``limit`` (the last one at least)."""
    total = 0
    for i in range(len(sizes) - 1, -1, -1):
        total += sizes[i]
        if total > limit:
            return min(i + 1, len(sizes) - 1)
    return 0


def _user_first(conv: Sequence[Message], start: int) -> int:
    """Some chat templates want the conversation to open with a user message: drop a leading assistant one."""
    while start < len(conv) - 1 and start > 0 and conv[start].get("role") != "user":
        start += 1
    return start


def _tail(message: Message, limit: int) -> dict[str, Any]:
    """``message`` with only the end of its text, within ``limit`` tokens (word boundary)."""
    text = str(message.get("content") or "")
    words = text.split()
    budget = max(0, limit - MESSAGE_OVERHEAD_TOKENS)
    kept: list[str] = []
    used = 0
    for word in reversed(words):
        cost = estimate_tokens(word + " ")
        if kept and used + cost > budget:
            break
        kept.append(word)
        used += cost
    return {**dict(message), "content": " ".join(reversed(kept))}
