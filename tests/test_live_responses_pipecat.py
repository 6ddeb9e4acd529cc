"""Responses delegation driven the way Pipecat's ``OpenAILiveLLMService`` (pipecat-ai 1.14) drives it, with
Pipecat's own Live event models: its client events are built by its models and accepted without an
``error`` (Pipecat treats every error as a pipeline failure), every server event kame sends parses into its
model for it, and its delegation logic (run each ``completed`` function_call item from
``response.output_item.done``, answer with ``response.item.create``, send ``response.create`` once the
response ended ``completed`` and every call is answered) gets the answer. The back-end is the registry with
the real `openai` client against tests/support/llm_server.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from tests.support.live_pipecat import pipecat_live_events
from tests.support.live_responses import WEATHER, Client
from tests.support.llm_server import LlmServer, Reply, ToolCallScript


def test_pipecat_models_and_flow(llm_server: LlmServer, encode: Callable[[str], list[int]]) -> None:
    pc = pipecat_live_events()
    llm_server.push(
        Reply(text="Let me look that up.", tool_calls=[ToolCallScript("get_weather", {"city": "Lyon"})]),
        Reply(text="Lyon is cloudy and fifteen degrees."),
    )
    ran: list[dict[str, Any]] = []

    async def main() -> tuple[Client, list[Any]]:
        c = Client(llm_server, encode)
        parsed: list[Any] = []
        pending: dict[str, set[str]] = {}  # Pipecat's _pending_responses, keyed by delegation id
        finished: dict[str, bool] = {}

        def client(event: Any) -> None:
            out = c.message(event.to_payload())
            assert not out.errors, [e.message for e in out.errors]

        async def pump() -> None:
            """Parse what kame sent since last time, as Pipecat does, and act on it."""
            while parsed_upto[0] < len(c.sent):
                data = c.sent[parsed_upto[0]]
                parsed_upto[0] += 1
                event = pc.parse_server_event(json.dumps(data))  # raises on a model mismatch
                parsed.append(event)
                if event.type != "response.event":
                    continue
                key = event.delegation_id or ""
                inner = event.inner_type
                if inner == "response.created":
                    pending.setdefault(key, set())
                    finished[key] = False
                elif inner == "response.output_item.done":
                    item = pc.ResponseOutputItem.model_validate(event.event.get("item") or {})
                    if item.type == "function_call" and item.status == "completed":
                        ran.append(json.loads(item.arguments or "{}"))
                        pending.setdefault(key, set()).add(item.call_id or "")
                        client(
                            pc.ResponseItemCreateEvent(
                                item=pc.FunctionCallOutputItem(
                                    call_id=item.call_id or "", output=json.dumps({"sky": "cloudy", "temp_c": 15})
                                )
                            )
                        )
                        pending[key].discard(item.call_id or "")
                        pending[key].add("answered")
                elif inner in ("response.completed", "response.incomplete", "response.failed"):
                    assert inner == "response.completed", event.event
                    finished[key] = True
                    if "answered" in pending.get(key, set()):
                        pending.pop(key)
                        client(pc.ResponseCreateEvent())

        parsed_upto = [0]
        client(
            pc.SessionStartEvent(
                session=pc.SessionConfig(
                    model="gpt-live-1",
                    instructions="You are a travel assistant.",
                    delegation=pc.ResponsesDelegationConfig(
                        responses={
                            "model": "llm",
                            "instructions": "Answer weather questions.",
                            "max_output_tokens": 120,
                            "reasoning": {"effort": "low"},
                            "service_tier": "auto",
                            "tools": [WEATHER],
                        }
                    ),
                    store=False,
                )
            )
        )
        c.sends(c.wire.speech_started(1, 0.0))
        c.sends(c.wire.final(1, 1.2, "How is the weather in Lyon?", 1.5))
        loop = asyncio.get_running_loop()
        end = loop.time() + 15
        while len(c.answers) < 2:
            await pump()
            assert loop.time() < end, "no answer"
            await asyncio.sleep(0.01)
        await pump()
        await c.registry.aclose()
        return c, parsed

    c, parsed = asyncio.run(main())
    assert not c.of_type("error")
    kinds = {type(p).__name__ for p in parsed}
    assert {"SessionStartedEvent", "SessionDelegationCreatedEvent", "ResponseEventEnvelope"} <= kinds, kinds
    started = next(p for p in parsed if p.type == "session.started")
    assert started.session.delegation["type"] == "responses"
    assert ran == [{"city": "Lyon"}]
    assert [a.text for a in c.answers] == ["Let me look that up.", "Lyon is cloudy and fifteen degrees."]
    infos = [p.message for p in parsed if p.type == "info"]
    assert any("reasoning" in m for m in infos) and any("service_tier" in m for m in infos)
    first, second = llm_server.chat_requests()
    assert first.body["max_tokens"] == 120 and json.loads(second.tool_messages[0]["content"])["temp_c"] == 15
