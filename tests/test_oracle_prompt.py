"""Prompt building: one system message, bounded history, the pending partial marked."""

from __future__ import annotations

from kame.oracle.config import OracleConfig
from kame.oracle.prompt import (
    PENDING_MARK,
    SILENCE_MARK,
    bound_turns,
    build_messages,
    build_messages_from_config,
    system_prompt,
)
from kame.oracle.transcript import Transcript, TranscriptView, Turn


def test_system_prompt_states_the_intent() -> None:
    text = system_prompt(max_words=25, persona="You are Kame, a cheerful turtle.", instructions="Talk about cooking.")
    low = text.lower()
    assert "at most 25 words" in low
    assert "english" in low and "spoken" in low and "confident" in low
    assert "unfinished" in low and "where the user is going" in low
    assert "no lists, markdown" in low
    assert text.index("At most") < text.index("Kame, a cheerful turtle") < text.index("Talk about cooking")
    assert "Kame" not in system_prompt()
    assert "French" in system_prompt(language="French")


def test_messages_from_transcript() -> None:
    tr = Transcript()
    tr.user_final("Hi.")
    tr.add_assistant_words(["Hello", "there."])
    tr.user_final("What is")
    tr.user_partial("the capital of")
    msgs = build_messages(tr.view(), persona="A calm guide.")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert "A calm guide." in msgs[0]["content"]
    assert msgs[1]["content"] == "Hi."
    assert msgs[2]["content"] == "Hello there."
    # The committed start of the utterance and the pending partial form one user message.
    assert msgs[3]["content"] == f"What is {PENDING_MARK} the capital of"
    assert all(set(m) == {"role", "content"} for m in msgs)


def test_always_ends_with_a_user_message() -> None:
    view = TranscriptView((Turn("assistant", "Hello, how can I help?"),), "", 0)
    msgs = build_messages(view)
    assert msgs[-1] == {"role": "user", "content": SILENCE_MARK}
    assert build_messages(TranscriptView((), "", 0))[-1]["content"] == SILENCE_MARK
    msgs = build_messages(TranscriptView((Turn("assistant", "Hi."),), "so", 1))
    assert msgs[-1] == {"role": "user", "content": f"{PENDING_MARK} so"}


def test_history_bounds() -> None:
    turns = [Turn("user" if i % 2 == 0 else "assistant", f"turn {i} " + "x" * 10) for i in range(10)]
    assert [t.text[:6] for t in bound_turns(turns, max_turns=3, max_chars=None)] == ["turn 7", "turn 8", "turn 9"]
    kept = bound_turns(turns, max_turns=None, max_chars=40)
    assert [t.text[:6] for t in kept] == ["turn 8", "turn 9"]
    long = [Turn("user", " ".join(["word"] * 100))]
    cut = bound_turns(long, max_turns=None, max_chars=23)
    assert cut[0].text == "word word word word" and len(cut) == 1
    view = TranscriptView(tuple(turns), "and then", 5)
    msgs = build_messages_from_config(view, OracleConfig(history_max_turns=2, max_answer_words=12))
    assert "At most 12 words" in msgs[0]["content"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"].startswith("turn 8")
    assert msgs[-1]["content"] == f"{PENDING_MARK} and then"


def test_config_persona_and_override() -> None:
    cfg = OracleConfig(persona="Persona A.", instructions="Be brief.")
    view = TranscriptView((), "hello", 1)
    content = build_messages_from_config(view, cfg)[0]["content"]
    assert "Persona A." in content and "Be brief." in content
    content = build_messages_from_config(view, cfg, instructions="Speak like a pirate.")[0]["content"]
    assert "Speak like a pirate." in content and "Be brief." not in content
