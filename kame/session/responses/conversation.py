"""The back-end conversation of a Responses-delegation session, and the prompt built from it. No I/O.

In Responses delegation the back-end keeps its own conversation, like a
Responses API conversation: what the user said (the stable transcript, up
to each delegation), what the back-end itself answered (its text, its
function calls) and what came back (the client's ``function_call_output``
items), plus items the client adds with ``response.item.create``. Moshi's
spoken rendition is not in it: the back-end sees its own answers, which
are what it reasons from (and what a client's ``input`` history looks
like), not a speech model's paraphrase of them.

Context that is not conversation goes into the one leading system message
(some OpenAI-compatible servers refuse a second one), in this order:
kame's rules for spoken answers (the same as the oracle's), the
delegation's ``instructions`` (the back-end prompt, distinct from the
session's front-end instructions), then the developer messages of the
initial ``input``, ``session.instructions.append`` and
``session.thinking.append`` contents, each in the order received.

:class:`ConversationLog` is owned by one session (one writer); the builder
:func:`build_backend_messages` is pure and returns chat-completions
messages, tool calls included, ready for the tool loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kame.oracle.prompt import PENDING_MARK, SILENCE_MARK, system_prompt

Message = dict[str, Any]

#: Said to the back-end in place of an output that never came.
NO_OUTPUT = "No result yet: the function has not returned an output."
TOOLS_HINT = (
    "You may call the functions you are given when they help answer. Before a call that takes a "
    "moment you may first write a very short spoken phrase, such as a few words saying you are "
    "checking; after the result comes back, give the answer itself."
)


@dataclass(frozen=True)
class UserSpeech:
    """What the user said (the stable transcript of a turn or part of one)."""

    text: str


@dataclass(frozen=True)
class ClientMessage:
    """A text message item from the initial ``input`` or a ``response.item.create``."""

    role: Literal["user", "assistant", "developer", "system"]
    text: str


@dataclass(frozen=True)
class Note:
    """Context for the system message: an appended instruction, a thinking note, a developer message."""

    kind: Literal["instructions", "thinking", "developer"]
    text: str


@dataclass(frozen=True)
class CallRecord:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class BackendTurn:
    """One round of the back-end: the text it wrote and the function calls it made."""

    text: str
    calls: tuple[CallRecord, ...] = ()


@dataclass(frozen=True)
class CallOutput:
    """The result of a function call, from the client (or kame's note that none came)."""

    call_id: str
    output: str


Entry = UserSpeech | ClientMessage | Note | BackendTurn | CallOutput


#: Entries kept per session (the prompt is bounded by characters anyway; this bounds memory).
MAX_ENTRIES = 2000


@dataclass
class ConversationLog:
    """Everything the back-end has seen or said in this session, in order (the oldest go past ``max_entries``)."""

    entries: list[Entry] = field(default_factory=list)
    max_entries: int = MAX_ENTRIES

    def add(self, entry: Entry) -> None:
        if isinstance(entry, (UserSpeech, ClientMessage, Note)) and not entry.text.strip():
            return
        if isinstance(entry, BackendTurn) and not entry.text.strip() and not entry.calls:
            return
        self.entries.append(entry)
        if len(self.entries) > self.max_entries:
            del self.entries[: len(self.entries) - self.max_entries]

    def add_initial_input(self, items: Sequence[Mapping[str, Any]]) -> None:
        """The session's ``input``: developer, user and assistant messages with one text part each."""
        for item in items:
            role = item.get("role")
            text = "".join(str(part.get("text", "")) for part in item.get("content") or () if isinstance(part, Mapping))
            if role == "developer":
                self.add(Note("developer", text))
            elif role in ("user", "assistant"):
                self.add(ClientMessage(role, text))

    def pending_calls(self) -> list[CallRecord]:
        """Function calls of the back-end that have no output yet, oldest first."""
        answered = {e.call_id for e in self.entries if isinstance(e, CallOutput)}
        return [
            call for e in self.entries if isinstance(e, BackendTurn) for call in e.calls if call.call_id not in answered
        ]

    def has_call(self, call_id: str) -> bool:
        return any(isinstance(e, BackendTurn) and any(c.call_id == call_id for c in e.calls) for e in self.entries)

    def has_output(self, call_id: str) -> bool:
        return any(isinstance(e, CallOutput) and e.call_id == call_id for e in self.entries)


def log_turns(log: ConversationLog) -> list[list[str]]:
    """The log as ``[role, text]`` pairs another replica can rebuild it from (a session resumed there: its
    function calls and outputs are left out; notes come as ``note:<kind>``)."""
    out: list[list[str]] = []
    for entry in log.entries:
        if isinstance(entry, UserSpeech):
            out.append(["user", entry.text])
        elif isinstance(entry, ClientMessage):
            out.append([entry.role, entry.text])
        elif isinstance(entry, Note):
            out.append([f"note:{entry.kind}", entry.text])
        elif isinstance(entry, BackendTurn) and entry.text.strip():
            out.append(["assistant", entry.text])
    return out


def restore_log(log: ConversationLog, turns: Sequence[Sequence[str]]) -> int:
    """Replace the log's entries with ``turns`` (:func:`log_turns`' output); how many were taken."""
    log.entries.clear()
    for role, text in turns:
        if role in ("user", "assistant", "developer", "system"):
            log.add(ClientMessage(role, text))  # type: ignore[arg-type]
        elif role in ("note:instructions", "note:thinking", "note:developer"):
            log.add(Note(role.removeprefix("note:"), text))  # type: ignore[arg-type]
    return len(log.entries)


def build_system_message(
    *,
    instructions: str | None,
    notes: Sequence[Note] = (),
    max_words: int = 30,
    language: str = "English",
    tools: bool = False,
) -> str:
    """kame's spoken-answer rules, the delegation's instructions, then the notes in order."""
    text = system_prompt(max_words=max_words, language=language, instructions=instructions)
    if tools:
        text += "\n\n" + TOOLS_HINT
    developer = [n.text.strip() for n in notes if n.kind == "developer"]
    added = [n.text.strip() for n in notes if n.kind == "instructions"]
    thinking = [n.text.strip() for n in notes if n.kind == "thinking"]
    if developer:
        text += "\n\nDeveloper messages:\n" + "\n".join(f"- {t}" for t in developer)
    if added:
        text += "\n\nInstructions added during the conversation:\n" + "\n".join(f"- {t}" for t in added)
    if thinking:
        text += "\n\nContext noted during the conversation (never say it unless it answers the user):\n" + "\n".join(
            f"- {t}" for t in thinking
        )
    return text


def build_backend_messages(
    log: ConversationLog,
    *,
    instructions: str | None,
    pending_user: str = "",
    max_words: int = 30,
    language: str = "English",
    tools: bool = False,
    max_chars: int | None = 16_000,
    continuing: bool = False,
) -> list[Message]:
    """Chat-completions messages for the next back-end request.

    ``pending_user`` is the user's unfinished speech (speculative requests):
    it follows the conversation after :data:`PENDING_MARK`. The list ends
    with a user message (:data:`SILENCE_MARK` when nothing new was said),
    unless ``continuing`` a round whose calls were just answered: then it
    ends with their ``tool`` messages, as the chat-completions tool loop
    expects. A call without an output is answered with :data:`NO_OUTPUT`,
    so every assistant ``tool_calls`` message is followed by one ``tool``
    message per call (OpenAI's API rejects a conversation otherwise).
    ``max_chars`` bounds the conversation part: the oldest entries go first,
    a back-end round always together with its outputs.
    """
    notes = [e for e in log.entries if isinstance(e, Note)]
    system = build_system_message(
        instructions=instructions, notes=notes, max_words=max_words, language=language, tools=tools
    )
    outputs = {e.call_id: e.output for e in log.entries if isinstance(e, CallOutput)}
    blocks = [_render(e, outputs) for e in log.entries if not isinstance(e, (Note, CallOutput))]
    blocks = _bound(blocks, max_chars)
    messages: list[Message] = [{"role": "system", "content": system}]
    for block in blocks:
        for msg in block:
            _append(messages, msg)
    pending = " ".join(pending_user.split())
    if pending:
        _append(messages, {"role": "user", "content": f"{PENDING_MARK} {pending}"})
    last = messages[-1]["role"]
    if not (continuing and last == "tool") and last != "user":
        messages.append({"role": "user", "content": SILENCE_MARK})
    return messages


def _render(entry: Entry, outputs: Mapping[str, str]) -> list[Message]:
    if isinstance(entry, UserSpeech):
        return [{"role": "user", "content": " ".join(entry.text.split())}]
    if isinstance(entry, ClientMessage):
        if entry.role in ("developer", "system"):
            # Mid-conversation developer items stay in place, marked, as user-side context.
            return [{"role": "user", "content": f"[note from the application] {entry.text.strip()}"}]
        return [{"role": entry.role, "content": entry.text.strip()}]
    if isinstance(entry, BackendTurn):
        if not entry.calls:
            return [{"role": "assistant", "content": entry.text.strip()}]
        msgs: list[Message] = [
            {
                "role": "assistant",
                "content": entry.text.strip() or None,
                "tool_calls": [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments or "{}"},
                    }
                    for c in entry.calls
                ],
            }
        ]
        msgs.extend(
            {"role": "tool", "tool_call_id": c.call_id, "content": outputs.get(c.call_id, NO_OUTPUT)}
            for c in entry.calls
        )
        return msgs
    raise TypeError(f"not a conversation entry: {entry!r}")


def _size(block: Sequence[Message]) -> int:
    total = 0
    for msg in block:
        total += len(msg.get("content") or "")
        for call in msg.get("tool_calls") or ():
            total += len(call["function"]["arguments"]) + len(call["function"]["name"])
    return total


def _bound(blocks: list[list[Message]], max_chars: int | None) -> list[list[Message]]:
    if max_chars is None:
        return blocks
    kept: list[list[Message]] = []
    total = 0
    for block in reversed(blocks):
        size = _size(block)
        if kept and total + size > max_chars:
            break
        kept.append(block)
        total += size
    return kept[::-1]


def _append(messages: list[Message], msg: Message) -> None:
    """Merge consecutive plain user (or plain assistant) messages: some chat templates need alternation."""
    prev = messages[-1]
    if (
        msg["role"] in ("user", "assistant")
        and prev["role"] == msg["role"]
        and "tool_calls" not in prev
        and "tool_calls" not in msg
        and prev.get("content")
        and msg.get("content")
    ):
        messages[-1] = {"role": msg["role"], "content": f"{prev['content']} {msg['content']}"}
    else:
        messages.append(msg)
