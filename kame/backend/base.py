"""The one protocol every LLM back-end speaks.

A back-end turns a chat (system/user/assistant messages) into a stream of
text chunks. KAME asks again every time the user's transcript grows and
throws the old answer away, so cancellation is part of the contract:
cancelling the consuming task, or closing the iterator (``aclose()``, or
leaving an ``async with contextlib.aclosing(...)`` block), must close the
underlying HTTP stream at once so the provider stops generating.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from 3.11; only read by the type checker here

    from kame.backend.tools import TurnOptions

Role = Literal["system", "user", "assistant"]
HealthStatus = Literal["ok", "unreachable", "auth_error", "error"]


@dataclass(frozen=True)
class ChatMessage:
    """One turn of the conversation."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


#: What ``stream`` accepts: ChatMessage objects or ``{"role": ..., "content": ...}`` dicts.
MessageLike = ChatMessage | Mapping[str, str]

_ROLES = ("system", "user", "assistant")


def normalize_messages(messages: Sequence[MessageLike]) -> list[dict[str, str]]:
    """Plain ``{"role", "content"}`` dicts, checked, so every back-end sees the same thing."""
    out: list[dict[str, str]] = []
    for i, msg in enumerate(messages):
        if isinstance(msg, ChatMessage):
            role, content = msg.role, msg.content
        else:
            role, content = msg.get("role"), msg.get("content")  # type: ignore[assignment]
        if role not in _ROLES:
            raise ValueError(f"message {i}: role must be one of {', '.join(_ROLES)} (got {role!r})")
        if not isinstance(content, str):
            raise ValueError(f"message {i}: content must be a string")
        out.append({"role": role, "content": content})
    if not out:
        raise ValueError("at least one message is needed")
    return out


def normalize_turn_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Like :func:`normalize_messages`, also accepting the messages of tool rounds.

    Those are an assistant message with ``tool_calls`` (content may be
    None) and ``tool`` messages (``tool_call_id`` and ``content``), in the
    chat-completions shape, or the objects of :mod:`kame.backend.tools`.
    """
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        as_dict = getattr(msg, "as_dict", None)
        data: Mapping[str, Any] = as_dict() if callable(as_dict) else msg
        role = data.get("role")
        if role == "tool":
            if not isinstance(data.get("tool_call_id"), str) or not isinstance(data.get("content"), str):
                raise ValueError(f"message {i}: a tool message needs tool_call_id and content strings")
            out.append({"role": "tool", "tool_call_id": data["tool_call_id"], "content": data["content"]})
        elif role == "assistant" and data.get("tool_calls"):
            content = data.get("content")
            if content is not None and not isinstance(content, str):
                raise ValueError(f"message {i}: content must be a string or null")
            out.append({"role": "assistant", "content": content, "tool_calls": list(data["tool_calls"])})
        else:
            out.extend(normalize_messages([data]))
    if not out:
        raise ValueError("at least one message is needed")
    return out


def has_tool_rounds(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for msg in reversed(messages):
        if msg.get("role") == "user":
            return msg.get("content", "")
    return ""


@dataclass(frozen=True)
class BackendHealth:
    """Result of a reachability check (safe to show to clients: no key, no headers)."""

    name: str
    kind: str
    status: HealthStatus
    reason: str = ""
    latency_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@runtime_checkable
class ToolCapableBackend(Protocol):
    """A back-end that can also be sent function tools (see :mod:`kame.backend.tools`).

    ``stream_turn`` yields text chunks (``str``) and
    :class:`~kame.backend.tools.ToolCallDelta` pieces of the calls the LLM
    makes; ``messages`` may hold tool rounds. Same cancellation contract
    as ``stream``. The options (:class:`~kame.backend.tools.TurnOptions`) are
    the same for every back-end and the registry.
    """

    def stream_turn(self, messages: Sequence[Any], **options: Unpack[TurnOptions]) -> AsyncGenerator[Any, None]: ...


@runtime_checkable
class LlmBackend(Protocol):
    """An LLM that streams its reply as text chunks."""

    name: str
    kind: str

    def stream(
        self,
        messages: Sequence[MessageLike],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> AsyncGenerator[str, None]:
        """Stream the reply; raises :class:`kame.backend.errors.BackendError` subclasses."""
        ...

    async def check(self) -> BackendHealth:
        """Is the back-end reachable (a short, cheap request; never raises)?"""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
