"""What a session's pipeline reports: one frozen dataclass per event, for wires, metrics, logs and timelines.

Defined in the core (no kame imports) because the parts below the session emit them too: the
oracle loop reports its requests, tools and answers with these types without importing the
session package (:mod:`kame.session.events` is the session's name for this module).

Every event has a ``name`` (the dotted name used in recordings, timelines and
logs, e.g. ``llm.first_token``) and :meth:`PipelineEvent.fields` (its data as a
plain dict, for JSON). Consumers match on the class (``isinstance`` or
``match``), never on strings, so a renamed field is a type error, not a
silently missing value.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True, kw_only=True)
class PipelineEvent:
    """Base of every pipeline event; ``t`` is ``time.monotonic()`` when it happened."""

    name: ClassVar[str] = "event"
    #: Whether the event carries user or assistant text (logged at debug level only).
    has_text: ClassVar[bool] = False
    t: float = field(default_factory=time.monotonic, compare=False, repr=False)

    def fields(self) -> dict[str, Any]:
        """The event's data (without ``t``) as a plain dict."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "t"}


# --------------------------------------------------------------------------- the front-end


@dataclass(frozen=True, kw_only=True)
class AssistantFrame(PipelineEvent):
    """One 80 ms output frame of the front-end, with the text piece sampled at that step.

    ``text_id`` is None inside the acoustic delay; ``piece`` is the SentencePiece piece of an id
    that carries text (:meth:`kame.vocab.TextVocab.is_text`: never pad or end of padding), else
    None. ``oracle_id`` is the oracle token fed at this step.
    """

    name: ClassVar[str] = "assistant.frame"
    step: int
    pcm: np.ndarray = field(repr=False)
    text_id: int | None
    piece: str | None
    oracle_id: int

    def fields(self) -> dict[str, Any]:
        return {"step": self.step, "text_id": self.text_id, "piece": self.piece, "oracle_id": self.oracle_id}


@dataclass(frozen=True, kw_only=True)
class EngineDown(PipelineEvent):
    """The engine can no longer step this session (a failed step, a failed command, or a dead thread).

    The event of :class:`kame.frontend.engine_thread.EngineFailed` (the exception); its recorded name
    stays ``engine.failed``.
    """

    name: ClassVar[str] = "engine.failed"
    message: str


# --------------------------------------------------------------------------- the user (ASR)


@dataclass(frozen=True, kw_only=True)
class SpeechStarted(PipelineEvent):
    name: ClassVar[str] = "asr.speech_started"
    utterance: int
    audio_s: float


@dataclass(frozen=True, kw_only=True)
class SpeechStopped(PipelineEvent):
    name: ClassVar[str] = "asr.speech_stopped"
    utterance: int
    audio_s: float


@dataclass(frozen=True, kw_only=True)
class UserPartial(PipelineEvent):
    """The current user turn so far; ``stable`` is the committed prefix; ``latency_s`` how far it lags the audio."""

    name: ClassVar[str] = "asr.partial"
    has_text: ClassVar[bool] = True
    utterance: int
    audio_s: float
    text: str
    stable: str = ""
    latency_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class UserFinal(PipelineEvent):
    name: ClassVar[str] = "asr.final"
    has_text: ClassVar[bool] = True
    utterance: int
    audio_s: float
    text: str


@dataclass(frozen=True, kw_only=True)
class EchoJudged(PipelineEvent):
    """The echo guard judged an utterance it held back (the assistant had just spoken): ``echo`` True,
    it only repeated the assistant's words and started no turn; False, it is the user's and went on.

    ``words`` of the hypothesis, ``matched`` the assistant said, ``extra`` it did not; ``delay_s``: how long
    after the assistant said the matched words the utterance began (None: nothing matched).
    """

    name: ClassVar[str] = "asr.echo_judged"
    has_text: ClassVar[bool] = True
    utterance: int
    audio_s: float
    echo: bool
    text: str
    words: int
    matched: int
    extra: int
    delay_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class AsrFailed(PipelineEvent):
    """The recogniser stopped; the session goes on without transcripts."""

    name: ClassVar[str] = "asr.error"
    utterance: int = 0
    audio_s: float = 0.0
    message: str = ""


# --------------------------------------------------------------------------- the back-end (LLM)


@dataclass(frozen=True, kw_only=True)
class LlmRequestStarted(PipelineEvent):
    """``tools``: the request goes through the tool loop (functions offered to the LLM)."""

    name: ClassVar[str] = "llm.request_started"
    request_id: int
    backend: str
    turn_id: int
    reason: str
    tools: bool = False


@dataclass(frozen=True, kw_only=True)
class LlmFirstToken(PipelineEvent):
    name: ClassVar[str] = "llm.first_token"
    request_id: int
    backend: str
    ttft_s: float


@dataclass(frozen=True, kw_only=True)
class LlmDone(PipelineEvent):
    name: ClassVar[str] = "llm.done"
    has_text: ClassVar[bool] = True
    request_id: int
    backend: str
    text: str
    duration_s: float
    tool_calls: int | None = None  #: calls made, for a request through the tool loop


@dataclass(frozen=True, kw_only=True)
class LlmCancelled(PipelineEvent):
    name: ClassVar[str] = "llm.cancelled"
    request_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class LlmDropped(PipelineEvent):
    """An answer the switch policy refused (an earlier turn's, or one that may not replace the fed one)."""

    name: ClassVar[str] = "llm.dropped"
    request_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class LlmDeferred(PipelineEvent):
    """A new request was not started: the running one waits on tools and the user only backchannelled."""

    name: ClassVar[str] = "llm.deferred"
    request_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class LlmError(PipelineEvent):
    """A request failed; ``error`` is the failure kind, ``message`` may hold URLs (mask before sending)."""

    name: ClassVar[str] = "llm.error"
    request_id: int
    backend: str
    error: str
    message: str


@dataclass(frozen=True, kw_only=True)
class BackendDown(PipelineEvent):
    name: ClassVar[str] = "backend.down"
    backend: str
    error: str
    retry_in_s: float


@dataclass(frozen=True, kw_only=True)
class BackendUp(PipelineEvent):
    name: ClassVar[str] = "backend.up"
    backend: str


@dataclass(frozen=True, kw_only=True)
class ToolsRefused(PipelineEvent):
    """The session's back-end refused function tools (``reason``: the server's words, may hold URLs:
    mask before sending); its answers go without tools. Once per session and back-end."""

    name: ClassVar[str] = "backend.tools_refused"
    backend: str
    reason: str


# --------------------------------------------------------------------------- tools


@dataclass(frozen=True, kw_only=True)
class ToolCallStarted(PipelineEvent):
    """The LLM called a function; ``arguments`` only where the session shows them."""

    name: ClassVar[str] = "tool.call_started"
    request_id: int
    call_id: str
    tool: str
    round: int
    arguments: str | None = None

    def fields(self) -> dict[str, Any]:
        out = super().fields()
        out["name"] = out.pop("tool")  # the timeline's and recordings' field name
        if self.arguments is None:
            out.pop("arguments")
        return out


@dataclass(frozen=True, kw_only=True)
class ToolCallFinished(PipelineEvent):
    name: ClassVar[str] = "tool.call_finished"
    request_id: int
    call_id: str
    tool: str
    outcome: str
    ok: bool
    duration_s: float | None
    round: int

    def fields(self) -> dict[str, Any]:
        out = super().fields()
        out["name"] = out.pop("tool")
        return out


@dataclass(frozen=True, kw_only=True)
class FunctionCallRequested(PipelineEvent):
    """The LLM called a function the client runs: the wire asks the client (its output comes back by
    ``Pipeline.deliver_function_output(call_id, output)``)."""

    name: ClassVar[str] = "tool.client_call"
    call_id: str
    tool: str
    arguments: str
    read_only: bool

    def fields(self) -> dict[str, Any]:
        out = super().fields()
        out["name"] = out.pop("tool")
        return out


# --------------------------------------------------------------------------- the oracle stream


@dataclass(frozen=True, kw_only=True)
class OracleReset(PipelineEvent):
    """A new answer starts in the oracle stream: the start id plus ``tokens - 1`` tokens were queued."""

    name: ClassVar[str] = "oracle.reset"
    has_text: ClassVar[bool] = True
    request_id: int
    tokens: int
    text: str


@dataclass(frozen=True, kw_only=True)
class OracleText(PipelineEvent):
    """More tokens of the answer being fed were queued; ``text`` is the answer fed so far."""

    name: ClassVar[str] = "oracle.text"
    has_text: ClassVar[bool] = True
    request_id: int
    tokens: int
    text: str


@dataclass(frozen=True, kw_only=True)
class OracleCleared(PipelineEvent):
    """The queued answer was dropped (the user barged in)."""

    name: ClassVar[str] = "oracle.cleared"
    reason: str


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True, kw_only=True)
class AnswerCancelled(PipelineEvent):
    """The answer in progress was stopped (:class:`~kame.session.commands.CancelAnswer`): the back-end's request
    was cancelled and the oracle stream cleared; ``reason``: ``client_cancelled`` or ``turn_detected``."""

    name: ClassVar[str] = "answer.cancelled"
    reason: str


@dataclass(frozen=True, kw_only=True)
class UserTurnCommitted(PipelineEvent):
    """With client turns: the ``turn``-th commit's transcript (the ASR's finals since the last commit)."""

    name: ClassVar[str] = "asr.turn_committed"
    has_text: ClassVar[bool] = True
    turn: int
    text: str


# --------------------------------------------------------------------------- delegated answers (kame.session.answer_source)


@dataclass(frozen=True, kw_only=True)
class DelegationOpened(PipelineEvent):
    """The session delegated an answer (client or Responses delegation): ``response_id`` names the Responses
    response that answers it (None: the client answers with appends). Its place on the session timeline is
    the wire's (it knows the output frames and transcript fragments sent)."""

    name: ClassVar[str] = "delegation.opened"
    delegation_id: str
    response_id: str | None = None
    client_event_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ContextAppended(PipelineEvent):
    """A client's append was taken (``kind``: instructions, thinking or commentary) at ``at_ms`` on the session
    timeline; its answer runs until ``end_ms``; ``unspoken`` says why a commentary was not spoken."""

    name: ClassVar[str] = "delegation.appended"
    kind: str
    delegation_id: str | None
    at_ms: int
    end_ms: int
    unspoken: str | None = None
    client_event_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class AnswerSpoken(PipelineEvent):
    """A delegated answer became a new oracle sequence of ``tokens`` steps (start id included)."""

    name: ClassVar[str] = "delegation.spoken"
    has_text: ClassVar[bool] = True
    delegation_id: str | None
    text: str
    tokens: int


@dataclass(frozen=True, kw_only=True)
class SourceNotice(PipelineEvent):
    """Something an answer source wants the client to know that changes nothing (Live: ``info``)."""

    name: ClassVar[str] = "delegation.notice"
    code: str
    message: str


@dataclass(frozen=True, kw_only=True)
class SourceProgress(PipelineEvent):
    """An answer source's own progress, as kame's extension event ``name`` with ``fields`` (``kame.backend.*``,
    ``kame.oracle.reset``, ``kame.responses.answer``)."""

    name: ClassVar[str] = "delegation.progress"
    has_text: ClassVar[bool] = True
    event: str
    data: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ResponsesStreamed(PipelineEvent):
    """One nested Responses streaming event of delegation ``delegation_id`` (Live: ``response.event``)."""

    name: ClassVar[str] = "delegation.responses_event"
    has_text: ClassVar[bool] = True
    event: dict[str, Any]
    delegation_id: str | None


AsrEvent = SpeechStarted | SpeechStopped | UserPartial | UserFinal | AsrFailed | EchoJudged
LlmEvent = (
    LlmRequestStarted | LlmFirstToken | LlmDone | LlmCancelled | LlmDropped | LlmDeferred | LlmError | BackendDown | BackendUp
    | ToolsRefused
)
ToolEvent = ToolCallStarted | ToolCallFinished | FunctionCallRequested
OracleEvent = OracleReset | OracleText | OracleCleared
DelegationEvent = DelegationOpened | ContextAppended | AnswerSpoken | SourceNotice | SourceProgress | ResponsesStreamed
