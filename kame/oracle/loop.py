"""The oracle loop of one session: ASR events -> LLM requests -> oracle tokens.

Pure decisions live elsewhere (:mod:`~kame.oracle.debounce`,
:mod:`~kame.oracle.switch`, :mod:`~kame.oracle.prompt`,
:mod:`~kame.oracle.word_tokenizer`); this class wires them to the clock, the
back-ends and the session's oracle stream (its pipeline):

* every user event is judged at once by the debouncer; a start cancels the
  running request (its HTTP stream is closed) and sends a new one built from
  the transcript;
* the answer streams in its own task; its settled words are tokenized
  word-stably and, once the answer-switch policy accepts it, reach the slot as
  ``reset(start + first word)`` then ``push(next words)``; until then the old
  answer keeps playing;
* an answer for an earlier user turn is dropped;
* back-end failures are reported (``llm.error``, ``backend.down``), counted,
  and retried on the next trigger after a backoff; the audio never waits on
  any of it (nothing here runs in the engine thread, and the slot calls only
  queue commands).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from kame.backend.errors import BackendError, UnknownBackend
from kame.backend.registry import BackendRegistry
from kame.backend.tool_loop import CallFinished, CallsRequested, LoopDone, TextDelta, ToolLoop
from kame.backend.tools import ToolCall
from kame.events import (
    BackendDown,
    BackendUp,
    LlmCancelled,
    LlmDeferred,
    LlmDone,
    LlmDropped,
    LlmError,
    LlmFirstToken,
    LlmRequestStarted,
    OracleCleared,
    OracleReset,
    OracleText,
    PipelineEvent,
    ToolCallFinished,
    ToolCallStarted,
    ToolsRefused,
)
from kame.oracle.choice import OracleChoice
from kame.oracle.config import OracleConfig
from kame.oracle.debounce import Debouncer, Trigger
from kame.oracle.prompt import build_messages_from_config
from kame.oracle.sanitize import SanitizeOptions, settled_words, spoken_words
from kame.oracle.session_tools import SessionTools
from kame.oracle.switch import FeedState, decide_barge_in, decide_switch, only_backchannels
from kame.oracle.transcript import Transcript, TranscriptView, Turn
from kame.oracle.window import AUTO, ContextWindow, Truncation, context_tokens_of, reply_tokens_of
from kame.oracle.word_tokenizer import WordStreamTokenizer

log = logging.getLogger(__name__)

Emit = Callable[[PipelineEvent], None]


class OracleSink(Protocol):
    """Where oracle tokens go: the session's oracle stream, whose one writer into the engine slot is the session's
    :class:`~kame.session.answer_source.OracleWriter` (non-blocking calls)."""

    def oracle_reset(self, first_ids: list[int]) -> None: ...

    def oracle_push(self, ids: list[int]) -> None: ...

    def oracle_clear(self) -> None: ...


@dataclass
class SessionOracleSettings:
    """What a client may change mid-session."""

    backend: str | None = None
    policy: str = "reset"
    barge_in: str = "keep"
    instructions: str | None = None
    oracle_delay_s: float = 0.0
    truncation: Truncation = AUTO


@dataclass
class _Request:
    id: int
    turn_id: int
    backend: str
    started: float
    task: asyncio.Task[None] | None = None
    first_token_t: float | None = None
    turn_ended: bool = False  #: made after the user's turn ended (side-effecting tools allowed)
    tool_bound: bool = False  #: it called tools: its answer is built on their results
    requested: bool = False  #: the client asked for it (fed whatever the answer-switch policy)


@dataclass
class _Segment:
    """One oracle sequence's worth of an answer: the text before a tool call, or the answer after."""

    after_tools: bool
    raw: str = ""
    tokenizer: WordStreamTokenizer | None = None
    ignored: bool = False  #: the switch policy dropped it
    full: bool = False  #: max_fed_words reached


class OracleLoop:
    """One per session. Call its ``on_*`` methods from the event loop."""

    def __init__(
        self,
        *,
        config: OracleConfig,
        registry: BackendRegistry | None,
        sink: OracleSink,
        encode: Callable[[str], Sequence[int]],
        piece_of: Callable[[int], str] | None,
        emit: Emit,
        settings: SessionOracleSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        tools: SessionTools | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.sink = sink
        self.encode = encode
        self.emit = emit
        self.clock = clock
        self.settings = settings or SessionOracleSettings(
            policy=config.policy, barge_in=config.barge_in, instructions=config.instructions,
            oracle_delay_s=config.oracle_delay_s,
        )
        self.transcript = Transcript.from_config(config, piece_of=piece_of)
        self.window = ContextWindow()  #: what of the conversation fits the back-end's window
        self.debouncer = Debouncer.from_config(config)
        self.feed = FeedState()
        self._feed_tokenizer: WordStreamTokenizer | None = None
        self._ids = itertools.count(1)
        self._current: _Request | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._backoff_until = 0.0
        self._failures = 0
        self._down = False
        self.closed = False
        #: False: the back-end is asked only by :meth:`respond` (the client requests every answer)
        self.auto_requests = True
        self.tools = tools
        self._turn_words: dict[int, int] = {}
        self._tools_noticed: set[str] = set()  #: back-ends whose refusal of tools this session was told
        self.counters = {"requests": 0, "cancelled": 0, "errors": 0, "dropped": 0, "resets": 0, "tokens": 0}

    # ------------------------------------------------------------------ settings
    @property
    def enabled(self) -> bool:
        return self.registry is not None and bool(self.registry.names)

    def set_backend(self, name: str | None) -> str:
        """Switch back-end (by name only); the next request goes there. Raises UnknownBackend."""
        if self.registry is None:
            raise UnknownBackend(name, [])
        resolved = self.registry.resolve_name(name)
        self.settings.backend = resolved
        return resolved

    def apply(self, choice: OracleChoice) -> None:
        """A session's settings (defaults filled in): all of them, or none when the back-end is unknown."""
        backend = self.set_backend(choice.backend) if (choice.backend is not None or self.registry is not None) else None
        self.settings = SessionOracleSettings(
            backend=backend, policy=choice.policy, barge_in=choice.barge_in,
            instructions=choice.instructions, oracle_delay_s=choice.oracle_delay_s, truncation=choice.truncation,
        )

    # ------------------------------------------------------------------ inputs
    def on_user_partial(self, text: str) -> None:
        update = self.transcript.user_partial(text)
        if update is None:
            return
        if update.new_turn:
            self._new_user_turn()
        self._count_words(update.turn_id, update.word_count)
        self._judge(self.debouncer.on_partial(self.clock(), update.turn_id, update.text))

    def on_user_final(self, text: str, key: str | None = None) -> None:
        was_open = self.transcript.user_open
        update = self.transcript.user_final(text, key)
        if update.new_turn and not was_open:
            self._new_user_turn()
        self._count_words(update.turn_id, update.word_count)
        if update.text:
            self._judge(self.debouncer.on_final(self.clock(), update.turn_id, update.text))

    def drop_pending(self, reason: str) -> None:
        """The user's turn in progress is dropped (the client cleared it): its partial leaves the transcript
        and the request made on it is cancelled."""
        self.transcript.user_final("")
        cur = self._current
        if cur is not None and not cur.requested:
            self._cancel_current(reason)

    def on_assistant_token(self, token_id: int | None, step: int | None = None) -> None:
        """The front-end's text token of one step (None while nothing is generated); ``step``: the output step."""
        if token_id is None:
            self.transcript.assistant_idle(step)
        else:
            self.transcript.assistant_token(token_id, step)
        if self.feed.turn_id is not None and self.transcript.assistant_spoke != self.feed.assistant_spoke:
            self.feed = replace(self.feed, assistant_spoke=self.transcript.assistant_spoke)

    def _new_user_turn(self) -> None:
        speaking = self.transcript.assistant_speaking(self.config.barge_in_idle_steps)
        decision = decide_barge_in(self.settings.barge_in, new_user_turn=True, assistant_speaking=speaking)  # type: ignore[arg-type]
        if decision.clear_queue:
            self.sink.oracle_clear()
            self.emit(OracleCleared(reason=decision.reason))
        cur = self._current
        if cur is not None and cur.turn_id != self.transcript.user_turn_id and not cur.tool_bound:
            self._cancel_current("a new user turn began")

    # ------------------------------------------------------------------ answers built on tools
    def _count_words(self, turn_id: int, words: int) -> None:
        self._turn_words[turn_id] = max(words, self._turn_words.get(turn_id, 0))
        for old in [t for t in self._turn_words if t < turn_id - 8]:
            del self._turn_words[old]
        cur = self._current
        if cur is not None and cur.tool_bound and not self._backchannel_only(cur.turn_id):
            self._cancel_current("the user said more than a backchannel while tools ran")

    def _backchannel_only(self, turn_id: int) -> bool:
        """Every user turn after ``turn_id`` is a backchannel (fewer than tool_backchannel_words words)."""
        later = [self._turn_words.get(t, 0) for t in range(turn_id + 1, self.transcript.user_turn_id + 1)]
        return only_backchannels(later, self.config.tool_backchannel_words)

    # ------------------------------------------------------------------ asked by the client
    def respond(self, instructions: str | None = None, context: Sequence[Turn] | None = None) -> int | None:
        """Ask the back-end now (a client's ``response.create``); its answer is fed whatever the switch policy.

        ``instructions`` replace the session's for this request, ``context`` the conversation. Returns the
        request id (None: no back-end, or it is backing off after failures).
        """
        if self.closed or not self.enabled:
            return None
        if self.clock() < self._backoff_until:
            return None
        return self._start(Trigger(True, "client", self.transcript.user_turn_id), requested=True,
                           instructions=instructions, context=context)

    def cancel(self, reason: str) -> None:
        """Stop the answer in progress (a client's ``response.cancel``, or speech when the session interrupts):
        its request is cancelled and the oracle stream cleared, so the next answer starts a new sequence."""
        self._cancel_current(reason)
        self.sink.oracle_clear()
        self._feed_tokenizer = None
        self.feed = FeedState()
        self.emit(OracleCleared(reason=reason))

    # ------------------------------------------------------------------ requests
    def _judge(self, trigger: Trigger) -> None:
        if self.closed or not self.enabled or not self.auto_requests:
            return
        if trigger.start:
            self._start(trigger)
        elif trigger.pending and trigger.retry_at is not None:
            self._schedule_poll(trigger.retry_at)

    def _schedule_poll(self, at: float) -> None:
        if self._retry is not None:
            self._retry.cancel()
        loop = asyncio.get_running_loop()
        self._retry = loop.call_later(max(0.0, at - self.clock()), self._poll)

    def _poll(self) -> None:
        self._retry = None
        self._judge(self.debouncer.poll(self.clock()))

    def _start(self, trigger: Trigger, *, requested: bool = False, instructions: str | None = None,
               context: Sequence[Turn] | None = None) -> int | None:
        now = self.clock()
        if now < self._backoff_until and not requested:
            self._schedule_poll_after_backoff()
            return None
        assert self.registry is not None
        cur = self._current
        if cur is not None and cur.tool_bound and cur.turn_id != self.transcript.user_turn_id \
                and self._backchannel_only(cur.turn_id):
            # A backchannel while tools run: the answer on their results is still wanted.
            self.emit(LlmDeferred(request_id=cur.id, reason="backchannel while tools run"))
            return None
        self._cancel_current("superseded by a newer request")
        backend = self.registry.resolve_name(self.settings.backend)
        turn_ended = requested or trigger.reason == "final" or not self.transcript.user_open
        req = _Request(id=next(self._ids), turn_id=trigger.turn_id or self.transcript.user_turn_id, backend=backend,
                       started=now, turn_ended=turn_ended, requested=requested)
        view = self.transcript.view()
        if context is not None:
            view = TranscriptView(tuple(context), "", view.user_turn_id)
        self.counters["requests"] += 1
        use_tools = self.tools is not None and bool(self.tools.specs) and self.registry.tools_allowed(backend)
        if use_tools and self.registry.tools_refused(backend) is not None:
            use_tools = False  # its server refused tools earlier in this process: ask without them
            self._notice_tools_refused(backend)
        messages = self._fit(backend, build_messages_from_config(
            view, self.config, instructions=self.settings.instructions if instructions is None else instructions),
            tools=use_tools)
        self.emit(LlmRequestStarted(request_id=req.id, backend=backend, turn_id=req.turn_id, reason=trigger.reason or "words",
                                    tools=use_tools))
        work = self._consume(req, messages, tools=use_tools)
        req.task = asyncio.get_running_loop().create_task(work, name=f"kame-llm-{req.id}")
        self._current = req
        return req.id

    def _fit(self, backend: str, messages: list[dict[str, str]], *, tools: bool) -> list[dict[str, str]]:
        """The conversation that fits ``backend``'s context window (the oldest turns dropped first)."""
        assert self.registry is not None
        cfg = self.registry.config_of(backend)
        specs = [s.as_openai() for s in self.tools.specs] if tools and self.tools is not None else []
        return self.window.fit(messages, context_tokens=context_tokens_of(cfg), reply_tokens=reply_tokens_of(cfg),
                               tools=specs, truncation=self.settings.truncation)

    def _schedule_poll_after_backoff(self) -> None:
        # A trigger during backoff is not lost: the debouncer keeps no pending start for it,
        # so retry with the latest transcript when the backoff ends.
        if self._retry is None:
            loop = asyncio.get_running_loop()
            self._retry = loop.call_later(max(0.0, self._backoff_until - self.clock()), self._retry_after_backoff)

    def _retry_after_backoff(self) -> None:
        self._retry = None
        if self.closed or not self.auto_requests:
            return
        view = self.transcript.view()
        text = view.pending_user or (view.turns[-1].text if view.turns and view.turns[-1].role == "user" else "")
        if text:
            self._start(Trigger(True, "words", self.transcript.user_turn_id))

    def _cancel_current(self, reason: str) -> None:
        req = self._current
        self._current = None
        if req is not None and req.task is not None and not req.task.done():
            req.task.cancel()
            self.counters["cancelled"] += 1
            self.emit(LlmCancelled(request_id=req.id, reason=reason))

    async def _consume(self, req: _Request, messages: list[dict[str, str]], *, tools: bool) -> None:
        """One request's life: its answer streamed (through the tool loop with ``tools``); a failure reported
        and backed off, never the session's end; the request let go however it ends."""
        try:
            await (self._stream_tools(req, messages) if tools else self._stream(req, messages))
        except asyncio.CancelledError:
            raise
        except BackendError as exc:
            self._failed(req, exc)
        except Exception as exc:  # noqa: BLE001 - a bug here must not end the session
            log.exception("oracle request %d failed", req.id)
            self._failed(req, BackendError(req.backend, f"internal error ({type(exc).__name__})"))
        finally:
            if self._current is req:
                self._current = None

    async def _stream(self, req: _Request, messages: list[dict[str, str]]) -> None:
        """A request without tools: the LLM's answer, streamed to the oracle."""
        assert self.registry is not None
        seg = _Segment(after_tools=False)
        reply = self.registry.stream(req.backend, messages, max_tokens=max(64, 4 * self.config.max_answer_words))
        async with reply:
            async for chunk in reply:
                if req.first_token_t is None:
                    self._first_token(req, reply.backend or req.backend)
                    if self.settings.oracle_delay_s > 0:
                        await asyncio.sleep(self.settings.oracle_delay_s)
                if not self._segment_text(req, seg, chunk):
                    if seg.ignored:
                        return
                    break  # enough words fed: closing the stream stops the LLM
        if not self._segment_end(req, seg):
            return
        self.emit(LlmDone(request_id=req.id, backend=reply.backend or req.backend, text=seg.raw,
                         duration_s=self.clock() - req.started))

    async def _stream_tools(self, req: _Request, messages: list[dict[str, str]]) -> None:
        """A request through the tool loop: pre-call text and the answer on the results are two sequences."""
        assert self.registry is not None and self.tools is not None
        tools = self.tools
        offered = tools.calls.offered(tools.specs, turn_ended=req.turn_ended)
        executor = tools.calls.executor(turn_id=req.turn_id, turn_ended=req.turn_ended)
        prior = tools.calls.carry_over() if req.turn_ended else []
        all_calls: list[ToolCall] = [p.call for p in prior]
        if prior:
            req.tool_bound = True
        seg = _Segment(after_tools=bool(prior))
        runner = ToolLoop(self.registry, tools.limits, clock=self.clock)
        choice = tools.tool_choice
        if choice not in (None, "auto", "none", "required") and not any(t.name == choice for t in offered):
            choice = None  # the forced tool is not offered to this request (e.g. a side effect on a partial)
        events = runner.run(req.backend, messages, offered, executor, prior=prior, tool_choice=choice,
                            max_tokens=max(64, 4 * self.config.max_answer_words))
        async with contextlib.aclosing(events):
            async for ev in events:
                if isinstance(ev, TextDelta):
                    if req.first_token_t is None:
                        self._notice_tools_refused(req.backend)  # this very request may have been refused
                        self._first_token(req, req.backend)
                    if ev.after_tools != seg.after_tools:
                        self._segment_end(req, seg)
                        seg = _Segment(after_tools=ev.after_tools)
                    if not self._segment_text(req, seg, ev.text) and seg.after_tools:
                        break  # the answer on the results is dropped or fed in full: stop the LLM
                elif isinstance(ev, CallsRequested):
                    if req.first_token_t is None:
                        self._first_token(req, req.backend)
                    self._segment_end(req, seg)  # "let me check" goes out whole, now
                    seg = _Segment(after_tools=True)
                    req.tool_bound = True
                    executor.pre_call_text = ev.text
                    all_calls.extend(ev.calls)
                    for call in ev.calls:
                        self.emit(ToolCallStarted(
                            request_id=req.id, call_id=call.id, tool=call.name, round=ev.round,
                            arguments=call.arguments if tools.include_arguments else None))
                elif isinstance(ev, CallFinished):
                    self.emit(ToolCallFinished(
                        request_id=req.id, call_id=ev.call.id, tool=ev.call.name, outcome=ev.result.outcome,
                        ok=ev.result.ok, duration_s=ev.duration_s, round=ev.round))
                elif isinstance(ev, LoopDone):
                    break
        self._segment_end(req, seg)
        self._notice_tools_refused(req.backend)
        tools.calls.mark_delivered(all_calls)
        self.emit(LlmDone(request_id=req.id, backend=req.backend, text=seg.raw,
                         duration_s=self.clock() - req.started, tool_calls=len(all_calls)))

    def _notice_tools_refused(self, backend: str) -> None:
        """Tell the session once that its back-end's server refused tools (answers go without them)."""
        assert self.registry is not None
        reason = self.registry.tools_refused(backend)
        if reason is not None and backend not in self._tools_noticed:
            self._tools_noticed.add(backend)
            self.emit(ToolsRefused(backend=backend, reason=reason))

    def _first_token(self, req: _Request, backend: str) -> None:
        req.first_token_t = self.clock()
        self.emit(LlmFirstToken(request_id=req.id, backend=backend, ttft_s=req.first_token_t - req.started))
        self._succeeded()

    def _segment_text(self, req: _Request, seg: _Segment, chunk: str) -> bool:
        """Feed a chunk of one sequence's text; False once it wants no more (dropped, or fed in full)."""
        if seg.ignored or seg.full:
            return False
        seg.raw += chunk
        if seg.tokenizer is None:
            decision = self._decide(req, settled_words(seg.raw, self._options()), complete=False,
                                    built_on_tools=seg.after_tools)
            if decision is None:
                return True
            if decision == "ignore":
                seg.ignored = True
                return False
            seg.tokenizer = self._take_stream(req, decision)
            self._push(req, seg.tokenizer, seg.tokenizer.feed(seg.raw), reset=decision[0] == "reset")
        else:
            self._push(req, seg.tokenizer, seg.tokenizer.feed(chunk))
        if seg.tokenizer.done:
            seg.full = True
            return False
        return True

    def _segment_end(self, req: _Request, seg: _Segment) -> bool:
        """The sequence's text is complete: decide if still undecided, flush. False if nothing was fed."""
        if seg.ignored:
            return False
        if seg.tokenizer is None:
            decision = self._decide(req, spoken_words(seg.raw, self._options()), complete=True,
                                    built_on_tools=seg.after_tools)
            if decision is None or decision == "ignore":
                seg.ignored = True
                return False
            seg.tokenizer = self._take_stream(req, decision)
            self._push(req, seg.tokenizer, seg.tokenizer.feed(seg.raw), reset=decision[0] == "reset")
        self._push(req, seg.tokenizer, seg.tokenizer.flush())
        return True

    def _options(self) -> SanitizeOptions:
        return self.config.sanitize.options()

    def _decide(
        self, req: _Request, words: list[str], *, complete: bool, built_on_tools: bool = False
    ) -> tuple[str, int] | Literal["ignore"] | None:
        """None: wait for more; "ignore"; or ("reset"|"append", skip_words)."""
        forced = built_on_tools or req.requested  # both are fed as a new sequence whatever the policy
        d = decide_switch(
            self.settings.policy,  # type: ignore[arg-type]
            self.feed,
            answer_turn_id=req.turn_id,
            current_turn_id=self.transcript.user_turn_id,
            answer_words=words,
            answer_complete=complete,
            built_on_tools=forced,
            backchannel_only=forced and self._backchannel_only(req.turn_id),
        )
        if d.action == "wait":
            return None
        if d.action == "ignore":
            self.counters["dropped"] += 1
            self.emit(LlmDropped(request_id=req.id, reason=d.reason))
            return "ignore"
        return (d.action, d.skip_words)

    def _take_stream(self, req: _Request, decision: tuple[str, int]) -> WordStreamTokenizer:
        action, skip = decision
        if action == "append" and self._feed_tokenizer is not None:
            tok = self._feed_tokenizer.continuation(skip)
        else:
            tok = WordStreamTokenizer.from_config(self.encode, self.config)
        self._feed_tokenizer = tok
        return tok

    def _push(self, req: _Request, tok: WordStreamTokenizer, ids: list[int], *, reset: bool = False) -> None:
        if self._feed_tokenizer is not tok:
            return  # a newer answer owns the stream
        if reset:
            if not ids:
                return
            self.sink.oracle_reset(list(ids))
            self.counters["resets"] += 1
            self.feed = FeedState(turn_id=req.turn_id, fed_words=tok.words, assistant_spoke=self.transcript.assistant_spoke)
            self.emit(OracleReset(request_id=req.id, tokens=len(ids) + 1, text=tok.text))
            self.counters["tokens"] += len(ids) + 1
            return
        if ids:
            self.sink.oracle_push(list(ids))
            self.counters["tokens"] += len(ids)
            self.feed = replace(self.feed, turn_id=req.turn_id, fed_words=tok.words)
            self.emit(OracleText(request_id=req.id, tokens=len(ids), text=tok.text))

    # ------------------------------------------------------------------ failures
    def _succeeded(self) -> None:
        self._failures = 0
        self._backoff_until = 0.0
        if self._down:
            self._down = False
            self.emit(BackendUp(backend=self.settings.backend or ""))

    def _failed(self, req: _Request, exc: BackendError) -> None:
        self._failures += 1
        self.counters["errors"] += 1
        backoff = min(10.0, 0.5 * 2 ** (self._failures - 1))
        self._backoff_until = self.clock() + backoff
        kind = getattr(exc, "kind", "error")
        log.warning("llm request %d to %s failed: %s (%s); retry after %.1f s", req.id, req.backend, kind, exc, backoff)
        self.emit(LlmError(request_id=req.id, backend=req.backend, error=kind, message=str(exc)))
        if not self._down:
            self._down = True
            self.emit(BackendDown(backend=req.backend, error=kind, retry_in_s=backoff))

    # ------------------------------------------------------------------ end
    async def aclose(self) -> None:
        self.closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        req = self._current
        self._cancel_current("session ended")
        if req is not None and req.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await req.task
        if self.tools is not None:
            await self.tools.aclose()
