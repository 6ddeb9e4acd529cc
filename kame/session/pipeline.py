"""One session's pipeline: user audio -> engine slot (and ASR -> LLM -> oracle), typed events out.

:class:`Pipeline` is the one owner of a session's engine slot (attached by ``async with``, released on
exit; nothing else touches it) and of its ASR stream and oracle loop. It never blocks the caller:
audio goes without blocking to the recogniser and the engine thread (:class:`~kame.frontend.engine_thread.EngineThread`,
the only thread touching the model), LLM requests run in their own tasks, and all that happens comes
out of :meth:`events`, in order, as :mod:`kame.session.events` dataclasses.

It alone decides who answers: one :class:`~kame.session.answer_source.AnswerSource` chosen by the
session's settings (its own LLM, client delegation or Responses delegation) hears the user and takes the
session's commands, and writes only through the pipeline's one metered
:class:`~kame.session.answer_source.OracleWriter`. Nothing above the session writes the oracle.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kame.asr.config import EchoGuardConfig
from kame.asr.echo_guard import EchoGuard, EchoVerdict
from kame.asr.events import AsrEvent, EventType
from kame.audio.media import SAMPLE_RATE
from kame.backend.client_functions import ClientCall, UnknownCallId
from kame.frontend.engine import SlotOutput
from kame.frontend.engine_thread import COMMAND_TIMEOUT_S, AsyncSlot, EngineFull, PromptRequest
from kame.oracle.loop import OracleLoop
from kame.oracle.session_tools import SessionToolState, ToolCatalog
from kame.session.answer_source import AnswerSource, OracleWriter, SourceIO
from kame.session.answers import AnswerWritten
from kame.session.commands import (
    CancelAnswer,
    ClearTurn,
    CommitTurn,
    ConversationCommand,
    RequestAnswer,
    SpeakAnswer,
    commit_key,
    utterance_key,
)
from kame.session.delegated_answers import delegation_source
from kame.session.events import (
    AnswerCancelled,
    AsrFailed,
    AssistantFrame,
    EchoJudged,
    EngineDown,
    FunctionCallRequested,
    PipelineEvent,
    SpeechStarted,
    SpeechStopped,
    UserFinal,
    UserPartial,
    UserTurnCommitted,
)
from kame.session.llm_answers import LlmAnswers
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from kame.asr.stream import AsrStream
    from kame.backend.registry import BackendRegistry
    from kame.frontend.engine_thread import EngineThread
    from kame.oracle.config import OracleConfig
    from kame.session.responses.backend import ResponsesOffer

log = logging.getLogger(__name__)

#: Output frames that may wait for a consumer before further frames are dropped (counted).
MAX_QUEUED_FRAMES = 64
#: How long a reset retries to get a slot when the engine took this session's away meanwhile.
RESET_ATTACH_TIMEOUT_S = 2.0
#: How long a commit waits for a recogniser that cuts to reach the cut (it lags when the machine is overloaded)
#: before it takes the last partial.
COMMIT_FINAL_WAIT_S = 30.0


class _ClientTurn:
    """The user's turn while the client decides when it ends (client turns).

    The ASR's finals since the last commit, the utterance in progress and its last partial, and the cuts
    sent to the ASR and not reached yet, in order: a commit's number, or None for a clear. The ASR reaches
    a cut after every final of the audio before it, so a commit takes exactly the words said before it even
    when the recogniser lags; a recogniser that cannot cut is covered by a timeout.
    """

    def __init__(self, commits: int = 0) -> None:
        self.finals: list[str] = []
        self.utterance: int | None = None
        self.partial = ""
        self.commits = commits
        self.cuts: list[int | None] = []
        self.late = 0  #: cuts already answered by a timeout (their CUT, if it comes, is skipped)
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.dropped: set[int] = set()  #: utterances whose late finals are ignored
        self.deferred: RequestAnswer | None = None  #: an answer requested while a commit waited for its words

    def text(self, tail: str = "") -> str:
        return " ".join(t for t in [*self.finals, tail] if t.strip())

    def forget_words(self) -> None:
        self.finals, self.partial = [], ""
        if self.utterance is not None:
            self.dropped.add(self.utterance)
            if len(self.dropped) > 64:  # finals that never came: bounded over a long call
                self.dropped.discard(min(self.dropped))
            self.utterance = None


class Recognizer(Protocol):
    """A recogniser shared by sessions (any of :mod:`kame.asr`, the shared Kyutai STT included)."""

    def open_stream(self) -> AsrStream: ...


class _FeedClock:
    """When (wall clock) each sample count was fed, to measure ASR latency."""

    def __init__(self, keep: int = 512) -> None:
        self.samples: list[int] = []
        self.times: list[float] = []
        self.keep = keep
        self.total = 0

    def fed(self, n: int) -> None:
        self.total += n
        self.samples.append(self.total)
        self.times.append(time.time())
        if len(self.samples) > self.keep:
            del self.samples[: self.keep // 2]
            del self.times[: self.keep // 2]

    def wall_at(self, audio_s: float) -> float | None:
        i = bisect.bisect_left(self.samples, int(audio_s * SAMPLE_RATE))
        return self.times[i] if i < len(self.times) else None


class Pipeline:
    """A session's engine slot, ASR stream and oracle loop; ``async with`` attaches and releases them.

    Entering raises :class:`~kame.frontend.engine_thread.EngineFull` (no slot
    free), :class:`~kame.frontend.engine_thread.EngineFailed` (the attach failed
    or exceeded its bound; nothing stays reserved) or ``ValueError``/``KeyError``
    (settings the server cannot honour, e.g. an unknown back-end).
    """

    def __init__(
        self,
        *,
        engine: EngineThread,
        oracle_config: OracleConfig,
        registry: BackendRegistry | None,
        recognizer: Recognizer | None,
        encode: Callable[[str], Sequence[int]],
        piece_of: Callable[[int], str] | None,
        settings: SessionSettings | None = None,
        vocab: TextVocab = MOSHI_VOCAB,
        timeout_s: float = COMMAND_TIMEOUT_S,
        max_queued_frames: int = MAX_QUEUED_FRAMES,
        tools: ToolCatalog | None = None,
        echo_guard: EchoGuardConfig | None = None,
        responses: ResponsesOffer | None = None,
    ) -> None:
        self.engine = engine
        #: Responses delegation on the server's back-ends (None: not offered).
        self.responses_offer = responses
        self.tool_catalog = tools
        #: The session's function tools (client functions, MCP servers); None without back-end or catalog.
        self.tools: SessionToolState | None = None
        self._call_ids = itertools.count(1)
        self._call_prefix = secrets.token_hex(4)
        self.oracle_config = oracle_config
        self.registry = registry if registry is not None and registry.names else None
        self.recognizer = recognizer
        self.encode = encode
        self.piece_of = piece_of
        self.settings = settings or SessionSettings()
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.max_queued_frames = max_queued_frames
        self.slot: AsyncSlot | None = None
        self.asr: AsrStream | None = None
        #: Who answers (chosen by the settings: :meth:`_open_source`); the base class answers nothing.
        self.source: AnswerSource = AnswerSource()
        #: The one writer of the slot's oracle stream, whoever answers.
        self.writer = OracleWriter(lambda: self.slot, self._written)
        #: Frames dropped because the consumer of :meth:`events` lagged.
        self.dropped_frames = 0
        #: Whether leaving the ``async with`` block flushes the ASR (the last words); False when draining.
        self.flush_on_exit = True
        self._events: asyncio.Queue[PipelineEvent] = asyncio.Queue()
        self._frames_queued = 0
        self._asr_task: asyncio.Task[None] | None = None
        self._clock = _FeedClock()
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()
        self._started_t = time.monotonic()
        #: Seconds from :meth:`start` to the slot's first reply frame (after a PersonaPlex slot's system
        #: prompts); None until then.
        self.first_reply_s: float | None = None
        #: Input frames that arrived while the slot stepped its system prompts (not heard, no reply frame).
        self.prompt_frames = 0
        self._turn = _ClientTurn()
        #: Told what the answer sources other than the own LLM write to the oracle stream (the server counts it;
        #: the own LLM's writes are counted from its events).
        self.on_answer_written: Callable[[AnswerWritten], None] | None = None
        self._source_tasks: set[asyncio.Task[Any]] = set()
        #: The server's echo guard settings (``asr.echo_guard``); a session turns it on or off (``echo_guard``).
        self.echo_config = echo_guard or EchoGuardConfig()
        self.echo = EchoGuard(self.echo_config.options(), enabled=self._echo_enabled(self.settings))

    def _echo_enabled(self, settings: SessionSettings) -> bool:
        return self.echo_config.enabled if settings.echo_guard is None else settings.echo_guard

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Pipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose(flush_asr=self.flush_on_exit)

    async def start(self) -> None:
        """Attach a slot, then open the ASR stream and the oracle loop with the session's settings."""
        self.slot = self._new_slot()
        self._started_t = time.monotonic()
        try:
            await self.slot.attach(self._prompt())
            self._open_parts()
        except BaseException:
            await self.aclose(flush_asr=False)
            raise

    def _prompt(self) -> PromptRequest:
        """The voice and persona the slot starts with (used by PersonaPlex checkpoints only)."""
        return PromptRequest(voice=self.settings.voice, persona=self.settings.instructions)

    @property
    def slot_index(self) -> int | None:
        return self.slot.slot if self.slot is not None else None

    def _new_slot(self) -> AsyncSlot:
        return AsyncSlot(self.engine, timeout_s=self.timeout_s, sink=self._on_slot)

    def _open_parts(self) -> None:
        """ASR stream and oracle loop for the attached slot, with the current settings applied."""
        assert self.slot is not None
        self._open_source(self.settings)
        if self.settings.sampling() != (None, None):
            self.slot.set_sampling(*self.settings.sampling())
        if self.recognizer is not None:
            self.asr = self.recognizer.open_stream()
            self.asr.bind_engine(self.slot)
            self._asr_task = asyncio.get_running_loop().create_task(self._asr_events(self.asr), name="kame-asr-events")

    @property
    def oracle(self) -> OracleLoop | None:
        """The own LLM's loop, when the session's LLM answers."""
        return self.source.loop if isinstance(self.source, LlmAnswers) else None

    def _open_source(self, settings: SessionSettings) -> None:
        """Who answers, chosen by ``settings``: a delegation (``settings.delegation``: the client, or a Responses
        conversation), else the session's LLM (``settings.llm``, with the session's tools), else nobody."""
        assert self.slot is not None
        delegation = settings.delegation
        io = SourceIO(self.writer, self._put, self._spawn_source_task)
        if delegation is not None:
            self.source = delegation_source(delegation, io, encode=self.encode, oracle_config=self.oracle_config,
                                            offer=self.responses_offer)
        elif self.registry is not None and settings.llm:
            if self.tool_catalog is not None:
                self.tools = SessionToolState(
                    self.tool_catalog, emit=self._client_call, new_call_id=self._new_call_id,
                    include_arguments=settings.record,
                )
                self._apply_tools(settings)
            loop = OracleLoop(
                config=self.oracle_config,
                registry=self.registry,
                sink=self.writer,
                encode=self.encode,
                piece_of=self.piece_of,
                emit=self._put,
                tools=self.tools.tools if self.tools is not None else None,
            )
            self.source = LlmAnswers(loop, self.oracle_config, settings)
        else:
            self.source = AnswerSource()

    async def _close_parts(self, flush_asr: bool) -> None:
        asr, self.asr = self.asr, None
        if asr is not None:
            try:
                await asr.aclose(flush=flush_asr, timeout=5.0)
            except Exception:  # noqa: BLE001 - a broken recogniser must not keep the slot
                log.exception("closing the ASR stream failed")
        task, self._asr_task = self._asr_task, None
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(task, 2.0)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                task.cancel()
        source, self.source = self.source, AnswerSource()
        try:
            await source.aclose()
        except Exception:  # noqa: BLE001
            log.exception("closing the answer source failed")
        tools, self.tools = self.tools, None
        if tools is not None:
            try:
                await tools.aclose()
            except Exception:  # noqa: BLE001
                log.exception("closing the session's tools failed")

    async def aclose(self, flush_asr: bool = True) -> None:
        """Release the slot as soon as nothing needs it any more (the ASR may still need it to flush), then
        stop the ASR (flushing its last words unless ``flush_asr`` is False), the oracle and its LLM
        request. The slot is released whatever fails."""
        if self._closed:
            return
        self._closed = True
        await self._stop_source_tasks()
        try:
            if self.asr is not None:
                try:
                    await self.asr.release_engine(flush_asr)
                except Exception:  # noqa: BLE001 - a broken recogniser must not keep the slot
                    log.exception("releasing the ASR stream's engine use failed")
        finally:
            self._release_slot()
        await self._close_parts(flush_asr)

    def _release_slot(self) -> None:
        if self.slot is not None:
            self.dropped_frames += self.slot.dropped_outputs
            self.slot.detach()

    async def reset(self) -> None:
        """Fresh Moshi, Mimi and oracle state and a fresh transcript on the slot this session keeps
        (same settings). Events not yet read are discarded. Raises ``EngineFull`` when the engine took the
        slot away meanwhile and none is free again within a short wait, ``EngineFailed`` when the reset
        fails or exceeds its bound."""
        assert self.slot is not None and not self._closed
        await self._close_parts(flush_asr=False)
        self._drain()
        self.echo.reset()  # the slot's steps and the new ASR stream's clock start at 0 again
        try:
            await self.slot.reset()
        except EngineFull:
            self.slot = await self._attach_again()
        self._drain()
        self._open_parts()

    async def _attach_again(self) -> AsyncSlot:
        deadline = time.monotonic() + RESET_ATTACH_TIMEOUT_S
        while True:
            slot = self._new_slot()
            try:
                await slot.attach(self._prompt())
                return slot
            except EngineFull:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.05)

    def _drain(self) -> None:
        while not self._events.empty():
            self._events.get_nowait()
        self._frames_queued = 0

    # ------------------------------------------------------------------ in
    def feed(self, pcm: np.ndarray) -> None:
        """24 kHz mono float32 user audio, any length. Never blocks."""
        if self.slot is None:
            return
        self.slot.feed(pcm)
        if self.asr is not None and not self.asr.done:
            self.asr.feed(pcm)
            self._clock.fed(int(np.asarray(pcm).size))

    def update(self, settings: SessionSettings) -> None:
        """New session settings: applied as a whole, or not at all (``KeyError`` for an unknown back-end)."""
        old = self.settings
        if self._switches_source(old, settings):  # the front-end alone (no back-end), the LLM again, a delegation
            self._switch_source(settings)
            old = replace(old, llm=settings.llm, delegation=settings.delegation)
        if self.tools is not None and settings.tools_part() != old.tools_part():
            self._apply_tools(settings)  # first: it may refuse (an MCP server name not configured)
        if self.tools is not None:
            self.tools.tools.include_arguments = settings.record  # arguments in events only when recorded
        if self.slot is not None and settings.sampling() != old.sampling():
            self.slot.set_sampling(*settings.sampling())
        self.source.configure(settings)
        if settings.client_turns != old.client_turns:
            self._switch_turns(settings.client_turns)
        self.echo.enabled = self._echo_enabled(settings)
        self.settings = settings
        if self.takes_prompts and (settings.voice, settings.instructions) != (old.voice, old.instructions):
            self._restart_prompts()

    @property
    def takes_prompts(self) -> bool:
        """The engine steps system prompts (a PersonaPlex checkpoint): voice and persona start a session."""
        core = getattr(self.engine, "core", None)  # no engine: a session driven by a scripted slot
        return getattr(core, "prompts", None) is not None

    def _restart_prompts(self) -> None:
        """A new voice or persona: the slot starts again from its system prompts (PersonaPlex conditions a
        session only at its start), in the background; the session's settings are already the new ones."""
        if self.slot is None or self._closed:
            return
        self.slot.prompt = self._prompt()  # first_reply_s still counts from the connection

        async def restart() -> None:
            try:
                await self.reset()
            except Exception as exc:  # noqa: BLE001 - the session learns it as an engine failure
                log.exception("restarting the system prompts failed")
                self._put(EngineDown(message=f"restarting the system prompts failed ({exc.__class__.__name__})"))

        task = asyncio.get_running_loop().create_task(restart(), name="kame-prompt-restart")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    def _switches_source(old: SessionSettings, new: SessionSettings) -> bool:
        """Whether new settings choose another answer source (a delegation's own settings only configure it)."""
        return new.llm != old.llm or (new.delegation is None) != (old.delegation is None) or (
            new.delegation is not None and old.delegation is not None
            and (new.delegation.responses is None) != (old.delegation.responses is None))

    def _switch_source(self, settings: SessionSettings) -> None:
        """Another answer source: the old one stops in the background (its request is cancelled; the slot's FIFO
        keeps only what was already queued) and the new one starts with the new settings."""
        old, self.source = self.source, AnswerSource()
        self.tools = None
        task = asyncio.get_running_loop().create_task(old.aclose(), name="kame-source-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        if self.slot is not None and not self._closed:
            self._open_source(settings)

    def _switch_turns(self, client: bool) -> None:
        """Mid-session change of who ends turns. To the server's turns: what was said since the last commit
        joins the history once the ASR reaches a cut placed now (cuts still pending from client turns are
        honoured first, so a clear the recogniser has not reached yet still drops its words). To client
        turns: a partial in progress waits for the commit."""
        turn = self._turn
        if not client:
            if self.asr is not None and not self.asr.done and getattr(self.asr, "cuts", False):
                self.asr.cut()
                turn.cuts.append(0)  # 0: no commit, the words join the history
            else:
                text = turn.text(turn.partial)
                if text:
                    self.source.turn_end(text, commit_key(turn.commits + 1))
                turn.forget_words()

    def _apply_tools(self, settings: SessionSettings) -> None:
        assert self.tools is not None and self.registry is not None
        backend = self.registry.config_of(settings.backend)
        self.tools.apply(functions=settings.functions, tool_choice=settings.tool_choice,
                         mcp_servers=settings.mcp_servers, backend=backend)

    def _new_call_id(self) -> str:
        return f"call_{self._call_prefix}{next(self._call_ids):04x}"

    def _client_call(self, call: ClientCall) -> None:
        self._put(FunctionCallRequested(call_id=call.call_id, tool=call.name, arguments=call.arguments,
                                        read_only=call.read_only))

    def deliver_function_output(self, call_id: str, output: str) -> None:
        """The client's output for a function call (raises ``UnknownCallId`` if none waits for it)."""
        if self.tools is None:
            raise UnknownCallId(call_id)
        self.tools.deliver(call_id, output)

    def apply(self, command: ConversationCommand) -> list[PipelineEvent]:
        """A change to the conversation or to who answers (:mod:`kame.session.commands`). Never blocks.

        Returns the events the command gives at once (a delegated append's outcome: the runtime hands them to
        the wire before anything the pipeline reports later); raises
        :class:`~kame.session.commands.CommandRefused` for a command the session's answer source refuses.
        Without a back-end there is no context to change and nobody to ask: only a cancel does something
        (its :class:`~kame.session.events.AnswerCancelled` is reported all the same, so the wire can end its
        response).
        """
        if isinstance(command, SpeakAnswer):
            self.writer.reset(command.ids, command.received_t)
        elif isinstance(command, CancelAnswer):
            self.source.apply(command)
            self._put(AnswerCancelled(reason=command.reason))
        elif isinstance(command, CommitTurn):
            self._commit()
        elif isinstance(command, ClearTurn):
            self._clear()
        elif isinstance(command, RequestAnswer) and not command.continue_tools and self._turn.cuts:
            self._turn.deferred = command  # a commit's words are still being transcribed: ask once they are in
        else:
            return self.source.apply(command)
        return []

    # ------------------------------------------------------------------ client turns (turn_detection: null)
    def _commit(self) -> None:
        """End the user's turn now: the ASR cuts after the audio fed so far; with client turns the turn's
        transcript is reported once the ASR has reached the cut (at most :data:`COMMIT_FINAL_WAIT_S`), or at
        once with the last partial when the recogniser cannot cut (Kyutai's finds turns by itself)."""
        cut = self.asr is not None and not self.asr.done
        if cut:
            self.asr.cut()  # type: ignore[union-attr]
        if not self.settings.client_turns:
            return  # the ASR's own events (speech_stopped, final) follow
        turn = self._turn
        turn.commits += 1
        if not cut or not getattr(self.asr, "cuts", False):  # no recogniser, or one that cannot cut: what it has now
            text = turn.text(turn.partial)
            turn.forget_words()
            self._complete(turn.commits, text)
            return
        turn.cuts.append(turn.commits)
        turn.timers[turn.commits] = asyncio.get_running_loop().call_later(
            COMMIT_FINAL_WAIT_S, self._commit_timeout, turn.commits)

    def _commit_timeout(self, commit: int) -> None:
        turn = self._turn
        if commit not in turn.cuts:
            return
        while turn.cuts:  # this commit, and the clears before it, are answered now
            turn.late += 1
            if turn.cuts.pop(0) == commit:
                break
        text = turn.text(turn.partial)
        turn.forget_words()  # the words still in progress belong to this commit: their final is not taken again
        self._complete(commit, text)

    def _complete(self, commit: int, text: str | None = None) -> None:
        turn = self._turn
        timer = turn.timers.pop(commit, None)
        if timer is not None:
            timer.cancel()
        if text is None:
            text = turn.text()
            turn.finals = []
        self._put(UserTurnCommitted(turn=commit, text=text))
        self.source.turn_end(text, commit_key(commit))
        deferred, turn.deferred = turn.deferred, None
        if deferred is not None:
            self.apply(deferred)

    def _clear(self) -> None:
        """Drop the user's turn in progress: its transcript (what the ASR still has to report of it too), and
        the back-end request made on it."""
        turn = self._turn
        turn.forget_words()
        if self.asr is not None and not self.asr.done:
            self.asr.cut()
            if self.settings.client_turns:
                turn.cuts.append(None)
        self.source.turn_cleared()

    def _client_asr(self, ev: AsrEvent) -> None:
        """An ASR event with client turns: it feeds the turn in progress; only a commit ends it."""
        turn, utt = self._turn, ev.utterance
        if utt in turn.dropped and ev.type is not EventType.CUT:
            if ev.type is EventType.FINAL:
                turn.dropped.discard(utt)
            return
        if ev.type is EventType.SPEECH_STARTED:
            turn.utterance, turn.partial = utt, ""
        elif ev.type is EventType.PARTIAL:
            turn.utterance, turn.partial = utt, ev.text
        elif ev.type is EventType.FINAL:
            if turn.utterance == utt:
                turn.utterance, turn.partial = None, ""
            if ev.text.strip():
                turn.finals.append(ev.text)
        elif ev.type is EventType.CUT:
            if turn.late:
                turn.late -= 1
            elif turn.cuts:
                commit = turn.cuts.pop(0)
                if commit is None:
                    turn.forget_words()  # a clear: what came before it is dropped
                elif commit == 0:  # back to the server's turns: the words join the history, no commit
                    text = turn.text(turn.partial)
                    turn.forget_words()
                    if text:
                        self.source.turn_end(text, commit_key(turn.commits + 1))
                else:
                    self._complete(commit)

    # ------------------------------------------------------------------ the answer source's tasks and meter
    def _written(self, written: AnswerWritten) -> None:
        if self.on_answer_written is not None:
            self.on_answer_written(written)

    def _spawn_source_task(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        if self._closed:  # too late: nothing would cancel it
            work.close()
            return asyncio.get_running_loop().create_task(asyncio.sleep(0), name="kame-answer-too-late")

        async def guarded() -> Any:
            try:
                return await work
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - an answer source's failure must not end the session
                log.exception("answer source task failed")
                return None

        task = asyncio.get_running_loop().create_task(guarded(), name=f"kame-answer-{self.source.kind}")
        self._source_tasks.add(task)
        task.add_done_callback(self._source_tasks.discard)
        return task

    async def _stop_source_tasks(self) -> None:
        tasks = list(self._source_tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ out
    def _put(self, event: PipelineEvent) -> None:
        self._events.put_nowait(event)

    async def next_event(self) -> PipelineEvent:
        event = await self._events.get()
        if isinstance(event, AssistantFrame):
            self._frames_queued -= 1
        return event

    def drain_events(self) -> list[PipelineEvent]:
        """What is still queued (events reported while the pipeline closed, such as the ASR's last final), without
        waiting: once the session's pump has stopped, the runtime hands these to its recording."""
        out: list[PipelineEvent] = []
        while not self._events.empty():
            out.append(self._events.get_nowait())
        return out

    async def events(self) -> AsyncIterator[PipelineEvent]:
        """Everything the pipeline reports, in order (runs until the consumer stops)."""
        while True:
            yield await self.next_event()

    def _on_slot(self, item: SlotOutput | Exception) -> None:
        """An engine output (or failure) of this session's slot, in the event loop."""
        if isinstance(item, Exception):
            self._put(EngineDown(message=str(item)))
            return
        if item.prompting:  # a PersonaPlex prompt step: the session has no reply yet (its server sends nothing)
            self.prompt_frames += 1
            return
        if self.first_reply_s is None:
            self.first_reply_s = time.monotonic() - self._started_t
        self.source.step(item.text_id, item.step)
        text_id = item.text_id
        piece = None
        if text_id is not None and self.vocab.is_text(text_id) and self.piece_of is not None:
            piece = self.piece_of(text_id)
        self.echo.assistant_step(piece, item.step)  # what the assistant said, for the echo guard
        if self._frames_queued >= self.max_queued_frames:  # a consumer that does not read loses frames
            self.dropped_frames += 1
        else:
            self._frames_queued += 1
            self._put(AssistantFrame(step=item.step, pcm=item.pcm, text_id=text_id, piece=piece, oracle_id=item.oracle_id))
        self.source.tick(time.monotonic())

    async def _asr_events(self, asr: AsrStream) -> None:
        async for ev in asr.events():
            try:
                self._hear(ev)
            except Exception:  # noqa: BLE001 - a bug here must not stop the session
                log.exception("handling ASR event %s failed", ev.type)

    def _hear(self, ev: AsrEvent) -> None:
        """An ASR event through the echo guard: an utterance that only echoes the assistant never reaches
        :meth:`_on_asr` (no turn, no barge-in, nothing for the LLM); held ones come once judged the user's."""
        for item in self.echo.push(ev):
            if isinstance(item, EchoVerdict):
                m = item.match
                self._put(EchoJudged(utterance=item.utterance, audio_s=item.audio_s, echo=item.echo, text=item.text,
                                     words=m.words, matched=m.matched, extra=m.extra, delay_s=item.delay_s))
            else:
                self._on_asr(item)

    def _on_asr(self, ev: AsrEvent) -> None:
        utt, audio_s = ev.utterance, ev.audio_s
        if not self.settings.client_turns and self._turn.cuts and ev.type is not EventType.ERROR:
            self._client_asr(ev)  # audio of the client-turn time the ASR reports late: its cuts first
            return
        if self.settings.client_turns and ev.type is not EventType.ERROR:
            self._client_asr(ev)
            # the raw events still go out (recordings, kame.* partials); the wire ends no turn on them
            if ev.type is EventType.PARTIAL:
                self._put(UserPartial(utterance=utt, audio_s=audio_s, text=ev.text, stable=ev.stable))
            elif ev.type is EventType.FINAL:
                self._put(UserFinal(utterance=utt, audio_s=audio_s, text=ev.text))
            elif ev.type is EventType.SPEECH_STARTED:
                self._put(SpeechStarted(utterance=utt, audio_s=audio_s))
            elif ev.type is EventType.SPEECH_STOPPED:
                self._put(SpeechStopped(utterance=utt, audio_s=audio_s))
            return
        if ev.type is EventType.PARTIAL:
            fed_at = self._clock.wall_at(audio_s)
            latency = None if fed_at is None else max(0.0, time.time() - fed_at)
            partial = UserPartial(utterance=utt, audio_s=audio_s, text=ev.text, stable=ev.stable, latency_s=latency)
            self._put(partial)
            self.source.partial(utt, ev.text, ev.stable, partial.t)
        elif ev.type is EventType.FINAL:
            final = UserFinal(utterance=utt, audio_s=audio_s, text=ev.text)
            self._put(final)
            self.source.final(utt, ev.text, utterance_key(utt), final.t)
        elif ev.type is EventType.SPEECH_STARTED:
            started = SpeechStarted(utterance=utt, audio_s=audio_s)
            self._put(started)
            self.source.speech_started(utt, started.t)
            if self.settings.interrupt_response:  # the user's speech stops the answer in progress
                self.apply(CancelAnswer("turn_detected"))
        elif ev.type is EventType.SPEECH_STOPPED:
            self._put(SpeechStopped(utterance=utt, audio_s=audio_s))
        elif ev.type is EventType.ERROR:
            self._put(AsrFailed(utterance=utt, audio_s=audio_s, message=ev.text))


def piece_lookup(tokenizer: Any) -> Callable[[int], str]:
    """``piece_of`` for a SentencePiece tokenizer (ids outside its vocabulary shown as ``<id>``)."""
    from kame.frontend.runner import piece_of as lookup

    def piece_of(text_id: int) -> str:
        return lookup(tokenizer, int(text_id))

    return piece_of

