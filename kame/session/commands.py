"""What a wire may ask of a session's conversation: one frozen dataclass per command, applied by
:meth:`kame.session.pipeline.Pipeline.apply`. No I/O.

The conversation the back-end sees (the oracle loop's transcript) and who
answers are the pipeline's; a wire only translates its protocol's events
into these commands (``/v1/realtime``: ``conversation.item.create``,
``.delete``, ``.truncate``, ``response.create``, ``response.cancel``).
Keys are the wire's own names for items (opaque strings); a user turn the
ASR heard is keyed :func:`utterance_key` by the pipeline itself, so a wire
can refer to it without knowing how the transcript stores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["user", "assistant", "system"]


class CommandRefused(ValueError):
    """A client's command the session cannot honour: the wire sends its protocol's ``error`` (with ``code``
    and ``param``, and the id of the client event that asked) and the session goes on."""

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def utterance_key(utterance: int) -> str:
    """The key of the user turn the ASR heard as ``utterance``."""
    return f"utterance:{utterance}"


def commit_key(commit: int) -> str:
    """The key of the user turn the client's ``commit``-th commit ended (client turns)."""
    return f"commit:{commit}"


@dataclass(frozen=True)
class ContextItem:
    """A message the client put into the conversation (text only: what the back-end reads)."""

    key: str
    role: Role
    text: str


@dataclass(frozen=True)
class AddContext:
    """A message joins the back-end's context at the end of the conversation; it asks nothing by itself."""

    item: ContextItem


@dataclass(frozen=True)
class ForgetContext:
    """Remove a message (a client's, or a user turn by :func:`utterance_key`) from the back-end's history."""

    key: str


@dataclass(frozen=True)
class ForgetSpeech:
    """Remove the assistant's words completed at output steps ``start_step <= step < end_step`` from the
    back-end's history (a deleted assistant item, or what the user did not hear of a truncated one)."""

    start_step: int
    end_step: int


@dataclass(frozen=True)
class RequestAnswer:
    """Ask the back-end now, for a reply fed to Moshi whatever the answer-switch policy.

    ``instructions`` replace the session's for this request; ``context``, when given, replaces the
    conversation for this request (a Realtime ``response.create`` with ``input``). ``continue_tools``:
    the client just delivered function outputs, so the tool loop in progress continues and no new request
    is made.
    """

    instructions: str | None = None
    context: tuple[ContextItem, ...] | None = None
    continue_tools: bool = False


@dataclass(frozen=True)
class CancelAnswer:
    """Stop the answer in progress: the back-end's request is cancelled and the oracle stream cleared.

    ``reason``: ``client_cancelled`` (the client asked) or ``turn_detected`` (the user started speaking
    and the session interrupts on speech).
    """

    reason: Literal["client_cancelled", "turn_detected"] = "client_cancelled"


@dataclass(frozen=True)
class CommitTurn:
    """The client ends the user's turn now (``input_audio_buffer.commit``): the ASR's final for the audio so
    far closes it. With client turns the pipeline reports :class:`~kame.session.events.UserTurnCommitted`."""


@dataclass(frozen=True)
class ClearTurn:
    """The client drops the user's turn in progress (``input_audio_buffer.clear``): its transcript and the
    back-end request made on it. Moshi has heard that audio already; nothing takes that back."""


@dataclass(frozen=True)
class SpeakAnswer:
    """An answer written outside the session's own LLM request (a Live ``session.commentary.append``): a new
    oracle sequence of these token ids, applied at once (never behind audio still queued), without any LLM.

    ``received_t`` (monotonic) is when the client's message arrived: the session reports how long the answer
    took to reach the oracle FIFO (:class:`~kame.session.answers.AnswerWritten`).
    """

    ids: tuple[int, ...]
    received_t: float


@dataclass(frozen=True)
class AppendAnswer:
    """A client's append in client delegation (Live ``session.{instructions,thinking,commentary}.append``): a
    commentary for an open (or general) delegation becomes a new oracle sequence, applied at once; every
    append is kept as context. ``at_ms``: now on the session timeline (the wire's); ``received_t`` (monotonic):
    when the client's message arrived (the answer's time to the FIFO is measured from it)."""

    kind: Literal["instructions", "thinking", "commentary"]
    content: str
    delegation_id: str | None
    at_ms: int
    received_t: float
    event_id: str | None = None


@dataclass(frozen=True)
class DeliverItem:
    """A client's function output or message for the Responses delegation (Live ``response.item.create``)."""

    item: dict[str, Any]
    event_id: str | None = None


@dataclass(frozen=True)
class Delegate:
    """The client asks for a response in Responses delegation (Live ``response.create``): a delegation of its own
    on the conversation so far, or the response waiting for its function outputs goes on."""

    event_id: str | None = None


#: What only a delegated session's answer source takes (:mod:`kame.session.answer_source`).
DelegationCommand = AppendAnswer | DeliverItem | Delegate

ConversationCommand = (
    AddContext | ForgetContext | ForgetSpeech | RequestAnswer | CancelAnswer | CommitTurn | ClearTurn | SpeakAnswer
    | AppendAnswer | DeliverItem | Delegate
)
