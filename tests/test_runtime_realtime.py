"""The session runtime with the Realtime wire, in isolation (fake socket, fake pipeline): output as
responses, a client that never reads, engine failure, recording on and off, kame.session.reset while audio
keeps coming."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
from starlette.websockets import WebSocketDisconnect

from kame.server.config import ServerConfig
from kame.server.runtime.recording import SessionRecorder
from kame.server.runtime.session import SessionRuntime
from kame.server.telemetry.logs import session_logger
from kame.server.telemetry.metrics import ServerMetrics
from kame.server.telemetry.protocol_metrics import ProtocolMetrics
from kame.server.wires.realtime.settings import ServerInfo
from kame.server.wires.realtime.wire import RealtimeWire
from kame.session.commands import CancelAnswer, ForgetSpeech
from kame.session.events import AssistantFrame, EngineDown, SpeechStarted, SpeechStopped
from kame.session.settings import SessionSettings
from tests.support.runtime_fakes import FakeHost, FakeWebSocket, output_frame


class FakeTextSocket(FakeWebSocket):
    """The chat fake, speaking JSON text."""

    async def send_text(self, data: str) -> None:
        if self.stall and self.sent:
            await asyncio.Event().wait()
        self.sent.append(data)  # type: ignore[arg-type]

    def push_event(self, event: dict[str, Any]) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(event)})

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(m) for m in self.sent]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events()]


def _session(ws: FakeTextSocket, host: FakeHost, metrics: ServerMetrics, cfg: ServerConfig, *,
             settings: SessionSettings, **kw: Any) -> SessionRuntime:
    info = ServerInfo(session_id="abcdef123456", record_available=True)
    return SessionRuntime(
        ws,  # type: ignore[arg-type]
        RealtimeWire(info, settings),
        session_id="abcdef123456",
        new_pipeline=host.new_pipeline,  # type: ignore[arg-type]
        settings=settings,
        metrics=metrics,
        protocol_metrics=ProtocolMetrics(metrics.registry),
        cfg=cfg,
        log=session_logger("test"),
        input_buffer_s=cfg.input_buffer_s,
        **kw,
    )


def _append(ws: FakeTextSocket, seconds: float) -> None:
    pcm = np.zeros(int(seconds * 24000), "<i2").tobytes()
    ws.push_event({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def test_output_frames_become_responses_and_a_user_turn_ends_one() -> None:
    cfg = ServerConfig(idle_timeout_s=30)
    metrics = ServerMetrics()
    host = FakeHost()
    ws = FakeTextSocket()

    async def main() -> SessionRuntime:
        session = _session(ws, host, metrics, cfg, settings=SessionSettings())
        task = asyncio.create_task(session.run())
        _append(ws, 0.5)
        for step in range(3):
            host.pipeline.put(output_frame(step, text_id=3))  # silent pad: loud audio still speaks
        await asyncio.sleep(0.1)
        host.pipeline.put(SpeechStarted(utterance=0, audio_s=0.2))
        host.pipeline.put(SpeechStopped(utterance=0, audio_s=0.9))
        for step in range(3, 5):
            host.pipeline.put(output_frame(step, text_id=7))
        await asyncio.sleep(0.1)
        ws.disconnect()
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    types = ws.types()
    assert types[0] == "session.created"
    assert types.count("response.created") == 2  # the user turn ended the first response
    first_done = types.index("response.done")
    assert types.index("input_audio_buffer.speech_stopped") < first_done < types.index("response.created", first_done)
    deltas = [e for e in ws.events() if e["type"] == "response.output_audio.delta"]
    assert len(deltas) == 5 and len(base64.b64decode(deltas[0]["delta"])) == 3840
    transcript = [e["delta"] for e in ws.events() if e["type"] == "response.output_audio_transcript.delta"]
    assert transcript == ["word", " word"]
    assert len(host.slot.fed) == 6 and session.frames_in == 6


def test_words_withheld_after_a_cancel_leave_the_backend_history() -> None:
    """response.cancel withholds Moshi's remaining audio; once it has been silent for the end gap, the
    runtime hands the pipeline the withheld steps to forget (the user never heard them)."""
    cfg = ServerConfig(idle_timeout_s=30)
    host = FakeHost()
    ws = FakeTextSocket()
    quiet = np.zeros(1920, np.float32)

    async def main() -> None:
        session = _session(ws, host, ServerMetrics(), cfg, settings=SessionSettings())
        task = asyncio.create_task(session.run())
        for step in range(3):
            host.pipeline.put(output_frame(step, text_id=7))
        await asyncio.sleep(0.1)
        ws.push_event({"type": "response.cancel"})
        await asyncio.sleep(0.1)
        for step in range(3, 8):  # Moshi goes on: withheld
            host.pipeline.put(output_frame(step, text_id=7))
        for step in range(8, 20):  # then silent for the end gap
            host.pipeline.put(AssistantFrame(step=step, pcm=quiet, text_id=3, piece=None, oracle_id=3))
        await asyncio.sleep(0.2)
        ws.disconnect()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    done = [e for e in ws.events() if e["type"] == "response.done"]
    assert [d["response"]["status"] for d in done] == ["cancelled"]
    commands = host.pipeline.commands
    assert isinstance(commands[0], CancelAnswer), commands
    forget = [c for c in commands if isinstance(c, ForgetSpeech)]
    assert len(forget) == 1 and forget[0].start_step == 3 and 8 <= forget[0].end_step <= 19, forget


def test_a_client_that_never_reads_loses_audio_not_events_then_is_closed() -> None:
    cfg = ServerConfig(send_queue_frames=5, slow_client_timeout_s=0.6, idle_timeout_s=30)
    metrics = ServerMetrics()
    host = FakeHost()
    ws = FakeTextSocket(stall=True)

    async def main() -> SessionRuntime:
        session = _session(ws, host, metrics, cfg, settings=SessionSettings())
        task = asyncio.create_task(session.run())
        for step in range(60):
            host.pipeline.put(output_frame(step))
            await asyncio.sleep(0.01)
            assert session.send_q.qsize() <= cfg.send_queue_frames + 2 * 60  # audio capped, events bounded
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    assert session.ended is not None and session.ended.label == "slow_client"
    assert session.frames_dropped > 0
    assert 'kame_frames_dropped_total{direction="out"}' in metrics.render().decode()
    assert host.slot.detached


class VanishingSocket(FakeTextSocket):
    """A client that disappears while the server writes to it (starlette raises WebSocketDisconnect)."""

    async def send_text(self, data: str) -> None:
        if len(self.sent) >= 3:
            raise WebSocketDisconnect(code=1006)
        await super().send_text(data)


def test_a_client_that_vanishes_mid_send_ends_as_closed_not_as_an_internal_error() -> None:
    metrics = ServerMetrics()
    host = FakeHost()
    ws = VanishingSocket()

    async def main() -> SessionRuntime:
        session = _session(ws, host, metrics, ServerConfig(idle_timeout_s=30), settings=SessionSettings())
        task = asyncio.create_task(session.run())
        for step in range(5):
            host.pipeline.put(output_frame(step))
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    assert session.ended is not None and session.ended.label == "client_closed", session.ended
    assert 'kame_sessions_ended_total{reason="internal"}' not in metrics.render().decode()
    assert host.slot.detached


def test_engine_failure_sends_an_error_event_then_closes_1011() -> None:
    cfg = ServerConfig(idle_timeout_s=30)
    host = FakeHost()
    ws = FakeTextSocket()

    async def main() -> None:
        session = _session(ws, host, ServerMetrics(), cfg, settings=SessionSettings())
        task = asyncio.create_task(session.run())
        host.pipeline.put(output_frame(0))
        host.pipeline.put(EngineDown(message="engine step failed (boom)"))
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    events = ws.events()
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "engine_error"
    assert "response.done" in ws.types()  # the open response was closed first (incomplete)
    assert ws.closed == (1011, "engine error")


def test_recording_follows_kame_record(tmp_path: Path) -> None:
    cfg = ServerConfig(idle_timeout_s=30)
    host = FakeHost()
    ws = FakeTextSocket()
    made: list[SessionRecorder] = []

    def new_recorder(settings: SessionSettings) -> SessionRecorder:
        made.append(SessionRecorder(tmp_path, f"s{len(made)}", 24000, {"protocol": "realtime"}))
        return made[-1]

    async def main() -> None:
        session = _session(ws, host, ServerMetrics(), cfg, settings=SessionSettings(record=True), new_recorder=new_recorder)
        task = asyncio.create_task(session.run())
        _append(ws, 0.2)
        host.pipeline.put(output_frame(0))
        await asyncio.sleep(0.1)
        ws.push_event({"type": "session.update", "session": {"kame": {"record": False}}})
        await asyncio.sleep(0.1)
        ws.disconnect()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert len(made) == 1
    made[0].join(5)
    events = [json.loads(line) for line in (made[0].directory / "events.jsonl").read_text().splitlines()]
    assert events[0]["type"] == "session.start" and events[-1]["type"] == "session.end"
    assert events[-1]["reason"] == "client"
    updated = [e for e in ws.events() if e["type"] == "session.updated"]
    assert updated and updated[0]["session"]["kame"]["record"] is False


def test_reset_while_audio_keeps_coming() -> None:
    cfg = ServerConfig(idle_timeout_s=30, input_burst_s=0.1, input_buffer_s=2.0)
    host = FakeHost()
    ws = FakeTextSocket()

    async def main() -> SessionRuntime:
        session = _session(ws, host, ServerMetrics(), cfg, settings=SessionSettings(text_topk=5))
        task = asyncio.create_task(session.run())
        _append(ws, 1.0)  # ahead of real time: most of it waits in the pacer and trickles in during the reset
        ws.push_event({"type": "kame.session.reset"})
        await asyncio.sleep(0.5)
        host.pipeline.put(output_frame(0))
        await asyncio.sleep(0.1)
        ws.disconnect()
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    assert session.ended is not None and session.ended.label == "client_closed", session.ended
    assert "kame.session.reset" in ws.types()
    assert "response.output_audio.delta" in ws.types()[ws.types().index("kame.session.reset") :]
    assert host.slot.resets == 1  # reset in place: the slot was never given up in between
    assert session.frames_in >= 5
