"""The session's own LLM as its answer source: :class:`~kame.oracle.loop.OracleLoop` behind :class:`AnswerSource`.

The loop keeps the conversation the back-end sees and asks it on the user's partial and final transcripts
(KAME's requests) or when the client requests an answer; its answers reach the slot through the session's
:class:`~kame.session.answer_source.OracleWriter` (the loop's sink). This adapter only routes what the
pipeline hears and the session's commands to the loop.
"""

from __future__ import annotations

from kame.oracle.choice import OracleChoice
from kame.oracle.config import OracleConfig
from kame.oracle.loop import OracleLoop
from kame.oracle.transcript import Turn
from kame.session.answer_source import AnswerSource
from kame.session.commands import (
    AddContext,
    CancelAnswer,
    ConversationCommand,
    ForgetContext,
    ForgetSpeech,
    RequestAnswer,
)
from kame.session.events import PipelineEvent
from kame.session.settings import SessionSettings


class LlmAnswers(AnswerSource):
    """The session's LLM answers (``settings.llm`` and no delegation)."""

    kind = "llm"

    def __init__(self, loop: OracleLoop, oracle_config: OracleConfig, settings: SessionSettings) -> None:
        self.loop = loop
        self.oracle_config = oracle_config
        self.settings = settings
        loop.apply(OracleChoice.resolve(settings, oracle_config))
        loop.auto_requests = settings.backend_on_transcripts

    def partial(self, utterance: int, text: str, stable: str, now: float) -> None:
        self.loop.on_user_partial(text)

    def final(self, utterance: int, text: str, key: str, now: float) -> None:
        self.loop.on_user_final(text, key)

    def turn_end(self, text: str, key: str) -> None:
        self.loop.on_user_final(text, key)  # joins the history; asks nothing (no auto requests with client turns)

    def turn_cleared(self) -> None:
        self.loop.drop_pending("the client cleared the user's turn")

    def step(self, text_id: int | None, step: int) -> None:
        self.loop.on_assistant_token(text_id, step)

    def apply(self, command: ConversationCommand) -> list[PipelineEvent]:
        loop = self.loop
        if isinstance(command, CancelAnswer):
            loop.cancel(command.reason)
        elif isinstance(command, AddContext):
            loop.transcript.add_item(command.item.key, command.item.role, command.item.text)
        elif isinstance(command, ForgetContext):
            loop.transcript.forget(command.key)
        elif isinstance(command, ForgetSpeech):
            loop.transcript.forget_steps(command.start_step, command.end_step)
        elif isinstance(command, RequestAnswer):
            if command.continue_tools:
                return []  # the tool loop waiting on the client's outputs goes on by itself
            context = None
            if command.context is not None:
                context = [Turn(i.role, i.text, i.key) for i in command.context if i.text.strip()]
            loop.respond(command.instructions, context)
        else:
            return super().apply(command)
        return []

    def configure(self, settings: SessionSettings) -> None:
        old, self.settings = self.settings, settings
        if settings.oracle_part() != old.oracle_part():
            self.loop.apply(OracleChoice.resolve(settings, self.oracle_config))
        self.loop.auto_requests = settings.backend_on_transcripts
        if settings.client_turns and not old.client_turns:
            self.loop.transcript.user_final("")  # a partial in progress waits for the client's commit

    async def aclose(self) -> None:
        await self.loop.aclose()
