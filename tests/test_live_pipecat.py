"""kame's Live wire against Pipecat's own Live event models (pipecat-ai 1.14): every client event that
``OpenAILiveLLMService`` builds is accepted without an ``error`` (Pipecat treats any error as a pipeline
failure), and every server event kame sends parses into Pipecat's model for it. Pure; the same flow
against the running server is in tests/test_live_server.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kame.server.wires.ids import Ids
from kame.server.wires.live.config import LiveServerInfo
from kame.server.wires.live.events import ErrorEvent, KameEvent, LiveEncoder
from tests.support.live_pipecat import pipecat_live_events
from tests.support.live_session import LiveSession

INFO = LiveServerInfo(session_id="0123456789ab", asr="whisper", admitted_at=1_800_000_000.0)


@pytest.fixture(scope="module")
def encode(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[int]]:
    import sentencepiece as spm

    from kame.frontend.tiny import train_tokenizer

    path: Path = tmp_path_factory.mktemp("sp") / "tok.model"
    train_tokenizer(path, vocab_size=400)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return lambda text: list(sp.encode(text, out_type=int))


def test_pipecats_client_events_are_accepted_and_its_parser_reads_ours(encode: Callable[[str], list[int]]) -> None:
    pc = pipecat_live_events()
    wire = LiveSession(INFO, encode)
    enc = LiveEncoder(Ids("pc"))
    sent: list[Any] = []

    def client(event: Any, now: float) -> None:
        out = wire.message(json.dumps(event.to_payload()), now)
        assert not out.errors, [e.message for e in out.errors]
        sent.extend(out.events)

    # what OpenAILiveLLMService sends at start: model, instructions, history, client delegation, store
    history = [pc.InputItem(role="user", content=[pc.InputTextContent(text="Hi there")]),
               pc.InputItem(role="assistant", content=[pc.OutputTextContent(text="Hello!")])]
    client(pc.SessionStartEvent(session=pc.SessionConfig(
        model="gpt-live-1", instructions="You are a helpful assistant.", input=history,
        delegation=pc.ClientDelegationConfig(), store=False,
        audio=pc.AudioConfig(output=pc.AudioOutputConfig(voice="marin")))), 0.0)
    client(pc.InputAudioAppendEvent(audio="AAAAAA=="), 0.1)
    for step in range(3):
        sent += wire.assistant_frame(np.zeros(1920, np.float32), "\u2581Sure" if step == 1 else None, step)
    sent += wire.partial(1, 0.8, "what is", 0.9, text="what is the")
    sent += wire.final(1, 1.6, "what is the weather", 1.7)
    delegation_id = wire.answers.book.latest.id if wire.answers.book.latest else None
    client(pc.SessionCommentaryAppendEvent(delegation_id=delegation_id, content="It is sunny today."), 2.0)
    client(pc.SessionThinkingAppendEvent(delegation_id=delegation_id, content="The user is in Paris."), 2.1)
    client(pc.SessionInstructionsAppendEvent(delegation_id=None, content="Keep it short."), 2.2)
    client(pc.SessionUpdateEvent(session=pc.SessionUpdateConfig(delegation=pc.ClientDelegationConfig())), 2.3)
    sent += wire.tick(6.0)
    client(pc.SessionCloseEvent(), 7.0)
    sent += wire.ending("close_requested", "", 7.0)
    sent.append(KameEvent("kame.oracle.reset", {"text": "It is sunny today.", "tokens": 6}))
    sent.append(ErrorEvent("unknown_delegation", "no such delegation", param="delegation_id", client_event_id="x"))

    parsed = [pc.parse_server_event(enc.encode(event)) for event in sent]  # raises on a model mismatch
    kinds = {type(p).__name__ for p in parsed}
    for name in ("SessionStartedEvent", "SessionUpdatedEvent", "OutputAudioDeltaEvent", "TranscriptDeltaEvent",
                 "SessionDelegationCreatedEvent", "ContextAppendedEvent", "SessionUsageUpdatedEvent",
                 "SessionClosedEvent", "ErrorEvent", "UnknownServerEvent"):
        assert name in kinds, (name, kinds)
    by_type = {p.type: p for p in parsed}
    assert by_type["session.delegation.created"].delegation.id == delegation_id
    assert by_type["session.started"].session.delegation == {"type": "client"}
    roles = [p.role for p in parsed if type(p).__name__ == "TranscriptDeltaEvent"]
    assert "user" in roles and "assistant" in roles
    assert by_type["session.closed"].reason == "close_requested" and by_type["session.closed"].usage.seconds == 7.0
    assert by_type["error"].error.code == "unknown_delegation"
    # what Pipecat's delegation flow reads: user fragments concatenate into the words said
    user = "".join(p.delta for p in parsed if type(p).__name__ == "TranscriptDeltaEvent" and p.role == "user")
    assert user == "what is the weather"
