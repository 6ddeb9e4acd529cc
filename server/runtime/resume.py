"""Resumable sessions: handles, what a handle is bound to, the grace window, the drain's hand-over.

A session whose client opted in (Realtime, Live API: kame's events) gets an unguessable handle. When its
connection drops (no close frame, or not 1000/1001), the session is *held* for
``server.resume_grace_s``: pipeline, slot and LLM request stay, but nothing feeds the slot, so the
engine's batch skips it (the voice resumes where it stopped); ``?resume=HANDLE`` with the same
credentials re-attaches it with a new handle (a replayed one finds nothing). After the window the
session ends and frees its slot. On a drain each such session is told (``kame.session.ending``
with its handle) and its conversation goes to the shared store (server/runtime/store.py), where
another replica takes it. docs/protocol.md, "Reconnecting", states the rules.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kame.server.runtime.store import SessionStore, Snapshot

if TYPE_CHECKING:
    from kame.server.runtime.session import SessionRuntime
    from kame.server.runtime.transport import Transport
    from kame.server.runtime.wire import Outgoing

log = logging.getLogger("kame.server.runtime.resume")

#: Random bytes in a handle (``secrets.token_urlsafe``: 32 URL-safe characters).
HANDLE_BYTES = 24
#: The longest ``resume`` query parameter looked at.
MAX_HANDLE_CHARS = 128
#: Close codes of a client that meant to leave (normal closure, going away: a tab closed): its session ends.
CLEAN_CLOSES = frozenset({1000, 1001})
#: Ended sessions' handles remembered, so that a late resume is told "expired" rather than "unknown".
REMEMBERED_ENDS = 1000


def new_handle(session_id: str) -> str:
    """``<session id>.<secret>``: the id steers a load balancer back to the replica holding the session (it
    learned the id from the upgrade's ``x-kame-session`` header); the secret part makes the handle."""
    return f"{session_id}.{secrets.token_urlsafe(HANDLE_BYTES)}"


def route_of(handle: str) -> str | None:
    """The session id a handle starts with (None: not a handle's shape)."""
    route, dot, secret = handle.partition(".")
    return route if dot and secret and 0 < len(route) <= 32 and route.isalnum() else None


def binding_of(token: str | None, grant_session: Mapping[str, Any] | None) -> str:
    """What opened a session, as a digest (the credential itself is never kept): an ``ek_`` key's grant
    (its session config, so a fresh key minted with the same config resumes once the first one expired),
    else the bearer token, else nothing (a server without a token: the handle alone suffices)."""
    if grant_session is not None:
        material = "grant:" + json.dumps(grant_session, sort_keys=True, separators=(",", ":"))
    elif token:
        material = "token:" + token
    else:
        material = "open"
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass(frozen=True)
class Refusal:
    """Why a resume is refused: ``label`` for metrics and logs, ``code`` the close code, ``message`` the
    client's sentence (an error event on Realtime)."""

    label: str
    code: int
    message: str


UNKNOWN = Refusal("resume_unknown", 1008, "the resume handle is unknown or has expired (its session ended): "
                  "start a new session")
EXPIRED = Refusal("resume_expired", 1008, "the resume handle has expired: the session ended after its resume window "
                  "passed; start a new session")
UNAUTHORIZED = Refusal("resume_unauthorized", 1008, "the resume handle was not issued to these credentials")
WRONG_ENDPOINT = Refusal("resume_endpoint", 1008, "the resume handle belongs to a session on another endpoint: "
                         "reconnect to the endpoint that opened it")
DRAINING = Refusal("draining", 1001, "server shutting down: reconnect with the same handle through the load balancer")
FULL = Refusal("full", 1013, "server full, retry later")


@dataclass(frozen=True)
class HeldState:
    """What the decision needs of a held session."""

    binding: str
    away_since: float | None
    grace_s: float
    ended: bool


def judge(state: HeldState | None, binding: str, now: float) -> Refusal | None:
    """May a connection with ``binding`` resume the session ``state`` describes at ``now``? None: yes."""
    if state is None:
        return UNKNOWN
    if state.ended:
        return EXPIRED
    if not secrets.compare_digest(state.binding, binding):
        return UNAUTHORIZED
    if state.away_since is not None and now - state.away_since > state.grace_s:
        return EXPIRED
    return None


@runtime_checkable
class ResumeWire(Protocol):
    """A wire that carries resume handles (kame's extras, opt-in)."""

    @property
    def resume_offered(self) -> bool:
        """Whether this client asked for what carries the handle (a standard client did not)."""

    def resumable(self, handle: str, expires_in_s: float) -> list[Outgoing]: ...

    def resumed(self, info: dict[str, Any]) -> list[Outgoing]: ...

    def ending_with_handle(self, reason: str, seconds_left: float, handle: str) -> list[Outgoing]: ...


class ResumeRegistry:
    """This replica's resumable sessions by handle, its store, and the grace window (one per app)."""

    def __init__(self, grace_s: float, store: SessionStore | None = None, store_ttl_s: float = 120.0,
                 draining: Callable[[], bool] = lambda: False, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self.store = store
        self.store_ttl_s = store_ttl_s
        self.draining = draining
        self.clock = clock
        self.held: dict[str, ResumeHook] = {}
        self._ended: dict[str, None] = {}

    def issue(self, hook: ResumeHook, session_id: str) -> str:
        """A new handle for ``hook``'s session; its previous one stops working."""
        if hook.handle is not None:
            self.held.pop(hook.handle, None)
        handle = new_handle(session_id)
        self.held[handle] = hook
        return handle

    def forget(self, hook: ResumeHook) -> None:
        if hook.handle is not None and self.held.get(hook.handle) is hook:
            del self.held[hook.handle]
            self._ended[hook.handle] = None
            while len(self._ended) > REMEMBERED_ENDS:
                self._ended.pop(next(iter(self._ended)))

    def check(self, handle: str, binding: str) -> tuple[ResumeHook | None, Refusal | None]:
        """The local session ``handle`` names, or why it cannot be resumed here (None, None: not here)."""
        hook = self.held.get(handle)
        if hook is None:
            return None, (EXPIRED if handle in self._ended else None)
        refusal = judge(hook.state(), binding, self.clock())
        return (hook, None) if refusal is None else (None, refusal)


class ResumeHook:
    """One resumable session's side of the registry: the runtime calls it at its start, when its connection
    drops, when the server drains and at its end (server/runtime/session.py)."""

    def __init__(self, registry: ResumeRegistry, binding: str, wire: ResumeWire,
                 restored: Snapshot | None = None) -> None:
        self.registry = registry
        self.binding = binding
        self.wire = wire
        self.restored = restored
        self.handle: str | None = None
        self.runtime: SessionRuntime | None = None
        self.away_since: float | None = None
        self.ended = False
        self.handed_over = False
        #: Set when the connection now attached is let go (dropped, taken over, or the session ended).
        self.released = asyncio.Event()
        self._expiry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writing = asyncio.Lock()  # one write at a time: a refresh never lands after the final entry

    @property
    def store(self) -> SessionStore | None:
        """Where this session goes on a drain: the registry's store, unless its wire cannot be rebuilt on
        another replica (``movable`` False: a Live session whose config history outgrew what it keeps); such
        a session resumes on its own replica only and drains as today."""
        return self.registry.store if getattr(self.wire, "movable", True) else None

    def state(self) -> HeldState:
        return HeldState(self.binding, self.away_since, self.registry.grace_s, self.ended)

    # ------------------------------------------------------------------ called by the runtime
    def started(self, runtime: SessionRuntime) -> None:
        """The session runs: its first handle if its client asked for it (and, when it came from another
        replica, its conversation)."""
        self.runtime = runtime
        if self.restored is not None:
            turns = restore_turns(runtime, self.restored.turns)
            runtime.say(self.wire.resumed({"session_id": runtime.id, "voice": "fresh", "turns_restored": turns,
                                           "lost": ["output audio in flight", "the voice's state"]}))
        self.offer(runtime)

    def offer(self, runtime: SessionRuntime) -> None:
        """The first handle, once the client asked for it (at the start, or when it turned kame's events on)."""
        if self.handle is None and not self.ended and self.wire.resume_offered:
            self.handle = self.registry.issue(self, runtime.id)
            runtime.say(self.wire.resumable(self.handle, self.registry.grace_s))

    def hold(self, runtime: SessionRuntime) -> bool:
        """The client's connection dropped: hold the session (True), or let it end as today (False)."""
        if self.ended or self.handle is None or self.registry.grace_s <= 0:
            return False
        moving = self.registry.draining() and self.store is not None
        if self.registry.draining() and not moving:  # nowhere to resume: today's end
            return False
        if runtime.client_close_code in CLEAN_CLOSES and not moving:  # the client said goodbye: the session ends
            return False
        runtime.detach_transport()
        self.away_since = self.registry.clock()
        self.released.set()
        runtime.log.info("connection lost: session held for %.0f s for a resume", self.registry.grace_s)
        if self.registry.draining() and self.store is not None:
            self._spawn(self._hand_over(runtime))
        else:
            loop = asyncio.get_running_loop()
            self._expiry = loop.call_later(self.registry.grace_s, self._expire, runtime)
        return True

    def draining(self, runtime: SessionRuntime, seconds_left: float) -> list[Outgoing] | None:
        """The drain's notice with the handle, the conversation written to the store meanwhile; None without
        a store (the session cannot move: the wire's usual notice, today's drain)."""
        if self.store is None or self.handle is None:
            return None
        if self.away_since is not None:
            self._spawn(self._hand_over(runtime))
            return []
        self._spawn(self._refresh(runtime, seconds_left))
        return self.wire.ending_with_handle("draining", seconds_left, self.handle)

    def session_ended(self) -> None:
        self.ended = True
        self.released.set()
        if self._expiry is not None:
            self._expiry.cancel()
        self.registry.forget(self)

    # ------------------------------------------------------------------ called by the resume route
    async def resume(self, transport: Transport, opening: Sequence[Outgoing]) -> None:
        """Attach ``transport`` (taking over from a connection still attached), then wait until it is let go."""
        runtime = self.runtime
        assert runtime is not None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        away_s = 0.0 if self.away_since is None else self.registry.clock() - self.away_since
        if self.away_since is None:  # the old connection looks alive (a half-open TCP): the new one wins
            old = runtime.detach_transport()
            self.released.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.close(1000, "resumed on another connection"), 1.0)
        self.away_since = None
        self.released = asyncio.Event()
        self.handle = self.registry.issue(self, runtime.id)
        lost = ["output audio written to the dropped connection", "input audio sent while away"]
        messages = [*opening, *self.wire.resumed({"session_id": runtime.id, "voice": "continued",
                                                   "away_s": round(away_s, 2), "lost": lost}),
                    *self.wire.resumable(self.handle, self.registry.grace_s)]
        runtime.attach_transport(transport, messages)
        runtime.log.info("session resumed after %.1f s away", away_s)
        await self.released.wait()

    # ------------------------------------------------------------------ inside
    def _expire(self, runtime: SessionRuntime) -> None:
        self._expiry = None
        if self.away_since is not None and not self.ended:
            runtime.log.info("resume window passed: session ends")
            runtime.end("resume_expired", None)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, runtime: SessionRuntime, *, final: bool) -> bool:
        store = self.store
        if store is None or self.handle is None:
            return False
        async with self._writing:
            if not final and self.handed_over:
                return False
            snapshot = snapshot_of(runtime, self.binding, final=final)
            try:
                await store.put(self.handle, snapshot, self.registry.store_ttl_s)
            except Exception as exc:  # noqa: BLE001 - the store down: the session drains as today
                runtime.log.warning("writing the session to the resume store failed: %s", exc.__class__.__name__)
                return False
            return True

    async def _refresh(self, runtime: SessionRuntime, seconds_left: float, period_s: float = 1.0) -> None:
        """The store's entry kept current while the client has not left yet (a client that never leaves is
        closed by the drain: the other replica then takes the last entry written)."""
        deadline = self.registry.clock() + seconds_left
        while not self.ended and not self.handed_over and self.away_since is None:
            await self._write(runtime, final=False)
            if self.registry.clock() >= deadline:
                return
            await asyncio.sleep(period_s)

    async def _hand_over(self, runtime: SessionRuntime) -> None:
        """Draining, the client gone: the final state to the store, then the session ends here."""
        if self.handed_over:
            return
        self.handed_over = True
        written = await self._write(runtime, final=True)
        runtime.log.info("session handed over to the resume store" if written else "hand-over failed")
        runtime.end("handed_over" if written else "draining", None)


def snapshot_of(runtime: SessionRuntime, binding: str, *, final: bool) -> Snapshot:
    from kame.server.access.ephemeral import settings_to_json

    wire_state = getattr(runtime.wire, "resume_state", None)
    # the delegation is rebuilt by the wire from its own state (it holds the server's back-end catalog)
    settings = settings_to_json(replace(runtime.settings, delegation=None))
    return Snapshot(session_id=runtime.id, protocol=runtime.protocol, binding=binding, settings=settings,
                    turns=conversation_turns(runtime), final=final, wire=wire_state() if wire_state else {})


def conversation_turns(runtime: SessionRuntime) -> list[list[str]]:
    """The back-end's conversation as text: the oracle's transcript, or a Responses delegation's log."""
    from kame.session.responses.conversation import ConversationLog, log_turns

    log = getattr(getattr(runtime.pipeline, "source", None), "conversation", None)
    if isinstance(log, ConversationLog):
        return log_turns(log)
    oracle = getattr(runtime.pipeline, "oracle", None)
    if oracle is None:
        return []
    return [[turn.role, turn.text] for turn in oracle.transcript.turns if turn.text]


def restore_turns(runtime: SessionRuntime, turns: Sequence[Sequence[str]]) -> int:
    """Another replica's conversation into this session's back-end history; how many turns."""
    from kame.session.responses.conversation import ConversationLog, restore_log

    log = getattr(getattr(runtime.pipeline, "source", None), "conversation", None)
    if isinstance(log, ConversationLog):
        return restore_log(log, turns)
    oracle = getattr(runtime.pipeline, "oracle", None)
    if oracle is None:
        return 0
    count = 0
    for i, (role, text) in enumerate(turns):
        if role in ("user", "assistant", "system"):
            oracle.transcript.add_item(f"resumed-{i}", role, text)
            count += 1
    return count


def registry_of(app_state: Any, cfg: Any, draining: Callable[[], bool]) -> ResumeRegistry:
    """The app's registry (``app.state.kame_resume``), made on first use from ``server`` config ``cfg``."""
    registry: ResumeRegistry | None = getattr(app_state, "kame_resume", None)
    if registry is None:
        store: SessionStore | None = None
        if cfg.resume_store_url is not None and cfg.resume_store_url.get_secret_value():
            from kame.server.runtime.store import RedisStore

            store = RedisStore(cfg.resume_store_url.get_secret_value())
        registry = ResumeRegistry(cfg.resume_grace_s, store, cfg.resume_store_ttl_s, draining)
        app_state.kame_resume = registry
    return registry
