"""/v1/realtime responses and items as OpenAI's clients expect them (docs/protocol.md 3.7), at the wire:
response.create / .cancel, item create / retrieve / delete / truncate, one response at a time with a
function call as its last item, kame.* events only when asked. Every server event is parsed by the official
SDK's ``RealtimeServerEvent`` union (the Agents SDK validates each one the same way). No server, no torch."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from pydantic import TypeAdapter

from kame.server.runtime.wire import Command, Fault, FunctionOutputIn, Outgoing, Reply, SettingsIn
from kame.server.wires.realtime.settings import ServerInfo
from kame.server.wires.realtime.wire import RealtimeWire
from kame.session import commands as sc
from kame.session import events as pe
from kame.session.settings import SessionSettings

INFO = ServerInfo(session_id="abcdef012345", backends=("llm",), default_backend="llm", asr_kind="whisper",
                  tools_backends=("llm",))
LOUD = np.full(1920, 0.3, np.float32)
QUIET = np.zeros(1920, np.float32)


def _adapter() -> TypeAdapter[Any]:
    from openai.types.realtime.realtime_server_event import RealtimeServerEvent

    return TypeAdapter(RealtimeServerEvent)


ADAPTER = _adapter()


class Client:
    """Drives a wire as the runtime does, keeps every server event (parsed by the SDK) and every command."""

    def __init__(self, wire: RealtimeWire) -> None:
        self.wire = wire
        self.events: list[dict[str, Any]] = []
        self.commands: list[sc.ConversationCommand] = []
        self.step = 0
        self.take(wire.opening(wire.settings))

    def take(self, out: list[Outgoing]) -> list[dict[str, Any]]:
        got = [json.loads(o.data) for o in out if isinstance(o.data, str)]
        for e in got:
            if not e["type"].startswith("kame."):  # those only reach a client that asked for them
                ADAPTER.validate_python(e)  # raises when the SDK cannot parse it
        self.events += got
        return got

    def send(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        for c in self.wire.decode({"type": "websocket.receive", "text": json.dumps(event)}, 0.0):
            got += self.apply(c)
        return got

    def apply(self, c: Command) -> list[dict[str, Any]]:
        if isinstance(c, Reply):
            return self.take(list(c.messages))
        if isinstance(c, Fault):
            return self.take(list(c.reply))
        if isinstance(c, sc.ConversationCommand):  # the session's own command, not wrapped
            self.commands.append(c)
        if isinstance(c, SettingsIn):
            return self.take(self.wire.settings_applied(c.settings, c))
        if isinstance(c, FunctionOutputIn):  # the pipeline took it (a call waited for it)
            return self.take(self.wire.function_output_accepted(c))
        return []

    def frames(self, pcm: np.ndarray, n: int, piece: str | None = None) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        for _ in range(n):
            self.step += 1
            frame = pe.AssistantFrame(step=self.step, pcm=pcm, text_id=5 if piece else None, piece=piece, oracle_id=-1)
            out = self.wire.frame(frame, self.step, True)
            self.commands += [o for o in out if isinstance(o, sc.ConversationCommand)]
            got += self.take([o for o in out if isinstance(o, Outgoing)])
        return got

    def event(self, event: pe.PipelineEvent) -> list[dict[str, Any]]:
        return self.take(self.wire.event(event))

    def types(self, events: list[dict[str, Any]] | None = None) -> list[str]:
        return [e["type"] for e in (self.events if events is None else events)]


def _check_one_response_at_a_time(events: list[dict[str, Any]]) -> None:
    """No event names a response that is not the current one; every response that was created ends once."""
    current: str | None = None
    for e in events:
        rid = e.get("response_id") or (e.get("response") or {}).get("id")
        if e["type"] == "response.created":
            assert current is None, f"{rid} created while {current} is open"
            current = rid
        elif e["type"] == "response.done":
            assert rid == current, (rid, current)
            current = None
        elif rid is not None:
            assert rid == current, f"{e['type']} names {rid}, the current response is {current}"


def test_a_plain_client_gets_no_kame_events_unless_it_asks() -> None:
    plain = Client(RealtimeWire(INFO, SessionSettings()))
    plain.frames(QUIET, 3)  # audio outside responses is a kame event
    plain.event(pe.UserPartial(utterance=1, audio_s=0.5, text="hello", stable=""))
    plain.event(pe.LlmRequestStarted(request_id=1, backend="llm", turn_id=1, reason="words"))
    plain.event(pe.OracleReset(request_id=1, tokens=3, text="Hi"))
    assert plain.events and not [t for t in plain.types() if t.startswith("kame.")], plain.types()
    # a kame object in session.update turns them on; "events": false off again
    plain.send({"type": "session.update", "session": {"type": "realtime", "kame": {"oracle_policy": "reset"}}})
    assert plain.events[-1]["session"]["kame"]["events"] is True
    assert [e["type"] for e in plain.event(pe.OracleReset(request_id=2, tokens=3, text="Hi"))] == ["kame.oracle.reset"]
    plain.send({"type": "session.update", "session": {"kame": {"events": False}}})
    assert plain.event(pe.OracleReset(request_id=3, tokens=3, text="Hi")) == []
    # ?kame_events=1 from the start
    asked = Client(RealtimeWire(INFO, SessionSettings(), kame_events=True))
    assert "kame.output_audio.delta" in asked.types(asked.frames(QUIET, 1))


def test_response_create_starts_a_response_at_once_echoing_metadata_and_asks_the_backend() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    c.frames(LOUD, 3, "\u2581Hi")  # Moshi speaks by itself: an unrequested response
    got = c.send({"type": "response.create", "event_id": "e1",
                  "response": {"metadata": {"client_event_id": "e1"}, "instructions": "Be brief.",
                               "input": [{"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": "Say hi."}]}]}})
    # the unrequested one ends completed, the requested one is created at once with the metadata
    assert c.types(got) == ["response.output_audio.done", "response.output_audio_transcript.done",
                            "response.content_part.done", "response.output_item.done", "conversation.item.done",
                            "response.done", "response.created"], c.types(got)
    assert got[-2]["response"]["status"] == "completed"
    assert got[-1]["response"]["metadata"] == {"client_event_id": "e1"}
    request = c.commands[-1]
    assert isinstance(request, sc.RequestAnswer) and request.instructions == "Be brief."
    assert request.context is not None and request.context[0].text == "Say hi." and not request.continue_tools
    # a second response.create while it is open: the one error OpenAI gives too
    err = c.send({"type": "response.create", "event_id": "e2"})
    assert [e["error"]["code"] for e in err] == ["conversation_already_has_active_response"]
    # Moshi's speech goes into it; it ends completed after the end gap of silence
    spoke = c.frames(LOUD, 4, "\u2581Hello")
    assert spoke[0]["type"] == "response.output_item.added" and spoke[0]["response_id"] == got[-1]["response"]["id"]
    done = c.frames(QUIET, 10)
    assert done[-1]["type"] == "response.done" and done[-1]["response"]["status"] == "completed"
    assert done[-1]["response"]["metadata"] == {"client_event_id": "e1"}
    assert done[-1]["response"]["output"][0]["content"][0]["transcript"] == "Hello Hello Hello Hello"
    _check_one_response_at_a_time(c.events)


def test_a_requested_response_moshi_never_speaks_in_ends_empty() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    c.send({"type": "response.create"})
    got = c.frames(QUIET, 80)
    assert c.types(got)[-1] == "response.done" and got[-1]["response"]["output"] == []
    assert c.types(got).count("response.done") == 1


def test_response_cancel_ends_it_cancelled_withholds_the_rest_and_resets_the_oracle() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    err = c.send({"type": "response.cancel", "event_id": "c0"})
    assert [e["error"]["code"] for e in err] == ["response_cancel_not_active"]
    c.frames(LOUD, 3, "\u2581Hi")
    got = c.send({"type": "response.cancel"})
    assert got[-1]["type"] == "response.done" and got[-1]["response"]["status"] == "cancelled"
    assert got[-1]["response"]["status_details"]["reason"] == "client_cancelled"
    assert isinstance(c.commands[-1], sc.CancelAnswer)
    # Moshi goes on talking: withheld until it has been silent for the end gap
    assert c.frames(LOUD, 20, "\u2581more") == []
    assert not [k for k in c.commands if isinstance(k, sc.ForgetSpeech)]
    assert c.frames(QUIET, 10) == []
    # the user never heard those words (steps 4..23): they leave the back-end's history once withholding ends
    forget = [k for k in c.commands if isinstance(k, sc.ForgetSpeech)]
    assert len(forget) == 1 and forget[0].start_step == 4 and 24 <= forget[0].end_step <= c.step, forget
    assert c.types(c.frames(LOUD, 1, "\u2581new"))[0] == "response.created"
    assert len([k for k in c.commands if isinstance(k, sc.ForgetSpeech)]) == 1  # what is sent again stays
    _check_one_response_at_a_time(c.events)


def test_response_create_after_a_cancel_first_forgets_what_was_withheld() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    c.frames(LOUD, 2, "\u2581Hi")
    c.send({"type": "response.cancel"})
    c.frames(LOUD, 5, "\u2581more")  # steps 3..7, withheld
    c.send({"type": "response.create"})
    forget = [k for k in c.commands if isinstance(k, sc.ForgetSpeech)]
    assert [(f.start_step, f.end_step) for f in forget] == [(3, 8)]
    # the forgetting comes before the request, so the back-end's new request does not read those words
    assert c.commands.index(forget[0]) < max(i for i, k in enumerate(c.commands) if isinstance(k, sc.RequestAnswer))
    assert c.frames(LOUD, 1, "\u2581Sure")[0]["type"] == "response.output_item.added"  # no longer withheld


def test_speech_cancels_the_open_response_with_interrupt_response() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "interrupt_response": True}}}}})
    assert c.events[-1]["session"]["audio"]["input"]["turn_detection"]["interrupt_response"] is True
    c.frames(LOUD, 3, "\u2581Hi")
    c.event(pe.SpeechStarted(utterance=1, audio_s=1.0))
    got = c.event(pe.AnswerCancelled(reason="turn_detected"))  # what the pipeline reports after speech_started
    assert got[-1]["type"] == "response.done" and got[-1]["response"]["status"] == "cancelled"
    assert got[-1]["response"]["status_details"]["reason"] == "turn_detected"


def _barged_in(create_response: bool) -> Client:
    """Moshi talks, the user speaks over it (interrupt_response): cancelled, and Moshi never goes quiet."""
    c = Client(RealtimeWire(INFO, SessionSettings(interrupt_response=True, create_response=create_response)))
    c.frames(LOUD, 3, "\u2581Hi")
    c.event(pe.SpeechStarted(utterance=1, audio_s=1.0))
    c.event(pe.AnswerCancelled(reason="turn_detected"))
    assert c.frames(LOUD, 5, "\u2581more") == []  # steps 4..8: withheld
    return c


def test_the_users_committed_turn_ends_what_a_cancel_withheld() -> None:
    """With create_response the committed turn is answered: Moshi's next words are its response, even from a
    Moshi that never goes quiet for the end gap (docs/protocol.md 3.7)."""
    c = _barged_in(create_response=True)
    got = c.event(pe.SpeechStopped(utterance=1, audio_s=2.0))
    assert "input_audio_buffer.committed" in c.types(got)
    after = c.frames(LOUD, 2, "\u2581Sure")
    assert c.types(after)[:2] == ["response.created", "response.output_item.added"]
    assert "response.output_audio.delta" in c.types(after)
    forget = [k for k in c.commands if isinstance(k, sc.ForgetSpeech)]
    assert [(f.start_step, f.end_step) for f in forget] == [(4, 9)]  # the withheld words, never heard
    _check_one_response_at_a_time(c.events)


def test_a_final_without_speech_stopped_commits_and_ends_what_was_withheld() -> None:
    c = _barged_in(create_response=True)
    got = c.event(pe.UserFinal(utterance=1, audio_s=2.0, text="wait"))
    assert "input_audio_buffer.committed" in c.types(got)
    assert c.types(c.frames(LOUD, 1, "\u2581Sure"))[0] == "response.created"


def test_a_typed_user_message_ends_moshis_unrequested_response_but_not_a_requested_one() -> None:
    """A typed turn is a user turn: Moshi's next words are a new response, so a client that waits for the
    response in progress to end before its response.create (the Agents SDK) does not wait for Moshi to go quiet."""
    c = Client(RealtimeWire(INFO, SessionSettings()))
    c.frames(LOUD, 3, "\u2581Hi")
    message = {"type": "conversation.item.create",
               "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a joke"}]}}
    got = c.send(message)
    assert c.types(got)[:2] == ["conversation.item.added", "conversation.item.done"]
    assert got[-1]["type"] == "response.done" and got[-1]["response"]["status"] == "completed"
    # Moshi's audio is held for the client's response.create, at most the end gap (steps 4..13)
    assert c.frames(LOUD, 10, "\u2581So") == []
    assert c.types(c.frames(LOUD, 1, "\u2581So"))[0] == "response.created"
    assert [(f.start_step, f.end_step) for f in c.commands if isinstance(f, sc.ForgetSpeech)] == [(4, 14)]
    # a response.create ends the hold at once, and a requested response goes on after another message
    c.frames(QUIET, 10)
    c.frames(LOUD, 1, "\u2581Hi")
    c.send(message)
    assert c.frames(LOUD, 2, "\u2581So") == []
    c.send({"type": "response.create"})
    assert "response.output_audio.delta" in c.types(c.frames(LOUD, 1, "\u2581Sure"))
    assert "response.done" not in c.types(c.send(message))
    assert "response.output_audio.delta" in c.types(c.frames(LOUD, 1, "\u2581Sure"))
    _check_one_response_at_a_time(c.events)


def test_without_create_response_a_commit_keeps_withholding() -> None:
    """No response follows the commit by itself: the withheld audio waits for response.create or the end gap."""
    c = _barged_in(create_response=False)
    c.event(pe.SpeechStopped(utterance=1, audio_s=2.0))
    assert c.frames(LOUD, 5, "\u2581more") == []
    c.send({"type": "response.create"})
    assert "response.output_item.added" in c.types(c.frames(LOUD, 1, "\u2581Sure"))


def test_a_function_call_is_the_last_item_of_the_response_in_progress() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    c.frames(LOUD, 3, "\u2581Let")
    got = c.event(pe.FunctionCallRequested(call_id="call_1", tool="get_weather", arguments='{"city": "Paris"}',
                                           read_only=True))
    assert got[-1]["type"] == "response.done"
    output = got[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["message", "function_call"] and output[1]["call_id"] == "call_1"
    added = [e for e in got if e["type"] == "response.output_item.added"]
    assert added[0]["output_index"] == 1
    # Moshi's later speech is a new response; the output and response.create continue the tool loop
    assert c.types(c.frames(LOUD, 1, "\u2581check"))[0] == "response.created"
    c.send({"type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}})
    c.send({"type": "response.create"})
    assert isinstance(c.commands[-1], sc.RequestAnswer) and c.commands[-1].continue_tools
    # a call with no response open is a response of its own
    c.frames(QUIET, 80)
    alone = c.event(pe.FunctionCallRequested(call_id="call_2", tool="get_weather", arguments="{}", read_only=True))
    assert alone[0]["type"] == "response.created" and alone[-1]["type"] == "response.done"
    _check_one_response_at_a_time(c.events)


def test_items_create_retrieve_delete_truncate() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    got = c.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "system", "content": [{"type": "input_text", "text": "The user is Ann."}]}})
    assert c.types(got) == ["conversation.item.added", "conversation.item.done"]
    item_id = got[0]["item"]["id"]
    add = c.commands[-1]
    assert isinstance(add, sc.AddContext) and add.item == sc.ContextItem(item_id, "system", "The user is Ann.")
    assert c.send({"type": "conversation.item.retrieve", "item_id": item_id})[0]["item"]["id"] == item_id
    # a user turn the ASR heard: retrieve, then delete (forgotten by its utterance)
    c.event(pe.SpeechStarted(utterance=4, audio_s=1.0))
    c.event(pe.UserFinal(utterance=4, audio_s=2.0, text="what time is it"))
    user_id = [e for e in c.events if e["type"] == "input_audio_buffer.speech_started"][-1]["item_id"]
    retrieved = c.send({"type": "conversation.item.retrieve", "item_id": user_id})[0]["item"]
    assert retrieved["content"][0]["transcript"] == "what time is it"
    assert c.types(c.send({"type": "conversation.item.delete", "item_id": user_id})) == ["conversation.item.deleted"]
    assert c.commands[-1] == sc.ForgetContext(sc.utterance_key(4))
    # an assistant message the user heard 160 ms of: the rest leaves the back-end's history
    first = c.frames(LOUD, 5, "\u2581Noon")
    assistant_id = first[1]["item"]["id"]
    start = c.step - 4
    c.frames(QUIET, 10)
    got = c.send({"type": "conversation.item.truncate", "item_id": assistant_id, "content_index": 0, "audio_end_ms": 160})
    assert c.types(got) == ["conversation.item.truncated"]
    assert c.commands[-1] == sc.ForgetSpeech(start + 2, c.step + 1)  # its trailing silence belongs to it
    # unknown items: OpenAI's error too
    assert [e["error"]["code"] for e in c.send({"type": "conversation.item.retrieve", "item_id": "nope"})] == ["item_not_found"]
    # output_audio_buffer.clear stays an error on a websocket
    assert [e["error"]["code"] for e in c.send({"type": "output_audio_buffer.clear"})] == ["unsupported_event"]


def test_a_requested_response_ends_once_its_answer_was_fed_even_if_moshi_talks_on() -> None:
    c = Client(RealtimeWire(INFO, SessionSettings()))
    created = c.send({"type": "response.create"})[-1]["response"]["id"]
    for i in range(6):  # the answer's tokens reach Moshi, one per step
        c.step += 1
        c.take(c.wire.frame(pe.AssistantFrame(step=c.step, pcm=LOUD, text_id=5, piece="\u2581Sure", oracle_id=40 + i),
                            c.step, True))
    got = c.frames(LOUD, 12, "\u2581blah")  # Moshi goes on (oracle idle: -1)
    done = [e for e in got if e["type"] == "response.done"]
    assert len(done) == 1 and done[0]["response"]["id"] == created and done[0]["response"]["status"] == "completed"
    assert got[-1]["response_id"] != created  # what Moshi says next is a new, unrequested response
    _check_one_response_at_a_time(c.events)
