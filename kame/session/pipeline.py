"""One session's pipeline: user audio -> engine slot (and ASR -> LLM -> oracle), typed events out.

:class:`Pipeline` is the one owner of a session's engine slot (attached by ``async with``, released on
exit; nothing else touches it) and of its ASR stream and oracle loop. It never blocks the caller:
audio goes without blocking to the recogniser and the engine thread (:class:`~kame.frontend.engine_thread.EngineThread`,
the only thread touching the model), LLM requests run in their own tasks, and all that happens comes
out of :meth:`events`, in order, as :mod:`kame.session.events` dataclasses.

It is the one writer of the slot's oracle stream, whoever answers (:mod:`kame.session.answers`): its
own LLM loop (:class:`~kame.oracle.loop.OracleLoop`), a client's
:class:`~kame.session.commands.SpeakAnswer`, or the Responses source started by
:meth:`Pipeline.use_responses`. Nothing above the session writes the oracle.
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
from kame.oracle.choice import OracleChoice
from kame.oracle.loop import OracleLoop
from kame.oracle.session_tools import SessionToolState, ToolCatalog
from kame.oracle.transcript import Turn
from kame.session.answers import AnswerWritten
from kame.session.commands import (
    AddContext,
    CancelAnswer,
    ClearTurn,
    CommitTurn,
    ConversationCommand,
    ForgetContext,
    ForgetSpeech,
    RequestAnswer,
    SpeakAnswer,
    commit_key,
    utterance_key,
)
from kame.session.delegated_answers import DelegatedAnswers
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
from kame.session.settings import SessionSettings
from kame.vocab import MOSHI_VOCAB, TextVocab

if TYPE_CHECKING:
    from kame.asr.stream import AsrStream
    from kame.backend.registry import BackendRegistry
    from kame.frontend.engine_thread import EngineThread
    from kame.oracle.config import OracleConfig
    from kame.session.answers import OracleAnswer
    from kame.session.delegation_rules import DelegationMode
    from kame.session.responses.backend import ResponsesOffer
    from kame.session.responses.source import ResponsesAnswerSource, UseResponses

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
    ) -> None:
        self.engine = engine
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
        self.oracle: OracleLoop | None = None
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
        #: Told what the answer sources other than the own LLM write to the oracle stream (the server counts it).
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
        self._open_oracle()
        if self.settings.sampling() != (None, None):
            self.slot.set_sampling(*self.settings.sampling())
        if self.recognizer is not None:
            self.asr = self.recognizer.open_stream()
            self.asr.bind_engine(self.slot)
            self._asr_task = asyncio.get_running_loop().create_task(self._asr_events(self.asr), name="kame-asr-events")

    def _open_oracle(self) -> None:
        """The oracle loop (and the session's tools) when the session asks an LLM (``settings.llm``)."""
        assert self.slot is not None
        if self.registry is not None and self.settings.llm:
            if self.tool_catalog is not None:
                self.tools = SessionToolState(
                    self.tool_catalog, emit=self._client_call, new_call_id=self._new_call_id,
                    include_arguments=self.settings.record,
                )
                self._apply_tools(self.settings)
            self.oracle = OracleLoop(
                config=self.oracle_config,
                registry=self.registry,
                sink=self,
                encode=self.encode,
                piece_of=self.piece_of,
                emit=self._put,
                tools=self.tools.tools if self.tools is not None else None,
            )
            self.oracle.apply(OracleChoice.resolve(self.settings, self.oracle_config))
            self.oracle.auto_requests = self.settings.backend_on_transcripts

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
        oracle, self.oracle = self.oracle, None
        if oracle is not None:
            try:
                await oracle.aclose()
            except Exception:  # noqa: BLE001
                log.exception("closing the oracle loop failed")
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
        if settings.llm != old.llm:  # the front-end alone (no back-end), or the LLM again
            self._switch_llm(settings)
            old = replace(old, llm=settings.llm)
        if self.tools is not None and settings.tools_part() != old.tools_part():
            self._apply_tools(settings)  # first: it may refuse (an MCP server name not configured)
        if self.tools is not None:
            self.tools.tools.include_arguments = settings.record  # arguments in events only when recorded
        if self.oracle is not None and settings.oracle_part() != old.oracle_part():
            self.oracle.apply(OracleChoice.resolve(settings, self.oracle_config))
        if self.slot is not None and settings.sampling() != old.sampling():
            self.slot.set_sampling(*settings.sampling())
        if self.oracle is not None:
            self.oracle.auto_requests = settings.backend_on_transcripts
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

    def _switch_llm(self, settings: SessionSettings) -> None:
        """``llm`` changed: stop the oracle loop (its request is cancelled in the background; the slot's
        FIFO keeps only what was already queued), or start one with the new settings."""
        if not settings.llm:
            oracle, self.oracle = self.oracle, None
            self.tools = None
            if oracle is not None:
                task = asyncio.get_running_loop().create_task(oracle.aclose(), name="kame-oracle-close")
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            return
        if self.slot is not None and self.oracle is None and not self._closed:
            current, self.settings = self.settings, settings
            try:
                self._open_oracle()
            finally:
                self.settings = current

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
                if text and self.oracle is not None:
                    self.oracle.on_user_final(text, commit_key(turn.commits + 1))
                turn.forget_words()
        elif self.oracle is not None:
            self.oracle.transcript.user_final("")

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

    def apply(self, command: ConversationCommand) -> None:
        """A change to the conversation or to who answers (:mod:`kame.session.commands`). Never blocks.

        Without a back-end there is no context to change and nobody to ask: only a cancel does something
        (its :class:`~kame.session.events.AnswerCancelled` is reported all the same, so the wire can end its
        response).
        """
        oracle = self.oracle
        if isinstance(command, SpeakAnswer):
            self._speak(command.ids, command.received_t)
        elif isinstance(command, CancelAnswer):
            if oracle is not None:
                oracle.cancel(command.reason)
            self._put(AnswerCancelled(reason=command.reason))
        elif isinstance(command, CommitTurn):
            self._commit()
        elif isinstance(command, ClearTurn):
            self._clear()
        elif oracle is None:
            return
        elif isinstance(command, AddContext):
            oracle.transcript.add_item(command.item.key, command.item.role, command.item.text)
        elif isinstance(command, ForgetContext):
            oracle.transcript.forget(command.key)
        elif isinstance(command, ForgetSpeech):
            oracle.transcript.forget_steps(command.start_step, command.end_step)
        elif isinstance(command, RequestAnswer):
            if command.continue_tools:
                return  # the tool loop waiting on the client's outputs goes on by itself
            if self._turn.cuts:  # a commit's words are still being transcribed: ask once they are in
                self._turn.deferred = command
                return
            context = None
            if command.context is not None:
                context = [Turn(i.role, i.text, i.key) for i in command.context if i.text.strip()]
            oracle.respond(command.instructions, context)

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
        if self.oracle is not None:
            self.oracle.on_user_final(text, commit_key(commit))  # joins the history; asks nothing (no auto requests)
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
        if self.oracle is not None:
            self.oracle.drop_pending("the client cleared the user's turn")

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
                    if text and self.oracle is not None:
                        self.oracle.on_user_final(text, commit_key(turn.commits + 1))
                else:
                    self._complete(commit)

    # ------------------------------------------------------------------ the oracle stream (every answer source's)
    def oracle_reset(self, first_ids: list[int]) -> None:
        """A new oracle sequence (:class:`~kame.oracle.loop.OracleSink`: the own LLM's answers)."""
        if self.slot is not None and first_ids:
            self.slot.oracle_reset(list(first_ids))

    def oracle_push(self, ids: list[int]) -> None:
        """Extend the sequence the last reset started (an answer that streams)."""
        if self.slot is not None and ids:
            self.slot.oracle_push(list(ids))

    def oracle_clear(self) -> None:
        if self.slot is not None:
            self.slot.oracle_clear()

    def _speak(self, ids: Sequence[int], received_t: float) -> None:
        """A new sequence written outside the LLM loop (a client's answer, a Responses round), at once (the FIFO
        has its own lock: not behind the step in progress); reported with the time it took since ``received_t``."""
        if self.slot is None or not ids:
            return
        written: list[float] = []
        self.slot.oracle_reset(list(ids), written.append)
        self._written(AnswerWritten(len(ids) + 1, True, max(0.0, written[0] - received_t) if written else None))

    def _extend(self, ids: Sequence[int]) -> None:
        """More of the sequence :meth:`_speak` started (a Responses round that streams)."""
        if self.slot is None or not ids:
            return
        self.slot.oracle_push(list(ids))
        self._written(AnswerWritten(len(ids), False))

    def _written(self, written: AnswerWritten) -> None:
        if self.on_answer_written is not None:
            self.on_answer_written(written)

    # ------------------------------------------------------------------ delegated answers (a Live wire's)
    def delegated_answers(self, mode: DelegationMode, backchannel_words: int,
                          new_id: Callable[[], str]) -> DelegatedAnswers:
        """Who answers this session when its answers are written outside its own LLM (a wire's
        :data:`~kame.session.delegated_answers.OpenAnswers`): the session's book of delegations, with its own
        tokenizer and oracle settings. The spoken answers it makes come back as :class:`SpeakAnswer`."""
        return DelegatedAnswers(mode, backchannel_words, encode=self.encode, oracle_config=self.oracle_config,
                                new_id=new_id)

    # ------------------------------------------------------------------ the Responses delegation
    def use_responses(self, offer: ResponsesOffer, use: UseResponses) -> ResponsesAnswerSource:
        """Answer in Responses delegation on ``offer``'s back-ends (a wire's :class:`UseResponses`): the source
        writes this pipeline's oracle stream and runs in tasks that end with it (a failure is logged, never
        ends the session)."""

        def reset(answer: OracleAnswer) -> None:
            self._speak(answer.ids, time.monotonic())

        return offer.answer_source(use, oracle_reset=reset, oracle_push=self._extend, spawn=self._spawn_source_task)

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

        task = asyncio.get_running_loop().create_task(guarded(), name="kame-answer-responses")
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
        if self.oracle is not None:
            self.oracle.on_assistant_token(item.text_id, item.step)
        text_id = item.text_id
        piece = None
        if text_id is not None and self.vocab.is_text(text_id) and self.piece_of is not None:
            piece = self.piece_of(text_id)
        self.echo.assistant_step(piece, item.step)  # what the assistant said, for the echo guard
        if self._frames_queued >= self.max_queued_frames:  # a consumer that does not read loses frames
            self.dropped_frames += 1
            return
        self._frames_queued += 1
        self._put(AssistantFrame(step=item.step, pcm=item.pcm, text_id=text_id, piece=piece, oracle_id=item.oracle_id))

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
            self._put(UserPartial(utterance=utt, audio_s=audio_s, text=ev.text, stable=ev.stable, latency_s=latency))
            if self.oracle is not None:
                self.oracle.on_user_partial(ev.text)
        elif ev.type is EventType.FINAL:
            self._put(UserFinal(utterance=utt, audio_s=audio_s, text=ev.text))
            if self.oracle is not None:
                self.oracle.on_user_final(ev.text, utterance_key(utt))
        elif ev.type is EventType.SPEECH_STARTED:
            self._put(SpeechStarted(utterance=utt, audio_s=audio_s))
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

