"""The settings a client may choose for its session: one model that every wire parses into. No I/O.

``/api/chat`` fills it from the URL's query string, ``/v1/realtime`` from
``session.update``; the pipeline and the runtime read it. ``None`` means "the
server's default" (``oracle.*`` of the config, the engine's sampling), so a
client that sets a value back to null gets the default again. The policy
names are the ``Literal`` types of :mod:`kame.oracle.switch`, defined there
once. :class:`~kame.oracle.choice.OracleChoice` (the oracle part with the defaults filled in)
lives in the oracle, which may not import this package.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, get_args

from kame.backend.tools import ToolSpec
from kame.oracle.choice import OracleChoice
from kame.oracle.switch import BargeInPolicy, Policy
from kame.oracle.window import AUTO, Truncation
from kame.session.delegation_rules import DelegationMode
from kame.session.responses.settings import ResponsesDelegationSettings

#: Names of the answer-switch policies and of the barge-in policies, in the order they are documented.
ORACLE_POLICIES: tuple[str, ...] = get_args(Policy)
BARGE_IN_POLICIES: tuple[str, ...] = get_args(BargeInPolicy)

__all__ = ["BARGE_IN_POLICIES", "ORACLE_POLICIES", "Delegation", "OracleChoice", "SessionSettings"]


@dataclass(frozen=True)
class Delegation:
    """Who answers a session whose answers are written outside kame's own LLM request
    (:mod:`kame.session.answer_source`): the client (``responses`` None: its commentary appends) or a
    Responses conversation on kame's back-ends with the client's functions (``responses``)."""

    mode: DelegationMode
    backchannel_words: int
    responses: ResponsesDelegationSettings | None = None
    #: What the client started with, kept as context: ``(kind, text)``, kind ``instructions`` or ``thinking``.
    context: tuple[tuple[str, str], ...] = ()
    #: The conversation the client started with, ``(role, text)`` (Responses delegation).
    history: tuple[tuple[str, str], ...] = ()
    #: Delegation ids are ``dlg_`` + this + a counter (the wire's session prefix: ids look like its others).
    id_prefix: str = ""


@dataclass(frozen=True)
class SessionSettings:
    """What a client chose (None: the server's default)."""

    backend: str | None = None
    oracle_policy: Policy | None = None
    barge_in: BargeInPolicy | None = None
    instructions: str | None = None
    #: The voice (a PersonaPlex checkpoint's voice name; None: its default). The persona is ``instructions``.
    voice: str | None = None
    oracle_delay_s: float | None = None
    text_temperature: float | None = None
    text_topk: int | None = None
    #: Record this session (only where the server has a ``server.record_dir``).
    record: bool = False
    #: ``/v1/realtime``: send the output frames outside responses (``kame.output_audio.delta``).
    silence_audio: bool = True
    #: False: kame asks no LLM for this session; the client's answers are the oracle's only source
    #: (``/v1/live/sessions`` in client delegation). Fixed for the session's life.
    llm: bool = True
    #: Functions the client defines and runs itself (``/v1/realtime`` ``session.tools``).
    functions: tuple[ToolSpec, ...] = ()
    #: ``auto`` (None), ``none``, ``required`` or the name of a tool the LLM must call.
    tool_choice: str | None = None
    #: Operator-configured MCP servers enabled by name (None: the server's and the back-end's defaults).
    mcp_servers: tuple[str, ...] | None = None
    #: The user starting to speak stops the answer in progress (``/v1/realtime`` ``turn_detection.interrupt_response``).
    interrupt_response: bool = False
    #: Who ends the user's turns: ``server_vad`` (the ASR) or ``client`` (``turn_detection: null``: only the client's
    #: commit ends a turn, and the back-end is asked only when the client requests an answer).
    turn_detection: str = "server_vad"
    #: False: the back-end is asked only when the client requests an answer (``create_response: false``); KAME's
    #: requests on partial and final transcripts are off. (Moshi itself still hears everything and may speak.)
    create_response: bool = True
    #: The echo guard (:mod:`kame.asr.echo_guard`): speech that only repeats what the assistant just said starts
    #: no turn (None: the server's ``asr.echo_guard.enabled``). For clients that send audio without echo
    #: cancellation (raw PCM or G.711 on speakers, telephone gateways).
    echo_guard: bool | None = None
    #: Delegated answers (:class:`Delegation`, ``/v1/live/sessions``): they choose the session's answer source;
    #: None: the session's own LLM when ``llm``, else nobody.
    delegation: Delegation | None = None
    #: How the conversation sent to the LLM is cut to the back-end's window (``/v1/realtime`` ``truncation``).
    truncation: Truncation = AUTO

    @property
    def client_turns(self) -> bool:
        return self.turn_detection == "client"

    @property
    def backend_on_transcripts(self) -> bool:
        """KAME's own requests (on the user's partial and final transcripts) are on."""
        return self.create_response and not self.client_turns

    def sampling(self) -> tuple[float | None, int | None]:
        """The per-session text sampling (temperature, top-k); always changed as a pair."""
        return self.text_temperature, self.text_topk

    def oracle_part(self) -> tuple[Any, ...]:
        """What the oracle loop reads (a change of it is applied to the loop)."""
        return self.backend, self.oracle_policy, self.barge_in, self.instructions, self.oracle_delay_s, self.truncation

    def tools_part(self) -> tuple[Any, ...]:
        """What the session's tools read (a change of it is applied to them)."""
        return self.backend, self.functions, self.tool_choice, self.mcp_servers

    def for_log(self) -> dict[str, Any]:
        """For recordings and logs (instructions shortened: they may be long; functions by name)."""
        out = asdict(self)
        if out.get("instructions"):
            out["instructions"] = out["instructions"][:200]
        out["functions"] = [f.name for f in self.functions]
        delegation = out.pop("delegation")
        if delegation is not None:  # a delegated session's (absent otherwise: recordings keep their shape)
            out["delegation"] = {"mode": delegation["mode"], "backchannel_words": delegation["backchannel_words"],
                                 "responses": delegation["responses"] is not None}
        return out
