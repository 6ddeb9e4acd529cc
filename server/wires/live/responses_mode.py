"""A Live session in Responses delegation: what :class:`~.wire.LiveWire` adds for it.

With ``delegation.type: "responses"`` kame's own back-end answers each
delegation (:mod:`.responses_run`), with the client's functions; the
client only runs function calls. This module joins that driver to the
wire:

- each user turn's final transcript goes into the back-end conversation,
  and the turn's delegation (``session.delegation.created``, target
  ``responses``, with the first ``response_id``) starts a delegation;
- ``session.instructions.append`` / ``session.thinking.append`` (with a
  null ``delegation_id``: the contract accepts no other here) and the
  initial ``input`` become back-end context;
- ``response.item.create`` / ``response.create`` go to the driver;
  ``response.create`` with nothing waiting asks for a new delegation;
- each round's text becomes an oracle answer (a new sequence: "let me
  check" and the answer built on a function's result are separate), judged
  by the wire's :class:`~.delegation.DelegationBook` like a late commentary
  (the rule of answers built on tools, docs/oracle.md): spoken unless the
  user has said more than a backchannel since the delegation.

The runtime provides :class:`ResponsesHooks` (the back-end, its send queue,
the oracle). ``send`` must keep one order with the events the wire's calls
return: the runtime queues those before it next awaits, so a delegation's
``session.delegation.created`` precedes its ``response.event`` stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kame.backend.speculation import ToolCallEvent
from kame.oracle.config import OracleConfig
from kame.oracle.debounce import Debouncer
from kame.server.wires.live.commentary import OracleAnswer, commentary_answer
from kame.server.wires.live.delegation import DelegationBook
from kame.server.wires.live.events import Info, KameEvent, LiveError, LiveEvent, ResponseEventOut
from kame.server.wires.live.responses_config import ResponsesDelegationSettings, ResponsesError
from kame.server.wires.live.responses_conversation import ClientMessage, ConversationLog, Note, UserSpeech
from kame.server.wires.live.responses_run import (
    DEFAULT_FUNCTION_TIMEOUT_S,
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_MAX_ROUNDS,
    PromptOptions,
    ResponsesDelegator,
    RoundSource,
    RoundText,
    ServerTools,
)
from kame.server.wires.live.responses_speculation import Speculator
from kame.server.wires.live.responses_stream import Event, new_id

Encode = Callable[[str], Sequence[int]]
_SPEAKERS: dict[str, Literal["user", "assistant"]] = {"user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class ResponsesHooks:
    """What the runtime gives a Live session that uses Responses delegation."""

    source: RoundSource  #: the back-end rounds (:func:`.responses_backend.registry_source`)
    send: Callable[[LiveEvent], None]  #: queue an event for the client (see the module docstring)
    answer: Callable[[OracleAnswer], None]  #: reset the session's oracle with an answer
    #: Run a delegation or a speculative request (the runtime's task factory; default: a loop task).
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]] | None = None
    function_timeout_s: float = DEFAULT_FUNCTION_TIMEOUT_S
    max_rounds: int = DEFAULT_MAX_ROUNDS
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS  #: longest function_call_output accepted
    #: Operator-configured MCP tools kame runs itself (:class:`.responses_backend.McpServerTools`).
    server_tools: ServerTools | None = None
    #: Ask the back-end on the growing transcript too (:mod:`.responses_speculation`), as KAME does.
    speculate: bool = True
    #: Tool-call metrics: (event, label) with label ``client_function`` or the MCP tool's name
    #: (``Metrics.on_tool_call(event, tool=label)``).
    on_tool_call: Callable[[ToolCallEvent, str], None] | None = None


class ResponsesMode:
    """The Responses delegation of one Live session (owned by its wire)."""

    def __init__(
        self,
        settings: Callable[[], ResponsesDelegationSettings],
        hooks: ResponsesHooks,
        *,
        book: DelegationBook,
        encode: Encode,
        oracle_config: OracleConfig,
        history: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.hooks = hooks
        self.book = book
        self.encode = encode
        self.oracle_config = oracle_config
        self.conversation = ConversationLog()
        for role, text in history:
            if role == "developer":
                self.conversation.add(Note("developer", text))
            elif role in _SPEAKERS:
                self.conversation.add(ClientMessage(_SPEAKERS[role], text))
        self._heard: list[str] = []
        prompt = PromptOptions(
            max_words=oracle_config.max_answer_words,
            language=oracle_config.language,
            max_chars=oracle_config.history_max_chars * 2,
        )
        self.delegator = ResponsesDelegator(
            settings=settings,
            source=hooks.source,
            send=self._send,
            on_round_text=self._round_text,
            conversation=self.conversation,
            prompt=prompt,
            function_timeout_s=hooks.function_timeout_s,
            max_rounds=hooks.max_rounds,
            max_output_chars=hooks.max_output_chars,
            spawn=hooks.spawn,
            server_tools=hooks.server_tools,
            on_tool_call=hooks.on_tool_call,
        )
        self.speculator: Speculator | None = None
        if hooks.speculate:
            self.speculator = Speculator(
                settings=settings,
                source=hooks.source,
                conversation=self.conversation,
                answer=self._speculative_answer,
                notify=lambda name, fields: hooks.send(KameEvent(name, fields)),
                debouncer=Debouncer.from_config(oracle_config),
                prompt=prompt,
                spawn=hooks.spawn,
            )

    # ------------------------------------------------------------------ the wire's calls

    def partial(self, now: float, utterance: int, stable: str) -> None:
        """The user's stable words grew: maybe a speculative request (never the client's functions)."""
        if self.speculator is not None:
            self.speculator.stable(now, utterance, stable)

    def tick(self, now: float) -> None:
        if self.speculator is not None:
            self.speculator.poll(now)

    def heard(self, text: str) -> None:
        """A user turn's final transcript (it goes to the back-end with the next delegation)."""
        if self.speculator is not None:
            self.speculator.final()
        if text.strip():
            self._heard.append(" ".join(text.split()))

    def delegate(self, delegation_id: str) -> str:
        """Start a delegation now (the user's words since the last one go first); returns its response id."""
        if self._heard:
            self.conversation.add(UserSpeech(" ".join(self._heard)))
            self._heard.clear()
        response_id = new_id("resp")
        self.delegator.start(delegation_id, response_id)
        return response_id

    def note(self, kind: Literal["instructions", "thinking"], text: str) -> None:
        self.conversation.add(Note(kind, text))

    def item_create(self, item: dict[str, Any], event_id: str | None) -> None:
        try:
            self.delegator.item_create(item)
        except ResponsesError as exc:
            raise LiveError(exc.code, exc.message, param=exc.param, client_event_id=event_id) from None

    def response_create(self, event_id: str | None) -> Literal["resumed", "new"]:
        try:
            return self.delegator.response_create()
        except ResponsesError as exc:
            raise LiveError(exc.code, exc.message, param=exc.param, client_event_id=event_id) from None

    async def aclose(self) -> None:
        if self.speculator is not None:
            await self.speculator.aclose()
        await self.delegator.aclose()

    def _speculative_answer(self, text: str) -> None:
        answer = commentary_answer(text, self.encode, self.oracle_config, None)
        if answer is None:
            return
        self.hooks.answer(answer)
        self.hooks.send(
            KameEvent(
                "kame.oracle.reset",
                {"delegation_id": None, "source": "speculation", "text": answer.text, "tokens": answer.steps},
            )
        )

    # ------------------------------------------------------------------ the driver's output

    def _send(self, event: Event) -> None:
        if event.get("type") == "response.event":
            self.hooks.send(ResponseEventOut(event["event"], event.get("delegation_id")))
        elif event.get("type") == "info":
            self.hooks.send(Info(str(event.get("code")), str(event.get("message"))))
        else:  # pragma: no cover - the driver sends nothing else
            raise ValueError(f"unexpected event {event.get('type')!r}")

    def _round_text(self, out: RoundText) -> None:
        verdict = self.book.judge(out.delegation_id, kind="response")
        if not verdict.speak:
            self.hooks.send(
                Info(
                    "delegation_superseded",
                    f"the answer of delegation {out.delegation_id} is kept in the back-end's conversation but "
                    "not spoken: the user has spoken since (more than a backchannel)",
                )
            )
            return
        answer = commentary_answer(out.text, self.encode, self.oracle_config, out.delegation_id)
        if answer is None:
            return
        self.hooks.answer(answer)
        self.hooks.send(
            KameEvent(
                "kame.responses.answer",
                {
                    "delegation_id": out.delegation_id,
                    "round": out.round,
                    "after_tools": out.after_tools,
                    "standing": verdict.standing,
                    "text": answer.text,
                    "tokens": len(answer.ids),
                },
            )
        )
