"""The scripted back-end: reply choice, pacing, cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from kame.backend.base import ChatMessage, normalize_messages
from kame.backend.config import BackendConfig, ScriptedConfig
from kame.backend.scripted import ScriptedBackend, split_words


def fast(**kw: object) -> ScriptedBackend:
    return ScriptedBackend("s", ScriptedConfig.model_validate({"first_token_delay_s": 0, "chunks_per_s": 1000, **kw}))


async def text(backend: ScriptedBackend, user: str) -> str:
    return "".join([c async for c in backend.stream([{"role": "user", "content": user}])])


def test_rules_then_cycled_replies_then_default() -> None:
    b = fast(rules={"weather": "Sunny.", "name": "I am KAME."}, replies=["One.", "Two."],
             default_reply="unused {user}")

    async def main() -> list[str]:
        return [await text(b, "What's the WEATHER like?"), await text(b, "blah"), await text(b, "what is your name"),
                await text(b, "blah"), await text(b, "blah")]

    assert asyncio.run(main()) == ["Sunny.", "One.", "I am KAME.", "Two.", "One."]


def test_default_reply_quotes_the_user() -> None:
    b = fast(rules={}, max_user_words=3)
    assert asyncio.run(text(b, "tell me about turtles please.")) == "I heard you say tell me about. Tell me more about that."
    b2 = fast(rules={}, default_reply="You said: {user}!")
    assert asyncio.run(text(b2, "turtles.")) == "You said: turtles!"


def test_uses_the_last_user_message_and_caps_words() -> None:
    b = ScriptedBackend("s", BackendConfig.model_validate(
        {"kind": "scripted", "max_tokens": 2,
         "scripted": {"first_token_delay_s": 0, "chunks_per_s": 1000, "rules": {"b": "x y z w"}}}))
    msgs = [ChatMessage("system", "b"), ChatMessage("user", "a"), ChatMessage("assistant", "b"),
            ChatMessage("user", "b")]

    async def main() -> list[str]:
        return [c async for c in b.stream(msgs)]

    assert asyncio.run(main()) == ["x", " y"]


def test_first_token_delay_and_rate() -> None:
    b = ScriptedBackend("s", ScriptedConfig(rules={}, replies=["a b c d e f g h i j"], first_token_delay_s=0.2,
                                            chunks_per_s=20))

    async def main() -> list[float]:
        t0 = time.monotonic()
        return [time.monotonic() - t0 async for _ in b.stream([{"role": "user", "content": "x"}])]

    times = asyncio.run(main())
    assert len(times) == 10
    assert 0.19 <= times[0] < 0.45
    assert 0.19 + 9 * 0.05 <= times[-1] < 0.2 + 9 * 0.05 + 0.3
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.05, abs=0.02)


def test_cancellation_stops_at_once() -> None:
    b = ScriptedBackend("s", ScriptedConfig(rules={}, replies=[" ".join(["w"] * 50)], first_token_delay_s=0,
                                            chunks_per_s=20))
    got: list[str] = []

    async def main() -> float:
        async def consume() -> None:
            async for chunk in b.stream([{"role": "user", "content": "x"}]):
                got.append(chunk)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.22)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stop = time.monotonic() - t0
        n = len(got)
        await asyncio.sleep(0.15)
        assert len(got) == n  # nothing more arrives
        return stop

    assert asyncio.run(main()) < 0.2
    assert 3 <= len(got) <= 7


def test_split_words_round_trips() -> None:
    s = "Hello there,  how are you?"
    assert "".join(split_words(s)) == s and split_words(s)[1] == " there,"


def test_messages_are_validated() -> None:
    with pytest.raises(ValueError, match="role"):
        normalize_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError):
        normalize_messages([])
    assert normalize_messages([ChatMessage("user", "x")]) == [{"role": "user", "content": "x"}]
