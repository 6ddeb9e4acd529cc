"""The oracle loop on a back-end whose server refuses tools as vLLM does (a real server on 127.0.0.1, the real
`openai` client): the turn is answered, the session told once (``backend.tools_refused``), later requests go
without tools; Moshi's wire turns the event into a 0x05 notice, the Realtime wire into a kame.* event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from kame.backend.registry import BackendRegistry
from kame.backend.tool_loop import ToolLoopLimits
from kame.backend.tools import ToolCall, ToolResult, ToolSpec
from kame.config import KameConfig
from kame.oracle.config import OracleConfig
from kame.oracle.loop import OracleLoop, SessionOracleSettings
from kame.oracle.session_tools import SessionTools
from kame.server.wires.moshi.wire import MoshiWire
from kame.server.wires.realtime.events import kame_event
from kame.session.events import ToolsRefused
from tests.support.llm_server import Reply
from tests.support.vllm_like_server import VLLM_TOOLS_MESSAGE, VllmLikeServer, running_vllm_like_server

WEATHER = ToolSpec("get_weather", "Weather of a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}}, read_only=True)


class Sink:
    def __init__(self) -> None:
        self.resets = 0

    def oracle_reset(self, first_ids: list[int]) -> None:
        self.resets += 1

    def oracle_push(self, ids: list[int]) -> None:
        pass

    def oracle_clear(self) -> None:
        pass


class NoTools:
    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        raise AssertionError("nothing can call a tool on a server that refuses them")


@pytest.fixture
def vllm() -> Iterator[VllmLikeServer]:
    with running_vllm_like_server(["m"]) as server:
        server.set_default(Reply(text="It is sunny in Paris today."))
        yield server


def test_the_turn_is_answered_the_session_told_once_and_later_requests_go_without_tools(
    vllm: VllmLikeServer, tiny_kame_ckpt: Path
) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(tiny_kame_ckpt / "tokenizer.model"))
    events: list[Any] = []
    sink = Sink()

    async def main() -> None:
        cfg = KameConfig.model_validate({"backends": {"main": {"base_url": vllm.base_url, "model": "m",
                                                               "api_key_env": ""}}})
        reg = BackendRegistry.from_config(cfg, {})
        tools = SessionTools.create(ToolLoopLimits(call_timeout_s=3.0))
        tools.routes.set("test", [WEATHER], NoTools())
        loop = OracleLoop(config=OracleConfig(), registry=reg, sink=sink, encode=sp.encode,
                          piece_of=sp.id_to_piece, emit=events.append,
                          settings=SessionOracleSettings(policy="reset", barge_in="keep"), tools=tools)

        async def done(n: int) -> None:
            t0 = time.monotonic()
            while len([e for e in events if e.name == "llm.done"]) < n:
                assert time.monotonic() - t0 < 6, [e.name for e in events]
                await asyncio.sleep(0.01)

        loop.on_user_final("What is the weather in Paris?")
        await done(1)
        loop.on_user_final("And what about tomorrow morning there?")
        await done(2)
        await loop.aclose()
        await reg.aclose()

    asyncio.run(main())
    names = [e.name for e in events]
    assert "llm.error" not in names and "backend.down" not in names, names
    notices = [e for e in events if isinstance(e, ToolsRefused)]
    assert len(notices) == 1 and notices[0].backend == "main" and notices[0].reason == VLLM_TOOLS_MESSAGE
    started = [e for e in events if e.name == "llm.request_started"]
    assert [e.tools for e in started] == [True, False]  # the second request is not even offered tools
    assert sink.resets == 2  # both answers reached the oracle
    assert [r.tool_names for r in vllm.chat_requests()] == [["get_weather"], [], []] and len(vllm.refused) == 1


def test_moshi_gets_a_notice_and_realtime_a_kame_event() -> None:
    event = ToolsRefused(backend="local", reason=VLLM_TOOLS_MESSAGE + " see http://10.0.0.5:8000/docs")
    (out,) = MoshiWire().event(event)
    assert isinstance(out.data, bytes) and out.data[0] == 0x05
    text = out.data[1:].decode()
    assert "'local'" in text and "--enable-auto-tool-choice" in text and "10.0.0.5" not in text, text
    realtime = kame_event(event)
    assert realtime is not None and realtime["type"] == "kame.backend.tools_refused"
    assert realtime["backend"] == "local" and "10.0.0.5" not in realtime["reason"]
