"""The conversation sent to the LLM is the longest that fits the back-end's window (kame/oracle/window.py).

The pure rules first (oldest turns dropped first, the instructions and tools never, Realtime's
``truncation``), then a 30-minute scripted conversation through the real oracle loop and the real
``openai`` client against a recording server on 127.0.0.1 (tests/support/llm_server.py).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from kame.backend.config import BackendConfig
from kame.backend.presets import apply_preset
from kame.oracle.window import (
    DEFAULT_CONTEXT_TOKENS,
    ContextWindow,
    Truncation,
    context_tokens_of,
    estimate_tokens,
    message_tokens,
    tools_tokens,
)
from tests.support.llm_server import LlmServer, Reply
from tests.support.oracle_loop import RecordingSink, make_loop, make_registry, wait_for

SYSTEM = {"role": "system", "content": "You are brief. " * 20}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city. " * 10,
                                           "parameters": {"type": "object", "properties": {}}}}]


def conversation(n: int) -> list[dict[str, str]]:
    """``n`` exchanges, each user turn naming its number, ending with a user message."""
    out: list[dict[str, str]] = [SYSTEM]
    for i in range(n):
        out.append({"role": "user", "content": f"user turn {i}: " + "words " * 10})
        out.append({"role": "assistant", "content": f"assistant turn {i}: " + "reply " * 10})
    out.append({"role": "user", "content": "and now?"})
    return out


def sent_size(msgs: list[dict[str, Any]], tools: list[Any] = ()) -> int:  # type: ignore[assignment]
    return sum(message_tokens(m) for m in msgs) + tools_tokens(tools)


def test_estimate_is_above_the_usual_four_characters_a_token() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 10
    assert estimate_tokens(text) >= len(text) / 4 and estimate_tokens("") == 0
    assert estimate_tokens("日本語") == 3  # 9 UTF-8 bytes: about a token a character


def test_everything_is_sent_when_it_fits() -> None:
    msgs = conversation(30)
    assert ContextWindow().fit(msgs, context_tokens=100_000, reply_tokens=100) == msgs


def test_oldest_turns_go_first_instructions_and_tools_never() -> None:
    msgs = conversation(200)
    window = ContextWindow()
    out = window.fit(msgs, context_tokens=2000, reply_tokens=100, tools=TOOLS)
    assert out[0] == SYSTEM and out[-1] == msgs[-1]
    assert out[1]["role"] == "user"  # the conversation opens with a user message
    assert out[1:] == msgs[len(msgs) - len(out) + 1:]  # a suffix: only the oldest went
    assert sent_size(out, TOOLS) + 100 <= 2000  # the prompt, the tools and the reply fit
    bigger = msgs[len(msgs) - len(out) - 1:]  # one more exchange would not have fitted
    assert sent_size([SYSTEM] + bigger, TOOLS) + 100 > 2000
    assert window.dropped == len(msgs) - len(out) > 0
    # without the tools more of the conversation fits
    assert len(ContextWindow().fit(msgs, context_tokens=2000, reply_tokens=100)) > len(out)


def test_a_newest_message_alone_too_long_keeps_its_end() -> None:
    msgs = [SYSTEM, {"role": "user", "content": " ".join(f"w{i}" for i in range(5000))}]
    out = ContextWindow().fit(msgs, context_tokens=1000, reply_tokens=100)
    assert out[0] == SYSTEM and out[1]["content"].endswith("w4999") and sent_size(out) + 100 <= 1000


def test_disabled_sends_everything() -> None:
    msgs = conversation(200)
    assert ContextWindow().fit(msgs, context_tokens=2000, reply_tokens=100, truncation=Truncation("disabled")) == msgs


def test_post_instructions_limit() -> None:
    msgs = conversation(50)
    out = ContextWindow().fit(msgs, context_tokens=100_000, reply_tokens=100,
                              truncation=Truncation("retention_ratio", 1.0, post_instructions=500))
    assert sum(message_tokens(m) for m in out[1:]) <= 500 < sum(message_tokens(m) for m in msgs[1:])


def test_retention_ratio_cuts_deep_once_then_keeps_the_prefix() -> None:
    """A cut keeps ``retention_ratio`` of the limit; later turns reuse the same first message until the
    limit is reached again (the prompt's prefix stays put for the back-end's cache); auto re-cuts each turn."""
    ratio = Truncation("retention_ratio", 0.5, post_instructions=1000)
    window, auto = ContextWindow(), ContextWindow()
    firsts, auto_firsts = [], []
    for n in range(20, 80):
        msgs = conversation(n)
        out = window.fit(msgs, context_tokens=100_000, reply_tokens=100, truncation=ratio)
        firsts.append(out[1]["content"])
        assert sum(message_tokens(m) for m in out[1:]) <= 1000
        auto_out = auto.fit(msgs, context_tokens=100_000, reply_tokens=100,
                            truncation=Truncation("retention_ratio", 1.0, post_instructions=1000))
        auto_firsts.append(auto_out[1]["content"])
    cuts = sum(1 for a, b in zip(firsts, firsts[1:]) if a != b)
    auto_cuts = sum(1 for a, b in zip(auto_firsts, auto_firsts[1:]) if a != b)
    assert 1 <= cuts < auto_cuts / 3, (cuts, auto_cuts)


def test_preset_windows() -> None:
    assert context_tokens_of(apply_preset(BackendConfig(preset="openai"))) == 1_047_576
    assert context_tokens_of(apply_preset(BackendConfig(preset="anthropic"))) == 200_000
    assert context_tokens_of(apply_preset(BackendConfig(preset="ollama", model="qwen3"))) == 4096  # num_ctx
    # another model than the preset's: its window is not the preset model's
    assert context_tokens_of(apply_preset(BackendConfig(preset="openai", model="gpt-3.5-turbo"))) == DEFAULT_CONTEXT_TOKENS
    assert context_tokens_of(apply_preset(BackendConfig(preset="openai", context_tokens=16_385))) == 16_385
    assert context_tokens_of(apply_preset(BackendConfig(preset="vllm"))) == DEFAULT_CONTEXT_TOKENS


# --------------------------------------------------------------------------- a 30-minute call, real HTTP

FACT = "my locker code is four four one seven"
EXCHANGES = 180  # one every 10 s: 30 minutes


@pytest.fixture(scope="module")
def sp(tiny_kame_ckpt: Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(tiny_kame_ckpt / "tokenizer.model"))


def thirty_minutes(llm_server: LlmServer, sp: spm.SentencePieceProcessor, **backend: Any) -> list[dict[str, str]]:
    """A scripted 30-minute call through the oracle loop (user finals as the ASR gives them, the assistant's
    words as Moshi's text tokens, step by step); then the user asks about minute 0. Returns what the LLM got."""
    llm_server.set_default(Reply(text="It is four four one seven."))

    async def main() -> None:
        events: list = []
        loop = make_loop(make_registry(llm_server, **backend), sp, events, RecordingSink())
        loop.auto_requests = False  # 30 minutes of turns without 180 requests; the last one is asked below
        step = 0
        for i in range(EXCHANGES):
            loop.on_user_final(f"Hello, {FACT}." if i == 0 else f"Turn {i}: tell me more about the weather please.")
            for token in sp.encode(f"Reply {i}: it is sunny and warm today."):
                loop.on_assistant_token(token, step)
                step += 1
            for _ in range(4):
                loop.on_assistant_token(None, step)
                step += 1
        loop.on_user_final("What is my locker code?")
        assert loop.respond() is not None
        await wait_for(lambda: "llm.done" in [k for k, _ in events], 10)
        await loop.aclose()

    asyncio.run(main())
    return llm_server.chat_requests()[-1].body["messages"]  # type: ignore[no-any-return]


def user_turn_numbers(messages: list[dict[str, str]]) -> list[int]:
    return [int(n) for m in messages if m["role"] == "user" for n in re.findall(r"Turn (\d+):", m["content"])]


def test_thirty_minutes_all_sent_when_the_window_allows(llm_server: LlmServer, sp: spm.SentencePieceProcessor) -> None:
    messages = thirty_minutes(llm_server, sp, context_tokens=128_000)
    assert FACT in messages[1]["content"]  # minute 0, still there at minute 30
    assert user_turn_numbers(messages) == list(range(1, EXCHANGES))
    assert "What is my locker code?" in messages[-1]["content"]


def test_thirty_minutes_cut_to_a_small_window(llm_server: LlmServer, sp: spm.SentencePieceProcessor) -> None:
    window, reply = 3000, 100
    messages = thirty_minutes(llm_server, sp, context_tokens=window, max_tokens=reply)
    assert messages[0]["role"] == "system" and "voice assistant" in messages[0]["content"]  # never dropped
    assert not any(FACT in m["content"] for m in messages)  # the oldest turns went first
    turns = user_turn_numbers(messages)
    assert turns and turns == list(range(turns[0], EXCHANGES)) and turns[0] > 1  # the newest, contiguous
    assert "What is my locker code?" in messages[-1]["content"]
    assert sum(message_tokens(m) for m in messages) + reply <= window
    # and the estimate is conservative: the prompt's characters / 4 (the usual English ratio) fit easily
    assert sum(len(m["content"]) for m in messages) / 4 < window - reply


def test_the_history_a_session_keeps_is_bounded() -> None:
    """Hours of talk: the transcript keeps at most ``history_max_chars`` (a memory bound), the newest."""
    from kame.oracle.config import OracleConfig
    from kame.oracle.transcript import Transcript

    tr = Transcript.from_config(OracleConfig())
    for i in range(20_000):  # ~5 hours of exchanges
        tr.user_final(f"user turn {i}: " + "words " * 10)
        tr.add_assistant_words(f"reply {i} it is sunny".split())
    kept = sum(len(t.text) for t in tr.turns)
    assert 0.99 * OracleConfig().history_max_chars <= kept <= OracleConfig().history_max_chars < 20_000 * 90
    assert tr.turns[-1].text.startswith("reply 19999")
