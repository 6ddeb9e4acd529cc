"""A deterministic back-end for demos and tests: canned replies at a set pace.

Reply choice, in order: the first rule whose keyword occurs in the last user
message (case-insensitive); else the next of ``replies`` (cycled); else
``default_reply`` with ``{user}`` replaced by the start of the user's
message. The text is streamed word by word: the first word after
``first_token_delay_s``, then ``chunks_per_s`` words per second, on a fixed
schedule so timing does not drift.

Tools (``stream_turn``): when the request offers a tool named by one of
``tool_rules`` and the rule's keyword was heard, the reply is the rule's
``say_first`` text and then a call of that tool; once the request carries
the tool's result, the reply is the rule's ``answer`` with ``{result}``
filled in (``answer_on_error`` when the call failed).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from kame.backend.base import (
    BackendHealth,
    MessageLike,
    last_user_text,
    normalize_messages,
    normalize_turn_messages,
)
from kame.backend.config import BackendConfig, ScriptedConfig, ScriptedToolRule
from kame.backend.tools import ToolCallDelta

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from kame.backend.tools import TurnOptions


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
        self._calls = 0

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
    ) -> AsyncGenerator[str, None]:
        """Yield the reply word by word (``max_tokens`` caps the number of words)."""
        async for word in self._paced(self._words(self.reply_for(messages), max_tokens)):
            yield word

    def _words(self, text: str, max_tokens: int | None) -> list[str]:
        """``text``'s words, at most ``max_tokens`` (or the configured default) of them."""
        words = split_words(text)
        limit = max_tokens if max_tokens is not None else self._default_max_tokens
        return words[:limit] if limit is not None else words

    async def _paced(self, words: list[str], then: list[float] | None = None) -> AsyncGenerator[str, None]:
        """``words`` at the configured pace (first token delay, then ``chunks_per_s``); ``then`` receives the
        time the word after the last one would be due."""
        loop = asyncio.get_running_loop()
        start = loop.time() + self.cfg.first_token_delay_s
        period = 1.0 / self.cfg.chunks_per_s
        for i, word in enumerate(words):
            await asyncio.sleep(max(start + i * period - loop.time(), 0.0))
            yield word
        if then is not None:
            then.append(start + len(words) * period)

    async def stream_turn(
        self, messages: Sequence[Any], **options: Unpack[TurnOptions]
    ) -> AsyncGenerator[str | ToolCallDelta, None]:
        """One LLM turn with tools: text words, then (per ``tool_rules``) one call.

        ``model`` is ignored (a script has none); ``report`` gets the finish
        reason (no token usage: nothing is counted).
        """
        msgs = normalize_turn_messages(messages)
        tools, tool_choice, max_tokens = options.get("tools"), options.get("tool_choice"), options.get("max_tokens")
        report = options.get("report")
        offered = {t.name for t in tools or ()} if tool_choice != "none" else set()
        text, call = self._turn_script(msgs, offered)
        due: list[float] = []
        async for word in self._paced(self._words(text, max_tokens), due):
            yield word
        if call is not None:
            await asyncio.sleep(max(due[0] - asyncio.get_running_loop().time(), 0.0))
            self._calls += 1
            yield ToolCallDelta(0, f"call_scripted_{self._calls}", call.tool, json.dumps(call.arguments))
        if report is not None:
            report.finish_reason = "tool_calls" if call is not None else "stop"
            report.model = self.model

    def _turn_script(
        self, msgs: list[dict[str, Any]], offered: set[str]
    ) -> tuple[str, ScriptedToolRule | None]:
        """(text to say, rule whose call follows it) for this turn."""
        if msgs and msgs[-1]["role"] == "tool":
            results = [m for m in reversed(msgs) if m["role"] == "tool"]
            asked = next((m for m in reversed(msgs) if m.get("tool_calls")), None)
            names = [c["function"]["name"] for c in (asked or {}).get("tool_calls", [])]
            rule = next((r for r in self.cfg.tool_rules if r.tool in names), None)
            if rule is not None:
                content = results[0]["content"]
                if _is_error(content):
                    return rule.answer_on_error, None
                return rule.answer.replace("{result}", content.strip()), None
        user = last_user_text(msgs).lower()
        for rule in self.cfg.tool_rules:
            if rule.tool in offered and rule.keyword.lower() in user:
                return rule.say_first, rule
        plain = [m for m in msgs if m["role"] in ("system", "user") or (m["role"] == "assistant" and m["content"])]
        return self.reply_for(plain or [{"role": "user", "content": ""}]), None

    async def check(self) -> BackendHealth:
        return BackendHealth(self.name, self.kind, "ok", "scripted", 0.0)

    async def aclose(self) -> None:
        return None


def _is_error(content: str) -> bool:
    """A ``tool`` message reporting a failed call (see ``ToolResult.content_for_llm``)."""
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("error") in ("error", "refused", "timeout")
