"""/v1/live/sessions on the real CPU demo server (tiny KAME model, Whisper tiny.en ASR), driven by the
official openai SDK's ``client.live.connect()`` (through kame.client.live_client, which adds real-time
pacing and the client's own audio conversion).

An application in client delegation speaks an espeak question at real time, reads its own transcript
as append-only fragments, gets a delegation after the words it covers, answers with a commentary that
reaches Moshi's oracle (``kame.oracle.reset``), mutes, and closes with usage. The same in 16 kHz PCM
and in G.711 mu-law at 8 kHz, both ways. Every ignored field gets an ``info`` and every refused field
and event an ``error`` with the client's event id, and the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kame.client.live_client import LiveClient
from kame.oracle.config import OracleConfig
from kame.oracle.sanitize import spoken_words
from tests.support.moshi_client import ServerProcess
from tests.support.servers import LIFECYCLE_MAX_S, SECURED_IDLE_S, SECURED_TOKEN
from tests.support.speech import silence, synthesize

#: the real-time lane under xdist (tests/conftest.py): a drained server of its own besides the shared one
pytestmark = pytest.mark.realtime

TOKEN = SECURED_TOKEN
QUESTION = "What is the capital of France?"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(secured_server: ServerProcess) -> Iterator[ServerProcess]:
    """The shared ``secured`` server (tests/support/servers.py): a token, the scripted back-end alpha,
    two slots, a 4 s idle timeout."""
    yield secured_server
    assert TOKEN not in secured_server.logs()


def question_audio() -> np.ndarray:
    return np.concatenate([silence(0.3), synthesize(QUESTION), silence(2.5)])


def ordered(client: LiveClient, *types: str) -> list[dict[str, Any]]:
    return [e for _, e in client.events if e.get("type") in types]


def check_fragments(deltas: list[dict[str, Any]]) -> None:
    """Append-only fragments on the session timeline: never back in time, start <= end."""
    assert all(d["start_ms"] <= d["end_ms"] for d in deltas)
    assert all(a["end_ms"] <= b["start_ms"] for a, b in zip(deltas, deltas[1:]))


def test_sdk_question_delegation_commentary_mute_close(server: ServerProcess) -> None:
    answer = "Paris is the capital of France, with **two** million people!"

    question = question_audio()
    muted_speech = np.concatenate([synthesize("Tell me about turtles and their shells."), silence(1.5)])
    tail = silence(1.5)
    mute_at = question.size / 24000 + 1.0  # seconds into the stream

    async def main() -> tuple[LiveClient, dict[str, Any] | None, dict[str, Any] | None, float, tuple[str, int]]:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        t0 = time.time()
        started = await c.start({"model": "gpt-live-1", "store": False, "audio": {"output": {"voice": "marin"}},
                                 "delegation": {"type": "client"}}, event_id="start-1")
        assert started is not None, c.events
        # the microphone streams without a break, as a real application's does
        mic = asyncio.create_task(c.send_pcm(np.concatenate([question, silence(1.0), muted_speech, tail])))
        t_mic = time.monotonic()
        delegation = await c.wait_for_type("session.delegation.created", 15)
        assert delegation is not None, c.transcript("user")
        n = len(c.events)
        await c.conn.session.commentary.append(content=answer, delegation_id=delegation["delegation"]["id"],
                                               event_id="answer-1")
        await c.conn.session.thinking.append(content="The user likes geography.", delegation_id=None,
                                             event_id="think-1")
        fed = await c.wait_for_type("kame.oracle.reset", 5, start=n)
        # muted: the speech reaches Moshi and the ASR as silence; the output goes on
        await asyncio.sleep(max(0.0, t_mic + mute_at - 0.3 - time.monotonic()))
        await c.conn.session.input_audio.mute(event_id="mute-1")
        heard_before = c.transcript("user")
        frames_before = len(c.stats.frame_arrivals)
        await asyncio.sleep(max(0.0, t_mic + mute_at + muted_speech.size / 24000 - time.monotonic()))
        muted = (c.transcript("user"), len(c.stats.frame_arrivals) - frames_before)
        assert muted[0] == heard_before
        await c.conn.session.input_audio.unmute(event_id="unmute-1")
        await mic
        await c.drain_output(3.0, until_complete=True)
        closed = await c.close_session()
        await asyncio.wait_for(c.closed.wait(), 5)
        return c, fed, closed, t0, muted

    resets_before = server.metric("kame_oracle_resets_total", headers=AUTH)
    c, fed, closed, t0, muted = asyncio.run(main())
    # kame asked no LLM (a scripted back-end is configured): the one commentary is the only oracle answer
    assert server.metric("kame_oracle_resets_total", headers=AUTH) - resets_before == 1
    assert muted[1] >= 30  # ~3.7 s of speech while muted: Moshi kept answering
    started = c.of_type("session.started")[0]
    session = started["session"]
    assert started["client_event_id"] == "start-1"
    assert session["id"].startswith("live_") and session["status"] == "active" and session["model"] == "gpt-live-1"
    assert session["delegation"]["type"] == "client" and session["audio"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert abs(session["expires_at"] - (t0 + 3600)) < 30  # server.max_duration_s: an hour by default
    infos = [e["message"] for e in c.of_type("info")]
    assert any(m.startswith("session.store") for m in infos) and any("voice" in m for m in infos), infos
    assert c.errors == []
    # the user's words: append-only fragments, sent before the delegation that covers them
    deltas = c.of_type("session.input_transcript.delta")
    check_fragments(deltas)
    heard = c.transcript("user").lower()
    assert "capital" in heard or "france" in heard, heard
    assert "turtle" not in heard  # spoken while muted
    events = ordered(c, "session.input_transcript.delta", "session.delegation.created")
    first = next(i for i, e in enumerate(events) if e["type"] == "session.delegation.created")
    before = "".join(e["delta"] for e in events[:first]).lower()
    assert "capital" in before or "france" in before, before
    delegation = events[first]
    assert delegation["delegation"]["target"] == "client" and "task" not in delegation
    assert delegation["offset_ms"] >= events[first - 1]["end_ms"]
    # the commentary reached Moshi's oracle as a new sequence, sanitized like an LLM answer
    assert fed is not None
    expected = " ".join(spoken_words(answer, OracleConfig().sanitize.options()))
    assert fed["text"] == expected and fed["tokens"] > len(expected.split())
    assert fed["delegation_id"] == delegation["delegation"]["id"]
    acks = {e["client_event_id"]: e for e in c.of_type("session.commentary.appended", "session.thinking.appended")}
    assert acks["answer-1"]["type"] == "session.commentary.appended"
    assert acks["answer-1"]["end_ms"] - acks["answer-1"]["start_ms"] == 80 * fed["tokens"]
    assert acks["think-1"]["start_ms"] == acks["think-1"]["end_ms"]
    assert len(c.of_type("kame.oracle.reset")) == 1  # thinking is never spoken
    assert [e["client_event_id"] for e in c.of_type("session.input_audio.muted", "session.input_audio.unmuted")] == [
        "mute-1", "unmute-1"]
    # Moshi's own text as assistant fragments on 80 ms steps
    said = c.of_type("session.output_transcript.delta")
    assert said and all(d["end_ms"] - d["start_ms"] == 80 and d["start_ms"] % 80 == 0 for d in said)
    # audio at real time, all of it back (frame lateness is the bench's: Whisper shares these 2 cores here)
    s = c.stats
    assert s.audio_received_s >= 0.95 * s.audio_sent_s and s.rtf > 0.9, (s.audio_sent_s, s.audio_received_s, s.rtf)
    # usage on the way and at the end
    assert c.of_type("session.usage.updated")
    assert closed is not None and closed["reason"] == "close_requested" and closed["client_event_id"] == "close-1"
    assert closed["usage"]["seconds"] >= int(s.audio_sent_s) - 1
    assert c.close_code == 1000


@pytest.mark.parametrize("fmt,bytes_per_s", [({"type": "audio/pcm", "rate": 16000}, 32000),
                                             ({"type": "audio/pcmu", "rate": 8000}, 8000)],
                         ids=["pcm16k", "pcmu8k"])
def test_audio_formats_both_ways(server: ServerProcess, fmt: dict[str, Any], bytes_per_s: int) -> None:
    async def main() -> LiveClient:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        assert await c.start({"model": "gpt-live-1", "audio": {"format": fmt}}) is not None, c.events
        await c.send_pcm(question_audio())
        await c.wait_for_type("session.delegation.created", 15)
        await c.drain_output(3.0, until_complete=True)
        await c.close_session()
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.errors == []
    assert c.session is not None and c.session["audio"]["format"] == fmt
    heard = c.transcript("user").lower()  # the ASR heard the question through the resampler / G.711
    assert "capital" in heard or "france" in heard, heard
    sent_s = c.stats.audio_sent_s
    assert abs(c.audio_bytes - bytes_per_s * sent_s) < 0.1 * bytes_per_s * sent_s  # the output is in the format
    out = c.received_pcm()
    assert out.size > 0.9 * sent_s * 24000 and float(np.abs(out).max()) > 0.01  # decodes to audio


def test_every_ignored_and_refused_field(server: ServerProcess) -> None:
    refused_starts = [
        # Responses delegation is offered (a back-end is configured); hosted tools are not
        ("r1", {"model": "m", "delegation": {"type": "responses", "responses": {"model": "gpt-5",
                                                                                 "tools": [{"type": "web_search"}]}}},
         "unsupported_tool"),
        ("r2", {"model": "m", "delegation": {"type": "decisions", "decisions": {"model": "x", "questions": []}}},
         "unsupported_delegation"),
        ("r3", {"model": "m", "triggers": [{"type": "decisions", "event_type": "session.input_transcript.delta",
                                            "decisions": {"questions": []}}]}, "unsupported_parameter"),
        ("r4", {"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}}, "unsupported_audio_format"),
        ("r5", {"model": "m", "kame": {"speculate": True}}, "unknown_parameter"),
        ("r6", {"audio": {}}, "missing_required_parameter"),
    ]
    ignored = {"model": "gpt-live-1", "store": True, "safety_identifier": "u-1", "audio": {"output": {"voice": "cedar"}},
               "delegation": {"type": "client", "acknowledgement_delay_ms": 250}, "triggers": [],
               "client": {"data_channel": {"allowed_client_events": "all"}}, "instructions": "Be brief.",
               "input": [{"role": "user", "content": [{"text": "Hello"}]}], "brand_new_field": 1}
    refused_events = [
        ("e1", {"type": "decision.create", "event_id": "e1"}, "unsupported_event"),
        ("e2", {"type": "decision.item.create", "event_id": "e2", "item": {"role": "user", "content": "x"}}, "unsupported_event"),
        ("e3", {"type": "decision.item.delete", "event_id": "e3", "item_id": "i"}, "unsupported_event"),
        ("e4", {"type": "session.output_audio.fixture.play", "event_id": "e4", "audio": ""}, "unsupported_event"),
        ("e5", {"type": "response.create", "event_id": "e5"}, "unsupported_event"),
        ("e6", {"type": "response.item.create", "event_id": "e6",
                 "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
         "unsupported_event"),
        ("e7", {"type": "session.commentary.append", "event_id": "e7", "content": "hi", "delegation_id": "dlg_x"},
         "unknown_delegation"),
        ("e8", {"type": "session.update", "event_id": "e8", "session": {"model": "other"}}, "immutable_parameter"),
        ("e9", {"type": "session.update", "event_id": "e9", "session": {"delegation": {"type": "responses"}}},
         "unsupported_delegation"),
        ("e10", {"type": "session.thinking.append", "event_id": "e10", "content": "zebra " * 600, "delegation_id": None},
         "content_too_long"),
        ("e11", {"type": "session.wobble", "event_id": "e11"}, "unknown_event"),
    ]

    async def main() -> LiveClient:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        await c.conn.send({"type": "session.input_audio.append", "audio": "AAAA", "event_id": "early"})
        for event_id, session, _ in refused_starts:
            await c.conn.send({"type": "session.start", "event_id": event_id, "session": session})
        assert await c.start(ignored, event_id="ok") is not None, c.events
        sender = asyncio.create_task(c.send_silence(2.0))
        for _, event, _ in refused_events:
            await c.conn.send(event)
        await sender
        await c.drain_output(5.0, until_complete=True)  # the frames in flight, before the close ends them
        await c.close_session()
        await c.close()
        return c

    c = asyncio.run(main())
    errors = {e["client_event_id"]: e["error"] for e in c.errors}
    assert errors["early"]["code"] == "session_not_started"
    for event_id, _, code in refused_starts + refused_events:
        assert errors[event_id]["code"] == code, (event_id, errors.get(event_id))
        assert errors[event_id]["client_event_id"] == event_id
    assert errors["r1"]["param"] == "session.delegation.responses.tools[0]"
    assert errors["r4"]["param"] == "session.audio.format.rate"
    infos = [e for e in c.of_type("info") if e.get("client_event_id") == "ok"]
    messages = " | ".join(e["message"] for e in infos)
    for param in ("session.store", "session.safety_identifier", "session.audio.output.voice",
                  "session.delegation.acknowledgement_delay_ms", "session.client", "session.brand_new_field"):
        assert param in messages, (param, messages)
    assert sum(e["code"] == "context_only" for e in infos) == 2
    # the session went on after every refusal, and closed normally
    assert c.of_type("session.closed")[0]["reason"] == "close_requested"
    assert c.stats.audio_received_s > 1.5


def test_speculative_delegations_supersede(server: ServerProcess) -> None:
    speech = np.concatenate([silence(0.3), synthesize("David has three sisters and each of them has one brother, "
                                                      "how many brothers does David have?"), silence(2.5)])

    async def main() -> LiveClient:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        assert await c.start({"model": "gpt-live-1", "kame": {"delegation": "speculative"}}) is not None
        await c.send_pcm(speech)
        await c.drain_output(2.0, until_complete=True)
        made = c.of_type("session.delegation.created")
        assert len(made) >= 2, (made, c.transcript("user"))
        n = len(c.events)
        await c.conn.session.commentary.append(content="Well.", delegation_id=made[0]["delegation"]["id"], event_id="old")
        await c.conn.session.commentary.append(content="David has one brother.", delegation_id=made[-1]["delegation"]["id"],
                                               event_id="new")
        await c.wait_for_type("kame.oracle.reset", 5, start=n)
        await c.send_silence(0.5)
        await c.close_session()
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.errors == []
    events = ordered(c, "session.input_transcript.delta", "session.delegation.created")
    words_before = [len("".join(d.get("delta", "") for d in events[:i]).split())
                    for i, e in enumerate(events) if e["type"] == "session.delegation.created"]
    assert words_before == sorted(words_before) and words_before[0] >= 2  # each one on more stable words
    superseded = [e for e in c.of_type("info") if e.get("client_event_id") == "old"]
    assert superseded and superseded[0]["code"] == "delegation_superseded"
    fed = c.of_type("kame.oracle.reset")
    assert [f["text"] for f in fed] == ["David has one brother."]


@pytest.fixture
def drain_server(kame_cache_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """The drain test's own server (SIGTERM ends it): no ASR, a 5 s maximum duration warned 2 s before."""
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp_path / "server.log", config="cpu-demo",
                        env={"KAME_ASR__KIND": "none", "KAME_SERVER__MAX_DURATION_S": "5",
                             "KAME_SERVER__DURATION_WARNING_S": "2"}, label="live (drain)").start()
    yield srv
    srv.stop()


def test_maximum_duration_expires(lifecycle_server: ServerProcess) -> None:
    """tests/support/servers.py ``LIFECYCLE``: no ASR, a 3 s maximum duration warned 1 s before."""
    async def main() -> LiveClient:
        c = await LiveClient.connect(lifecycle_server.http_url)
        assert await c.start({"model": "gpt-live-1"}) is not None
        await c.send_silence(8.0)  # stops early when the session closes
        await asyncio.wait_for(c.closed.wait(), 5)
        return c

    c = asyncio.run(main())
    types = [e["type"] for _, e in c.events]
    assert types.index("kame.session.ending") < types.index("session.closed"), types
    assert any(e["code"] == "no_transcription" for e in c.of_type("info"))  # said at the start: no ASR here
    closed = c.of_type("session.closed")[0]
    limit = LIFECYCLE_MAX_S
    assert closed["reason"] == "expired" and limit - 1 <= closed["usage"]["seconds"] <= limit + 1
    assert c.close_code == 1000, (c.close_code, c.close_reason)
    assert limit - 2 <= c.stats.audio_sent_s < limit + 2, c.stats.audio_sent_s  # stopped at the expiry, not at 8 s


@pytest.mark.server_process_subject
def test_drain_tells_why_then_closes(drain_server: ServerProcess) -> None:
    """SIGTERM while a session streams: an info with kame's reason, session.closed connection_lost, 1001."""
    short_server = drain_server

    async def main() -> LiveClient:
        c = await LiveClient.connect(short_server.http_url)
        assert await c.start({"model": "gpt-live-1"}) is not None
        mic = asyncio.create_task(c.send_silence(4.0))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(short_server.stop)
        await asyncio.wait_for(c.closed.wait(), 10)
        mic.cancel()
        return c

    c = asyncio.run(main())
    ending = c.of_type("kame.session.ending")
    assert ending and ending[0]["reason"] == "draining"  # told first, during the grace period
    info = [e for e in c.of_type("info") if e["code"].startswith("kame.")]
    assert info and info[-1]["code"] == "kame.draining", c.of_type("info")
    closed = c.of_type("session.closed")
    assert closed and closed[0]["reason"] == "connection_lost"
    assert (c.close_code, c.close_reason) == (1001, "server shutting down")


def test_a_client_that_keeps_sending_bad_events_is_closed(server: ServerProcess) -> None:
    async def main() -> LiveClient:
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        assert await c.start({"model": "gpt-live-1"}) is not None
        for i in range(60):
            with contextlib.suppress(Exception):
                await c.conn.send({"type": "decision.create", "event_id": f"bad{i}"})
        await asyncio.wait_for(c.closed.wait(), 10)
        return c

    c = asyncio.run(main())
    assert len(c.errors) == 49  # the 50th ends the session instead
    info = c.of_type("info")[-1]
    assert info["code"] == "kame.protocol" and "invalid client events" in info["message"]
    assert c.of_type("session.closed")[0]["reason"] == "connection_lost"
    assert (c.close_code, c.close_reason) == (1008, "too many invalid events")


def test_auth_and_idle_end(server: ServerProcess) -> None:
    async def main() -> tuple[LiveClient, LiveClient, float]:
        anon = await LiveClient.connect(server.http_url, token="wrong")
        await asyncio.wait_for(anon.closed.wait(), 5)
        c = await LiveClient.connect(server.http_url, token=TOKEN)
        assert await c.start({"model": "gpt-live-1"}) is not None
        t = time.monotonic()
        await asyncio.wait_for(c.closed.wait(), 15)  # no audio: the idle timeout ends it
        return anon, c, time.monotonic() - t

    anon, c, waited = asyncio.run(main())
    assert (anon.close_code, anon.close_reason) == (1008, "unauthorized") and anon.session is None
    assert SECURED_IDLE_S - 1 < waited < SECURED_IDLE_S + 6  # the shared server's idle timeout (it was 6 s: 5-12)
    last = [e["type"] for _, e in c.events][-2:]
    assert last == ["info", "session.closed"], last
    info = c.of_type("info")[-1]
    assert info["code"] == "kame.idle" and "idle" in info["message"]
    assert c.of_type("session.closed")[0]["reason"] == "connection_lost"
    assert c.close_code == 1000


def test_pipecat_client_delegation_flow(server: ServerProcess) -> None:
    """What Pipecat's OpenAILiveLLMService does in client delegation, with Pipecat's own event models:
    start (instructions, store), 20 ms audio appends, and for each delegation the user fragments received
    since the previous one handed to a back-end whose answer goes back as that delegation's commentary.
    Pipecat treats every ``error`` as a pipeline failure and drops events its models reject."""
    import base64

    from websockets.asyncio.client import connect

    from tests.support.live_pipecat import pipecat_live_events

    pc = pipecat_live_events()
    audio = (np.clip(question_audio(), -1, 1) * 32767).astype("<i2").tobytes()

    async def main() -> tuple[list[Any], list[str], list[str]]:
        parsed: list[Any] = []
        rejected: list[str] = []
        answers: list[str] = []
        fragments: list[str] = []
        async with connect(f"ws://127.0.0.1:{server.port}/v1/live/sessions",
                           additional_headers={"Authorization": f"Bearer {TOKEN}"}, max_size=None) as ws:

            async def receive() -> None:
                async for message in ws:
                    try:
                        event = pc.parse_server_event(message)
                    except ValueError as exc:
                        rejected.append(str(exc)[:200])
                        continue
                    parsed.append(event)
                    if type(event).__name__ == "TranscriptDeltaEvent" and event.role == "user":
                        fragments.append(event.delta)
                    elif type(event).__name__ == "SessionDelegationCreatedEvent":
                        request = "".join(fragments).strip()  # the conversation since the previous delegation
                        fragments.clear()
                        answer = f"You asked: {request}"
                        answers.append(answer)
                        await ws.send(json.dumps(pc.SessionCommentaryAppendEvent(
                            delegation_id=event.delegation.id, content=answer).to_payload()))

            reader = asyncio.create_task(receive())
            start = pc.SessionStartEvent(session=pc.SessionConfig(model="gpt-live-1", instructions="Be helpful.",
                                                                  delegation=pc.ClientDelegationConfig(), store=False))
            await ws.send(json.dumps(start.to_payload()))
            t0 = time.monotonic()
            chunk = 960  # 20 ms of 24 kHz PCM16
            for k, i in enumerate(range(0, len(audio), chunk)):
                await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))
                await ws.send(json.dumps(pc.InputAudioAppendEvent(
                    audio=base64.b64encode(audio[i : i + chunk]).decode()).to_payload()))
            await asyncio.sleep(1.0)
            await ws.send(json.dumps(pc.SessionCloseEvent().to_payload()))
            await asyncio.wait_for(reader, 10)
        return parsed, rejected, answers

    parsed, rejected, answers = asyncio.run(main())
    assert rejected == []
    names = [type(e).__name__ for e in parsed]
    assert "ErrorEvent" not in names, [e.error for e in parsed if type(e).__name__ == "ErrorEvent"]
    assert names[0] == "SessionStartedEvent" and names[-1] == "SessionClosedEvent"
    assert len(answers) == 1 and ("capital" in answers[0].lower() or "france" in answers[0].lower()), answers
    acked = [e for e in parsed if e.type == "session.commentary.appended"]
    fed = [e for e in parsed if e.type == "kame.oracle.reset"]
    assert len(acked) == 1 and len(fed) == 1 and fed[0].model_extra["text"].startswith("You asked")
    assert parsed[-1].reason == "close_requested" and parsed[-1].usage.seconds >= 4
