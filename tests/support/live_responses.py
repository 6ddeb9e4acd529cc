"""The Live wire's Responses delegation driven from the runtime's side, without a server: a tool
definition and a client that sends what the wire answers through the openai SDK's own Live models.
Shared by tests/test_live_responses_wire.py and tests/test_live_responses_pipecat.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from openai.types.live import ServerEvent
from pydantic import TypeAdapter

from kame.backend.config import BackendConfig
from kame.backend.registry import BackendRegistry
from kame.backend.resolve import ResolvedBackends
from kame.oracle.config import OracleConfig
from kame.server.wires.ids import Ids
from kame.server.wires.live.config import LiveServerInfo
from kame.server.wires.live.events import LiveEncoder, LiveEvent
from kame.session.answers import OracleAnswer
from kame.session.responses.backend import registry_catalog, registry_source
from kame.session.responses.source import SourceHooks
from tests.support.live_session import HookedOffer, LiveSession
from tests.support.llm_server import LlmServer

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ServerEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


class Client:
    """The runtime's side: one ordered send queue, the oracle answers, encoded and SDK-checked events."""

    def __init__(self, server: LlmServer, encode: Callable[[str], list[int]], **hooks: Any) -> None:
        cfg = BackendConfig.model_validate(
            {"base_url": server.base_url, "model": "test-model", "api_key_env": "", "allow_tools": True}
        )
        self.registry = BackendRegistry(ResolvedBackends({"llm": cfg}, "llm"), environ={})
        self.encoder = LiveEncoder(Ids("t"))
        self.sent: list[dict[str, Any]] = []
        self.answers: list[OracleAnswer] = []
        self.hooks = SourceHooks(source=registry_source(self.registry), oracle_reset=self.answers.append, **hooks)
        catalog = registry_catalog(self.registry)
        info = LiveServerInfo(session_id="abcd1234", asr="whisper", responses=catalog)
        # The session's Responses delegation on these hooks (a test may replace them before session.start).
        offer = HookedOffer(catalog=catalog, source=self.hooks.source, hooks=lambda: self.hooks)
        self.wire = LiveSession(info, encode, oracle_config=OracleConfig(), offer=offer, on_events=self.sends)

    def send(self, event: LiveEvent) -> None:
        data = self.encoder.to_json(event)
        if not data["type"].startswith("kame."):  # kame's extension events are not in the contract
            SERVER_EVENT.validate_python(data)
        self.sent.append(data)

    def sends(self, events: list[LiveEvent]) -> None:
        for event in events:
            self.send(event)

    def message(self, obj: dict[str, Any], now: float = 1.0) -> Any:
        out = self.wire.message(json.dumps(obj), now)
        self.sends(out.events)
        return out

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.sent if e["type"] == type_]

    def nested(self, type_: str) -> list[dict[str, Any]]:
        return [e["event"] for e in self.of_type("response.event") if e["event"]["type"] == type_]

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not predicate():
            assert loop.time() < end, "timed out"
            await asyncio.sleep(0.01)
