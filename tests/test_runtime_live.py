"""The session runtime with the Live wire, in isolation (fake socket, fake pipeline): a client's commentary
reaches the session as its own command at once, ahead of audio the pacer still holds, and what the session
reports it wrote is counted."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np

from kame.server.config import ServerConfig
from kame.server.runtime.session import SessionRuntime
from kame.server.telemetry.logs import session_logger
from kame.server.telemetry.metrics import ServerMetrics
from kame.server.telemetry.protocol_metrics import ProtocolMetrics
from kame.server.wires.live.config import LiveServerInfo
from kame.server.wires.live.wire import LiveWire
from kame.session.answers import AnswerWritten
from kame.session.commands import AppendAnswer
from kame.session.settings import SessionSettings
from tests.support.runtime_fakes import FakeHost, FakeWebSocket

INFO = LiveServerInfo(session_id="feedbeef0002", admitted_at=1_800_000_000.0)


class FakeTextSocket(FakeWebSocket):
    """The fake socket, speaking JSON text (the Live wire's events)."""

    async def send_text(self, data: str) -> None:
        self.sent.append(data)  # type: ignore[arg-type]


def word_ids(text: str) -> list[int]:
    return [10 + len(w) for w in text.split()]


def test_a_commentary_goes_to_the_session_at_once_ahead_of_queued_audio() -> None:
    cfg = ServerConfig(idle_timeout_s=30, input_burst_s=0.1, input_buffer_s=5.0)
    metrics = ServerMetrics()
    host = FakeHost(encode=word_ids)  # the session's tokenizer: its pipeline builds the answers
    ws = FakeTextSocket()

    def push(event: dict[str, Any]) -> None:
        ws.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(event)})

    async def main() -> tuple[int, int, SessionRuntime]:
        wire = LiveWire(INFO, SessionSettings())
        session = SessionRuntime(ws, wire, session_id="feedbeef0002", new_pipeline=host.new_pipeline,  # type: ignore[arg-type]
                                 settings=SessionSettings(), metrics=metrics,
                                 protocol_metrics=ProtocolMetrics(metrics.registry), cfg=cfg,
                                 log=session_logger("test"), input_buffer_s=cfg.input_buffer_s)
        task = asyncio.create_task(session.run())
        push({"type": "session.start", "session": {"model": "gpt-live-1"}})
        pcm = np.zeros(24000 * 2, "<i2").tobytes()  # 2 s at once: the pacer lets 0.1 s through, queues the rest
        push({"type": "session.input_audio.append", "audio": base64.b64encode(pcm).decode()})
        push({"type": "session.commentary.append", "content": "Paris, of course.", "delegation_id": None})
        for _ in range(200):
            if host.pipeline.commands:
                break
            await asyncio.sleep(0.005)
        fed_then = len(host.pipeline.fed)
        assert host.pipeline.on_answer_written is not None  # type: ignore[attr-defined]
        host.pipeline.on_answer_written(AnswerWritten(4, True, 0.002))  # type: ignore[attr-defined]
        host.pipeline.on_answer_written(AnswerWritten(2, False))  # type: ignore[attr-defined]
        ws.disconnect()
        await asyncio.wait_for(task, 5)
        return fed_then, 25, session

    fed_then, frames_sent, session = asyncio.run(main())
    assert session.ended is not None and session.ended.label == "client_closed", session.ended
    types = [json.loads(m)["type"] for m in ws.sent]
    assert [t for t in types if t != "info"][:3] == ["session.started", "session.commentary.appended", "kame.oracle.reset"]
    (command,) = host.pipeline.commands
    assert isinstance(command, AppendAnswer) and command.content == "Paris, of course."
    assert host.pipeline.written == [word_ids("Paris, of course.")]  # the session's answer source spoke it
    assert fed_then < frames_sent // 2  # most of the audio was still queued: the answer did not wait for it
    text = metrics.render().decode()
    assert "kame_oracle_resets_total 1.0" in text and "kame_oracle_tokens_total 6.0" in text
    assert 'kame_answer_fifo_seconds_count{protocol="live"} 1.0' in text
