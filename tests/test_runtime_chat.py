"""The session runtime with the Moshi wire, in isolation (fake socket, fake pipeline): slow clients, engine
failures, recording, floods, a client that vanishes."""

from __future__ import annotations

import asyncio
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np

from kame.server.config import ServerConfig
from kame.server.runtime.recording import SessionRecorder
from kame.server.runtime.session import SessionRuntime
from kame.server.telemetry.logs import session_logger
from kame.server.telemetry.metrics import ServerMetrics
from kame.server.wires.moshi.wire import MoshiWire
from kame.session.events import EngineDown, UserFinal
from kame.session.settings import SessionSettings
from tests.support.runtime_fakes import FakeHost, FakePipeline, FakeWebSocket, output_frame  # noqa: F401


def _session(ws: FakeWebSocket, host: FakeHost, metrics: ServerMetrics, cfg: ServerConfig, **kw: Any) -> SessionRuntime:
    return SessionRuntime(
        ws,  # type: ignore[arg-type]
        MoshiWire(),
        session_id="test",
        new_pipeline=host.new_pipeline,  # type: ignore[arg-type]
        settings=SessionSettings(record=cfg.record_dir is not None),
        metrics=metrics,
        protocol_metrics=None,
        cfg=cfg,
        log=session_logger("test"),
        **kw,
    )


def test_a_client_that_never_reads_gets_frames_dropped_then_closed() -> None:
    cfg = ServerConfig(send_queue_frames=5, slow_client_timeout_s=0.6, idle_timeout_s=30)
    metrics = ServerMetrics()
    host = FakeHost()
    ws = FakeWebSocket(stall=True)

    async def main() -> SessionRuntime:
        session = _session(ws, host, metrics, cfg)
        task = asyncio.create_task(session.run())
        for step in range(60):  # 4.8 s of output produced faster than it can leave
            host.pipeline.put(output_frame(step, text_id=None))
            await asyncio.sleep(0.01)
            assert session.send_q.qsize() <= 3 * cfg.send_queue_frames  # bounded
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    assert session.ended is not None and session.ended.label == "slow_client"
    assert session.frames_dropped > 0
    assert 'kame_frames_dropped_total{direction="out"}' in metrics.render().decode()
    assert host.slot.detached


def test_engine_failure_ends_the_session_with_an_error() -> None:
    metrics = ServerMetrics()
    host = FakeHost()
    ws = FakeWebSocket()

    async def main() -> SessionRuntime:
        session = _session(ws, host, metrics, ServerConfig())
        task = asyncio.create_task(session.run())
        host.pipeline.put(output_frame(0))
        host.pipeline.put(EngineDown(message="engine step failed (RuntimeError)"))
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    assert ws.closed == (1011, "engine error")
    assert ws.sent[0] == b"\x00"
    assert any(m.startswith(b"\x05engine error") for m in ws.sent)
    assert b"\x02 word" in ws.sent  # the text piece of the frame before the failure
    assert session.ended is not None and session.ended.label == "engine_error"


def test_recording_writes_both_voices_and_the_event_log(tmp_path: Path) -> None:
    import sphn

    metrics = ServerMetrics()
    host = FakeHost()
    ws = FakeWebSocket()
    writer = sphn.OpusStreamWriter(24000)
    pcm = (0.2 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 200)).astype(np.float32)

    async def main() -> SessionRecorder:
        made: list[SessionRecorder] = []

        def new_recorder(settings: SessionSettings) -> SessionRecorder:
            made.append(SessionRecorder(tmp_path, "rec", 24000, {"backend": settings.backend}))
            return made[-1]

        session = _session(ws, host, metrics, ServerConfig(record_dir=tmp_path), new_recorder=new_recorder)
        task = asyncio.create_task(session.run())
        for i in range(0, pcm.size, 1920):
            ogg = bytes(writer.append_pcm(pcm[i : i + 1920]))
            if ogg:
                ws.push_audio(ogg)
            host.pipeline.put(output_frame(i // 1920, text_id=7))
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        ws.disconnect()
        await asyncio.wait_for(task, 5)
        assert len(made) == 1
        return made[0]

    recorder = asyncio.run(main())
    recorder.join(5)
    files = {p.name for p in recorder.directory.iterdir()}
    assert files == {"user.wav", "assistant.wav", "events.jsonl"}
    with wave.open(str(recorder.directory / "user.wav")) as w:
        assert w.getframerate() == 24000 and w.getnframes() >= 1920 * 10
    with wave.open(str(recorder.directory / "assistant.wav")) as w:
        assert w.getnframes() == 1920 * 13
    events = [json.loads(line) for line in (recorder.directory / "events.jsonl").read_text().splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "session.start" and types[-1] == "session.end"
    assert "assistant.text" in types
    assert events[-1]["reason"] == "client_closed"
    assert sum(f.size for f in host.slot.fed) >= 1920 * 10  # the user's audio reached the engine in whole frames
    assert all(f.size == 1920 for f in host.slot.fed)


def test_the_last_words_reported_while_the_pipeline_closes_are_recorded(tmp_path: Path) -> None:
    """The ASR's final comes when the pipeline flushes on exit, after the session's pump stopped: the client
    is gone, but the recording must keep it (and whatever the oracle said last)."""
    metrics = ServerMetrics()
    host = FakeHost()
    host.pipeline.on_exit = [UserFinal(utterance=1, audio_s=1.2, text="how many brothers"), output_frame(99, text_id=7)]
    ws = FakeWebSocket()

    async def main() -> SessionRecorder:
        made: list[SessionRecorder] = []

        def new_recorder(settings: SessionSettings) -> SessionRecorder:
            made.append(SessionRecorder(tmp_path, "rec", 24000, {}))
            return made[-1]

        session = _session(ws, host, metrics, ServerConfig(record_dir=tmp_path), new_recorder=new_recorder)
        task = asyncio.create_task(session.run())
        for i in range(3):
            host.pipeline.put(output_frame(i, text_id=None))
            await asyncio.sleep(0.02)
        ws.disconnect()
        await asyncio.wait_for(task, 5)
        return made[0]

    recorder = asyncio.run(main())
    recorder.join(5)
    events = [json.loads(line) for line in (recorder.directory / "events.jsonl").read_text().splitlines()]
    finals = [e for e in events if e["type"] == "asr.final"]
    assert [e["text"] for e in finals] == ["how many brothers"], events
    assert events[-1]["type"] == "session.end"  # recorded before the end, not after
    with wave.open(str(recorder.directory / "assistant.wav")) as w:
        assert w.getnframes() == 1920 * 4  # the three frames served plus the one reported while closing


def test_audio_sent_far_ahead_of_real_time_is_dropped_then_the_session_closed() -> None:
    import sphn

    cfg = ServerConfig(input_burst_s=1.0, flood_close_s=2.0)
    metrics = ServerMetrics()
    host = FakeHost()
    ws = FakeWebSocket()
    writer = sphn.OpusStreamWriter(24000)
    pcm = (0.1 * np.random.default_rng(0).standard_normal(24000 * 8)).astype(np.float32)

    async def main() -> SessionRuntime:
        session = _session(ws, host, metrics, cfg)
        task = asyncio.create_task(session.run())
        await asyncio.sleep(0.05)
        for i in range(0, pcm.size, 1920):  # 8 s of audio in one go
            ogg = bytes(writer.append_pcm(pcm[i : i + 1920]))
            if ogg:
                ws.push_audio(ogg)
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    assert session.ended is not None and session.ended.label == "audio_flood"
    assert ws.closed == (1008, "audio faster than real time")
    assert any(m.startswith(b"\x05audio sent faster than real time") for m in ws.sent)
    assert 12 <= session.frames_in <= 14  # the 1 s burst allowance, nothing more
    assert 'kame_frames_dropped_total{direction="in"}' in metrics.render().decode()


def test_a_client_that_vanishes_mid_send_ends_as_client_closed() -> None:
    class Vanishing(FakeWebSocket):
        async def send_bytes(self, data: bytes) -> None:
            if self.sent:
                raise OSError("connection reset")
            self.sent.append(data)

    metrics = ServerMetrics()
    host = FakeHost()
    ws = Vanishing()

    async def main() -> SessionRuntime:
        session = _session(ws, host, metrics, ServerConfig())
        task = asyncio.create_task(session.run())
        host.pipeline.put(output_frame(0, text_id=None))
        await asyncio.wait_for(task, 5)
        return session

    session = asyncio.run(main())
    assert session.ended is not None and session.ended.label == "client_closed"
    assert 'kame_sessions_ended_total{reason="client_closed"} 1.0' in metrics.render().decode()
