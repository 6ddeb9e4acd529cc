"""Stand-ins for the session runtime's surroundings (a socket, a pipeline, a model host) and the frames
an engine step produces: the runtime tested in isolation, per wire (tests/test_runtime_*.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kame.oracle.config import OracleConfig
from kame.session.answer_source import AnswerSource, OracleWriter, SourceIO
from kame.session.commands import ConversationCommand
from kame.session.delegated_answers import delegation_source
from kame.session.events import AssistantFrame, PipelineEvent
from kame.session.settings import SessionSettings


class FakeWebSocket:
    """Records what the session sends; ``stall`` makes every send after the handshake hang."""

    def __init__(self, stall: bool = False) -> None:
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[bytes] = []
        self.closed: tuple[int, str] | None = None
        self.stall = stall

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_bytes(self, data: bytes) -> None:
        if self.stall and self.sent:
            await asyncio.Event().wait()  # a client that never reads: TCP buffers full
        self.sent.append(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.stall:
            await asyncio.Event().wait()
        self.closed = (code, reason)

    def push_audio(self, ogg: bytes) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "bytes": b"\x01" + ogg})

    def disconnect(self) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})


def word_ids(text: str) -> list[int]:
    """A tokenizer for the fakes: one id a word (10 + its length)."""
    return [10 + len(w) for w in text.split()]


class FakePipeline:
    """Stands in for :class:`kame.session.pipeline.Pipeline`: the test pushes its events."""

    def __init__(self, encode: Callable[[str], Sequence[int]] = word_ids) -> None:
        self.encode = encode
        self.events: asyncio.Queue[PipelineEvent] = asyncio.Queue()
        self.fed: list[np.ndarray] = []
        self.entered = False
        self.detached = False
        self.resets = 0
        self.dropped_frames = 0
        self.slot_index = 0
        self.flush_on_exit = True
        self.settings: list[SessionSettings] = []
        self.on_exit: list[PipelineEvent] = []  # what the pipeline reports while it closes (the ASR's last final)
        self.commands: list[ConversationCommand] = []  # what the runtime applied (kame.session.commands)
        self.first_reply_s: float | None = None  # a PersonaPlex slot's prompts: none here
        #: The session's answer source, as the real pipeline picks it (a delegation's; nobody otherwise), on a
        #: recorded oracle stream (what it writes is not reported: a test reports what it likes).
        self.source: AnswerSource = AnswerSource()
        self.written: list[list[int]] = []

    async def __aenter__(self) -> FakePipeline:
        self.entered = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.detached = True
        for event in self.on_exit:
            self.events.put_nowait(event)

    def drain_events(self) -> list[PipelineEvent]:
        out: list[PipelineEvent] = []
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    async def reset(self) -> None:
        self.resets += 1

    def feed(self, pcm: np.ndarray) -> None:
        self.fed.append(pcm)

    def update(self, settings: SessionSettings) -> None:
        self.settings.append(settings)
        if settings.delegation is not None and self.source.kind == "none":
            io = SourceIO(OracleWriter(lambda: self), self.put, lambda work: asyncio.get_running_loop().create_task(work))
            self.source = delegation_source(settings.delegation, io, encode=self.encode, oracle_config=OracleConfig(),
                                            offer=None)

    def apply(self, command: ConversationCommand) -> list[PipelineEvent]:
        self.commands.append(command)
        return self.source.apply(command) if self.source.kind != "none" else []

    def oracle_reset(self, first_ids: list[int], done: Callable[[float], None] | None = None) -> None:
        self.written.append(list(first_ids))

    async def next_event(self) -> PipelineEvent:
        return await self.events.get()

    def put(self, event: PipelineEvent) -> None:
        self.events.put_nowait(event)


class FakeHost:
    sample_rate = 24000
    frame_size = 1920

    def __init__(self, encode: Callable[[str], Sequence[int]] = word_ids) -> None:
        self.pipeline = FakePipeline(encode)
        self.slot = self.pipeline  # what the tests look at

    def new_pipeline(self, settings: SessionSettings) -> FakePipeline:
        self.pipeline.settings.append(settings)
        return self.pipeline


def output_frame(step: int, text_id: int | None = 5) -> AssistantFrame:
    pcm = (0.1 * np.sin(np.arange(1920) / 24000 * 2 * np.pi * 300)).astype(np.float32)
    piece = None if text_id is None or text_id in (0, 3) else ("\u2581word" if text_id % 2 else "s")
    return AssistantFrame(step=step, pcm=pcm, text_id=text_id, piece=piece, oracle_id=3)
