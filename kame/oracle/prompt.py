"""Chat messages asking the LLM for the assistant's next spoken reply.

The published intent: the LLM predicts where the user's (possibly
unfinished) speech is going and writes the reply the assistant should give,
short, spoken, confident, with nothing unpronounceable. The wording below is
this project's own. The persona and session instructions go to the LLM only
(Moshi never sees them). Everything is in ONE leading system message:
some OpenAI-compatible servers reject a second system message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kame.oracle.transcript import TranscriptView, Turn, tail_words

if TYPE_CHECKING:
    from kame.oracle.config import OracleConfig

Message = dict[str, str]

#: Marks the user's unfinished speech in the last user message.
PENDING_MARK = "[still speaking, may be cut off mid-sentence]"
#: Last user message when the user has said nothing since the assistant spoke.
SILENCE_MARK = "[the user is silent]"

_BASE = """\
You write what a voice assistant says next in a live spoken conversation. \
A speech model speaks your words aloud as soon as they arrive, so write only \
the words to be spoken.
The user may still be talking: the end of the last user message can be \
unfinished. Work out where the user is going and answer what they are about \
to ask or say, as the reply should sound right after they finish.
Rules for the reply:
- At most {max_words} words, one or two short sentences.
- Natural spoken {language}, direct and confident. Do not hedge, do not \
mention guessing or that the user is still talking.
- Only words that are pronounced: no lists, markdown, emojis, links, code or \
symbols. Use only periods and commas. Write numbers and units the way they \
are said.
- Output the reply itself, with no label, quotes or preface."""


def system_prompt(
    *,
    max_words: int = 30,
    language: str = "English",
    persona: str | None = None,
    instructions: str | None = None,
) -> str:
    """The system message: base rules, then persona, then session instructions."""
    parts = [_BASE.format(max_words=max_words, language=language)]
    if persona and persona.strip():
        parts.append("About the assistant you speak for:\n" + persona.strip())
    if instructions and instructions.strip():
        parts.append("Instructions for this conversation:\n" + instructions.strip())
    return "\n\n".join(parts)


def bound_turns(turns: Sequence[Turn], *, max_turns: int | None, max_chars: int | None) -> list[Turn]:
    """The most recent turns within ``max_turns`` and ``max_chars`` (the newest one is cut if alone too long)."""
    kept: list[Turn] = []
    total = 0
    for turn in reversed(turns):
        if max_turns is not None and len(kept) >= max_turns:
            break
        if max_chars is not None and total + len(turn.text) > max_chars:
            if not kept:
                kept.append(Turn(turn.role, tail_words(turn.text, max_chars)))
            break
        kept.append(turn)
        total += len(turn.text)
    return kept[::-1]


def build_messages(
    view: TranscriptView,
    *,
    max_words: int = 30,
    language: str = "English",
    persona: str | None = None,
    instructions: str | None = None,
    max_turns: int | None = None,
    max_chars: int | None = None,
) -> list[Message]:
    """OpenAI-style ``[{"role", "content"}, ...]`` for the current state.

    Turns become alternating user/assistant messages (consecutive turns of
    one role are merged); the pending partial is appended to the last user
    message after :data:`PENDING_MARK`. The list always ends with a user
    message (:data:`SILENCE_MARK` if the user has said nothing new). What fits the back-end's window is
    :class:`kame.oracle.window.ContextWindow`'s to decide; ``max_turns``/``max_chars`` only cap further.
    """
    system = system_prompt(max_words=max_words, language=language, persona=persona, instructions=instructions)
    notes = [t.text for t in view.turns if t.role == "system"]
    if notes:  # system messages the client added to the conversation
        system += "\n\nNotes from the application:\n" + "\n".join(notes)
    messages: list[Message] = [{"role": "system", "content": system}]
    spoken = [t for t in view.turns if t.role != "system"]
    for turn in bound_turns(spoken, max_turns=max_turns, max_chars=max_chars):
        _add(messages, turn.role, turn.text)
    pending = " ".join(view.pending_user.split())
    if pending:
        _add(messages, "user", f"{PENDING_MARK} {pending}")
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": SILENCE_MARK})
    return messages


def build_messages_from_config(
    view: TranscriptView,
    config: OracleConfig,
    *,
    persona: str | None = None,
    instructions: str | None = None,
) -> list[Message]:
    """:func:`build_messages` with the config's turn cap; ``persona``/``instructions`` override it."""
    return build_messages(
        view,
        max_words=config.max_answer_words,
        language=config.language,
        persona=config.persona if persona is None else persona,
        instructions=config.instructions if instructions is None else instructions,
        max_turns=config.history_max_turns,
    )


def _add(messages: list[Message], role: str, text: str) -> None:
    if messages[-1]["role"] == role:
        messages[-1] = {"role": role, "content": f"{messages[-1]['content']} {text}"}
    else:
        messages.append({"role": role, "content": text})
