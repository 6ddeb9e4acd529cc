"""kame's own back-end requests while the user speaks, in Responses delegation.

KAME's point is to ask the LLM on the user's growing transcript, so that
Moshi's oracle already carries a likely answer when the user stops. In
Responses delegation the client's functions may run only for the request
made after the user's turn (the delegation, :mod:`.rounds`); the
requests before it are kame's business: they offer no function, their
answers go to the oracle only, and the client sees them only as
``kame.backend.*`` events (``request_started``, ``first_token``, ``done``,
``cancelled``, ``error``). They use the delegation's back-end, model and
instructions and the same back-end conversation, with the user's unfinished
words after :data:`~kame.oracle.prompt.PENDING_MARK`.

When to ask is the published debounce (:class:`~kame.oracle.debounce.Debouncer`
on the stable transcript: the words grew by ``min_new_words``, at most
``max_restarts`` per ``restart_window_s``); a newer request cancels the
older one (its HTTP stream is closed); the user's final transcript cancels
the last one, since the delegation answers from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kame.oracle.debounce import Debouncer, Trigger
from kame.session.responses.conversation import ConversationLog, build_backend_messages
from kame.session.responses.rounds import PromptOptions, RoundEnd, RoundRequest, RoundSource, loop_task
from kame.session.responses.settings import ResponsesDelegationSettings

log = logging.getLogger(__name__)

#: ``kame.*`` event name, fields.
Notify = Callable[[str, dict[str, Any]], None]


@dataclass
class _Request:
    id: int
    utterance: int
    text: str
    started: float
    task: asyncio.Task[None] | None = None


class Speculator:
    """The speculative requests of one session (single owner: the session's event loop)."""

    def __init__(
        self,
        *,
        settings: Callable[[], ResponsesDelegationSettings],
        source: RoundSource,
        conversation: ConversationLog,
        answer: Callable[[str], None],
        notify: Notify,
        debouncer: Debouncer,
        prompt: PromptOptions | None = None,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._source = source
        self._conversation = conversation
        self._answer = answer
        self._notify = notify
        self.debouncer = debouncer
        self._prompt = prompt or PromptOptions()
        self._spawn = spawn
        self._clock = clock
        self._ids = itertools.count(1)
        self._current: _Request | None = None
        self._latest: tuple[int, str] | None = None  # (utterance, stable text) for a pending trigger
        self.requests = 0

    # ------------------------------------------------------------------ transcript progress

    def stable(self, now: float, utterance: int, text: str) -> None:
        """The utterance's stable transcript is now ``text`` (as sent to the client)."""
        self._latest = (utterance, text)
        self._judge(self.debouncer.on_partial(now, utterance, text))

    def poll(self, now: float) -> None:
        """A start the rate limit held back may go now (called on the wire's tick)."""
        if self.debouncer.pending:
            self._judge(self.debouncer.poll(now))

    def final(self) -> None:
        """The user's turn ended: the delegation answers; the last speculative request stops."""
        self._latest = None
        self._cancel("the user's turn ended: the delegation answers")

    async def aclose(self) -> None:
        cur = self._current
        self._cancel("session ended")
        if cur is not None and cur.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await cur.task

    # ------------------------------------------------------------------ requests

    def _judge(self, trigger: Trigger) -> None:
        if trigger.start and self._latest is not None:
            utterance, text = self._latest
            self._start(utterance, text, trigger.reason or "words")

    def _start(self, utterance: int, text: str, reason: str) -> None:
        self._cancel("superseded by a newer request")
        settings = self._settings()
        req = _Request(next(self._ids), utterance, text, self._clock())
        self.requests += 1
        self._notify(
            "kame.backend.request_started",
            {"request_id": req.id, "backend": settings.target.backend, "turn_id": utterance, "reason": reason},
        )
        coro = self._run(req, settings)
        if self._spawn is not None:
            req.task = self._spawn(coro)
        else:
            req.task = loop_task(coro, f"kame-speculation-{req.id}")
        self._current = req

    def _cancel(self, reason: str) -> None:
        cur, self._current = self._current, None
        if cur is not None and cur.task is not None and not cur.task.done():
            cur.task.cancel()
            self._notify("kame.backend.cancelled", {"request_id": cur.id, "reason": reason})

    async def _run(self, req: _Request, settings: ResponsesDelegationSettings) -> None:
        request = RoundRequest(
            messages=build_backend_messages(
                self._conversation,
                instructions=settings.instructions,
                pending_user=req.text,
                max_words=self._prompt.max_words,
                language=self._prompt.language,
                max_chars=self._prompt.max_chars,
            ),
            functions=(),  # never the client's functions
            tool_choice=None,
            max_tokens=settings.max_output_tokens,
            backend=settings.target.backend,
            model=settings.target.model,
        )
        parts: list[str] = []
        try:
            gen = self._source(request)
            try:
                async for item in gen:
                    if isinstance(item, str) and item:
                        if not parts:
                            self._notify(
                                "kame.backend.first_token",
                                {
                                    "request_id": req.id,
                                    "backend": settings.target.backend,
                                    "ttft_s": round(self._clock() - req.started, 3),
                                },
                            )
                        parts.append(item)
                    elif not isinstance(item, (str, RoundEnd)):
                        log.debug("speculative request %d: the back-end called a tool (not offered)", req.id)
            finally:
                aclose = getattr(gen, "aclose", None)
                if aclose is not None:
                    await aclose()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed guess costs nothing but itself
            kind = getattr(exc, "kind", "internal")
            message = str(exc) if hasattr(exc, "kind") else "internal error"
            self._notify(
                "kame.backend.error",
                {"request_id": req.id, "backend": settings.target.backend, "error": kind, "message": message},
            )
            if self._current is req:
                self._current = None
            return
        text = "".join(parts).strip()
        self._notify(
            "kame.backend.done",
            {
                "request_id": req.id,
                "backend": settings.target.backend,
                "text": text,
                "duration_s": round(self._clock() - req.started, 3),
            },
        )
        if self._current is req:
            self._current = None
            if text:
                self._answer(text)
