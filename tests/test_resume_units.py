"""The resume decisions without a server (server/runtime/resume.py, server/runtime/store.py): handles are
unguessable and rotate, a handle is bound to what opened the session, the window expires, a store entry is
taken once and only by its binding."""

from __future__ import annotations

import asyncio

from kame.redaction import redact
from kame.server.runtime.resume import (
    EXPIRED,
    UNAUTHORIZED,
    UNKNOWN,
    HeldState,
    ResumeHook,
    ResumeRegistry,
    binding_of,
    judge,
    new_handle,
    route_of,
)
from kame.server.runtime.store import Snapshot, claim, store_key


def test_handles_are_long_random_and_url_safe() -> None:
    handles = {new_handle("0123abcd") for _ in range(200)}
    assert len(handles) == 200
    for h in handles:
        route, _, secret = h.partition(".")
        assert route == "0123abcd" and len(secret) >= 32 and all(c.isalnum() or c in "-_" for c in secret)
        assert route_of(h) == "0123abcd"
    assert route_of("A" * 32) is None and route_of("a.") is None and route_of("x/y.z") is None


def test_binding_follows_the_credential_that_opened_the_session() -> None:
    assert binding_of("tok-a", None) == binding_of("tok-a", None)
    assert binding_of("tok-a", None) != binding_of("tok-b", None)
    assert binding_of(None, None) != binding_of("tok-a", None)
    grant = {"type": "realtime", "instructions": "be brief"}
    # an ek_ key: its grant, whatever key string carried it (a fresh key minted with the same config resumes)
    assert binding_of("ek_one", grant) == binding_of("ek_two", dict(reversed(list(grant.items()))))
    assert binding_of("ek_one", grant) != binding_of("ek_one", {**grant, "instructions": "other"})
    assert "tok-a" not in binding_of("tok-a", None)


def test_judge() -> None:
    b = binding_of("tok", None)
    attached = HeldState(b, away_since=None, grace_s=30, ended=False)
    assert judge(attached, b, now=1000.0) is None  # a takeover of a half-open connection
    assert judge(None, b, 0.0) is UNKNOWN
    assert judge(attached, binding_of("other", None), 0.0) is UNAUTHORIZED
    away = HeldState(b, away_since=100.0, grace_s=30, ended=False)
    assert judge(away, b, 129.0) is None
    assert judge(away, b, 131.0) is EXPIRED
    assert judge(HeldState(b, None, 30, ended=True), b, 0.0) is EXPIRED


class _Wire:
    resume_offered = True

    def resumable(self, handle: str, expires_in_s: float) -> list[object]:
        return []

    def resumed(self, info: dict[str, object]) -> list[object]:
        return []

    def ending_with_handle(self, reason: str, seconds_left: float, handle: str) -> list[object]:
        return []


def test_registry_rotates_handles_and_remembers_ended_ones() -> None:
    registry = ResumeRegistry(grace_s=30)
    b = binding_of("tok", None)
    hook = ResumeHook(registry, b, _Wire())  # type: ignore[arg-type]
    first = hook.handle = registry.issue(hook, "sid1")
    second = hook.handle = registry.issue(hook, "sid1")
    assert first != second
    assert registry.check(first, b) == (None, None)  # a rotated handle names nothing here
    assert registry.check(second, b) == (hook, None)
    assert registry.check(second, binding_of("x", None)) == (None, UNAUTHORIZED)
    hook.session_ended()
    assert registry.check(second, b) == (None, EXPIRED)


class _MemoryStore:
    def __init__(self) -> None:
        self.data: dict[str, Snapshot] = {}

    async def put(self, handle: str, snapshot: Snapshot, ttl_s: float) -> None:
        self.data[store_key(handle)] = snapshot

    async def get(self, handle: str) -> Snapshot | None:
        return self.data.get(store_key(handle))

    async def take(self, handle: str) -> Snapshot | None:
        return self.data.pop(store_key(handle), None)

    async def aclose(self) -> None:
        pass


def test_claim_checks_the_binding_before_taking_and_takes_once() -> None:
    async def main() -> None:
        store = _MemoryStore()
        b = binding_of("tok", None)
        snap = Snapshot("abc", "realtime", b, {"voice": None}, [["user", "hi"]], final=True)
        await store.put("h", snap, 60)
        assert await claim(store, "h", binding_of("bad", None)) == (None, "unauthorized")
        assert await store.get("h") == snap  # untouched
        taken, why = await claim(store, "h", b)
        assert taken == snap and why is None
        assert await claim(store, "h", b) == (None, "unknown")
        # an entry still being written by the draining replica is waited for, then taken as it is
        await store.put("g", Snapshot("d", "realtime", b, {}, [], final=False), 60)
        taken, _ = await claim(store, "g", b, wait_final_s=0.2, poll_s=0.05)
        assert taken is not None and not taken.final

    asyncio.run(main())


def test_snapshot_round_trip_and_keys_hide_the_handle() -> None:
    snap = Snapshot("abc", "realtime", "b", {"voice": "x"}, [["user", "hello"], ["assistant", "hi"]], final=True)
    assert Snapshot.from_json(snap.to_json()) == snap
    assert "secret-handle" not in store_key("secret-handle")


def test_handles_are_masked_in_logs() -> None:
    line = '"WebSocket /v1/realtime?model=kame&resume=Zx_9-abc&kame_events=1" [accepted]'
    assert "Zx_9-abc" not in redact(line) and "kame_events=1" in redact(line)


def test_clients_pick_the_latest_handle_and_resume_only_what_a_resume_mends() -> None:
    from kame.client.reconnect import latest_handle, resume_reason

    events = [{"type": "session.created"}, {"type": "kame.session.resumable", "handle": "s.a"},
              {"type": "kame.session.resumable", "handle": "s.b"}, {"type": "error"}]
    assert latest_handle(events) == "s.b"
    assert latest_handle([*events, {"type": "kame.session.ending", "reason": "draining", "handle": "s.c"}]) == "s.c"
    assert latest_handle([{"type": "kame.session.ending", "reason": "max_duration"}]) is None
    assert resume_reason(1006, None) is None  # no handle: today's rules
    assert resume_reason(1006, "s.b") == "the connection dropped"
    assert resume_reason(None, "s.b") == "the connection dropped"
    assert resume_reason(1001, "s.b") is not None  # a drain ended it: resume elsewhere
    assert resume_reason(1008, "s.b") is None and resume_reason(1000, "s.b") is None
    assert "draining" in (resume_reason(1000, "s.b", moving=True) or "")


def test_the_live_wire_offers_handles_only_to_an_opted_in_started_session() -> None:
    """``?kame_events=1`` on ``/v1/live/sessions``: the handle after ``session.started`` only; a resumed
    connection gets the session as it stands; a standard Live client is never offered one; another replica
    rebuilds the session from its accepted config messages, unless they outgrew what is kept."""
    import json

    from kame.server.runtime.resume import ResumeWire
    from kame.server.runtime.wire import SettingsIn
    from kame.server.wires.live.config import LiveServerInfo
    from kame.server.wires.live.wire import LiveWire
    from kame.server.wires.realtime.wire import kame_events_query
    from kame.session.settings import SessionSettings

    info = LiveServerInfo(session_id="feedbeef0002", asr="none", admitted_at=1_800_000_000.0)
    start = {"type": "websocket.receive", "text": json.dumps({"type": "session.start", "session": {"model": "m"}})}
    assert kame_events_query("1") and kame_events_query("true") and not kame_events_query(None)
    assert not kame_events_query("0")
    for opted in (True, False):
        wire = LiveWire(info, SessionSettings(), kame_events=opted)
        assert isinstance(wire, ResumeWire)
        assert not wire.resume_offered and wire.opening(wire.settings) == []  # the client speaks first
        command = next(c for c in wire.decode(start, 0.0) if isinstance(c, SettingsIn))
        wire.settings_applied(command.settings, command)
        assert wire.resume_offered is opted
    wire = LiveWire(info, SessionSettings(), kame_events=True)
    command = next(c for c in wire.decode(start, 0.0) if isinstance(c, SettingsIn))
    wire.settings_applied(command.settings, command)
    [again] = [json.loads(o.data) for o in wire.opening(wire.settings)]
    assert again["type"] == "session.started" and again["session"]["id"] == "live_feedbeef0002"
    [offer] = [json.loads(o.data) for o in wire.resumable("h.x", 30.0)]
    assert offer["type"] == "kame.session.resumable" and offer["handle"] == "h.x" and offer["expires_in_s"] == 30.0
    [back] = [json.loads(o.data) for o in wire.resumed({"voice": "continued", "lost": []})]
    assert back["type"] == "kame.session.resumed" and back["session_id"] == "live_feedbeef0002"
    [ending] = [json.loads(o.data) for o in wire.ending_with_handle("draining", 5.0, "h.y")]
    assert ending == {**ending, "type": "kame.session.ending", "reason": "draining", "handle": "h.y"}
    bad = {"type": "websocket.receive", "text": json.dumps({"type": "session.update", "session": {"model": "x"}})}
    wire.decode(bad, 1.0)  # refused (immutable): not part of what another replica replays
    other = LiveWire(info, SessionSettings(), kame_events=True)
    restored = other.restore(json.loads(json.dumps(wire.resume_state())), SessionSettings(), 5.0)
    assert other.config_messages == wire.config_messages and len(other.config_messages) == 1
    assert restored.delegation == command.settings.delegation and other.resume_offered
    [rebuilt] = [json.loads(o.data) for o in other.opening(restored)]
    assert rebuilt["type"] == "session.started" and rebuilt["session"]["id"] == again["session"]["id"]
    registry = ResumeRegistry(30.0, store=_MemoryStore())  # type: ignore[arg-type]
    assert wire.movable and ResumeHook(registry, "b", wire).store is registry.store
    wire.config_messages += ["{}"] * 40
    assert not wire.movable and ResumeHook(registry, "b", wire).store is None


def test_a_responses_conversation_goes_to_text_and_back() -> None:
    """What another replica rebuilds a Live session's Responses conversation from (function calls dropped)."""
    from kame.session.responses.conversation import (
        BackendTurn,
        CallOutput,
        CallRecord,
        ClientMessage,
        ConversationLog,
        Note,
        UserSpeech,
        log_turns,
        restore_log,
    )

    log = ConversationLog()
    for entry in (Note("developer", "be brief"), UserSpeech("my name is Ada"),
                  BackendTurn("", (CallRecord("c1", "f", "{}"),)), CallOutput("c1", "42"),
                  BackendTurn("Hello Ada"), ClientMessage("user", "and yours?"), Note("thinking", "she is polite")):
        log.add(entry)
    turns = log_turns(log)
    assert turns == [["note:developer", "be brief"], ["user", "my name is Ada"], ["assistant", "Hello Ada"],
                     ["user", "and yours?"], ["note:thinking", "she is polite"]]
    other = ConversationLog()
    other.add(ClientMessage("user", "the initial input, already in the turns"))
    assert restore_log(other, turns + [["tool", "ignored"]]) == 5
    assert log_turns(other) == turns
