"""The official SDK's ``client.live.connect()`` in Responses delegation, against the Live wire on a real
websocket (FastAPI + uvicorn on 127.0.0.1) with kame's registry and the real `openai` client streaming
from tests/support/llm_server.py.

The websocket handler is the runtime's part in miniature (one ordered send queue, the oracle answers
collected); the audio pipeline is left out: the question comes as a ``response.item.create`` message, so
what is checked is the protocol the SDK speaks: the delegation, the nested Responses events as the SDK
parses them, the function call it runs, its output, ``response.create``, the answer and a second
question on the same conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from kame.backend.config import BackendConfig
from kame.backend.registry import BackendRegistry
from kame.backend.resolve import ResolvedBackends
from kame.server.wires.live.config import LiveServerInfo
from kame.server.wires.live.events import LiveEncoder, LiveEvent
from kame.session.answers import OracleAnswer
from kame.session.responses.backend import registry_catalog, registry_source
from kame.session.responses.source import SourceHooks
from tests.support.live_session import HookedOffer, LiveSession
from tests.support.llm_server import LlmServer, Reply, ToolCallScript
from tests.support.moshi_client import free_port

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def encode(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[int]]:
    import sentencepiece as spm

    from kame.frontend.tiny import train_tokenizer

    path: Path = tmp_path_factory.mktemp("sp") / "tok.model"
    train_tokenizer(path, vocab_size=400)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return lambda text: list(sp.encode(text, out_type=int))



def app_for(registry: BackendRegistry, encode: Callable[[str], list[int]], answers: list[OracleAnswer]) -> FastAPI:
    app = FastAPI()

    @app.websocket("/v1/live/sessions")
    async def live(ws: WebSocket) -> None:
        await ws.accept()
        queue: asyncio.Queue[str] = asyncio.Queue()
        encoder_box: list[LiveEncoder] = []

        def send(event: LiveEvent) -> None:
            queue.put_nowait(encoder_box[0].encode(event))

        catalog = registry_catalog(registry)
        hooks = SourceHooks(source=registry_source(registry), oracle_reset=answers.append)
        wire = LiveSession(
            LiveServerInfo(session_id="sdk00001", asr="whisper", responses=catalog), encode,
            offer=HookedOffer(catalog=catalog, source=hooks.source, hooks=lambda: hooks),
            on_events=lambda events: [send(e) for e in events],
        )
        encoder_box.append(LiveEncoder(wire.ids))

        async def writer() -> None:
            while True:
                await ws.send_text(await queue.get())

        task = asyncio.create_task(writer())
        try:
            while True:
                out = wire.message(await ws.receive_text(), asyncio.get_running_loop().time())
                for event in out.events:  # queued before the next await: the delegation precedes its stream
                    send(event)
        except WebSocketDisconnect:
            pass
        finally:
            if wire.responses is not None:
                await wire.responses.aclose()
            task.cancel()

    return app


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task


def test_sdk_client_runs_the_function_and_the_answer_reaches_the_oracle(
    llm_server: LlmServer,
    encode: Callable[[str], list[int]],
) -> None:
    llm_server.push(
        Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})]),
        Reply(text="It is sunny and twenty one degrees in Paris."),
        Reply(text="Tomorrow brings rain to Paris."),
    )
    answers: list[OracleAnswer] = []
    ran: list[dict[str, Any]] = []

    async def main() -> list[Any]:
        cfg = BackendConfig.model_validate(
            {"base_url": llm_server.base_url, "model": "test-model", "api_key_env": "", "allow_tools": True}
        )
        registry = BackendRegistry(ResolvedBackends({"llm": cfg}, "llm"), environ={})
        received: list[Any] = []
        async with serving(app_for(registry, encode, answers)) as base_url:
            client = openai.AsyncOpenAI(api_key="sk-test", base_url=base_url)
            async with client.live.connect() as conn:
                await conn.send(
                    {
                        "type": "session.start",
                        "session": {
                            "model": "gpt-live-1",
                            "delegation": {
                                "type": "responses",
                                "responses": {
                                    "model": "llm",
                                    "instructions": "You report the weather.",
                                    "tools": [WEATHER],
                                },
                            },
                        },
                    }
                )

                async def next_event(kind: str) -> Any:
                    async for event in conn:
                        received.append(event)
                        if event.type == kind:
                            return event
                    raise AssertionError(f"closed before {kind}")

                started = await asyncio.wait_for(next_event("session.started"), 10)
                assert started.session.delegation.type == "responses"

                async def ask(question: str) -> None:
                    await conn.response.item.create(
                        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}
                    )
                    await conn.response.create()

                async def until_answered(rounds: int) -> None:
                    # Pipecat's way: run each completed function_call item, answer, then response.create.
                    done = 0
                    pending: list[str] = []
                    async for event in conn:
                        received.append(event)
                        if event.type != "response.event":
                            continue
                        nested = event.event
                        item = nested.get("item") if isinstance(nested.get("item"), dict) else None
                        if nested["type"] == "response.output_item.done" and item and item["type"] == "function_call":
                            assert item["status"] == "completed"
                            ran.append(json.loads(item["arguments"]))
                            await conn.response.item.create(
                                item={
                                    "type": "function_call_output",
                                    "call_id": item["call_id"],
                                    "output": json.dumps({"sky": "sunny", "temp_c": 21}),
                                }
                            )
                            pending.append(item["call_id"])
                        if nested["type"] == "response.completed":
                            done += 1
                            if pending:
                                pending.clear()
                                await conn.response.create()
                            elif done >= rounds:
                                return

                await ask("What is the weather in Paris?")
                await asyncio.wait_for(until_answered(2), 20)
                await ask("And tomorrow?")
                await asyncio.wait_for(until_answered(1), 20)
                for _ in range(50):
                    if len(answers) >= 3:
                        break
                    await asyncio.sleep(0.05)
        await registry.aclose()
        return received

    received = asyncio.run(main())
    types = [e.type for e in received]
    assert "error" not in types, [e for e in received if e.type == "error"]
    delegations = [e for e in received if e.type == "session.delegation.created"]
    assert len(delegations) == 2 and all(d.delegation.target == "responses" for d in delegations)
    first_nested = next(e for e in received if e.type == "response.event")
    assert first_nested.delegation_id == delegations[0].delegation.id
    assert first_nested.event["response"]["id"] == delegations[0].delegation.response_id
    assert types.index("session.delegation.created") < types.index("response.event")
    assert ran == [{"city": "Paris"}]
    assert [a.text for a in answers] == [
        "Let me check.",
        "It is sunny and twenty one degrees in Paris.",
        "Tomorrow brings rain to Paris.",
    ]
    first, second, third = llm_server.chat_requests()
    assert first.tool_names == ["get_weather"]
    assert json.loads(second.tool_messages[0]["content"]) == {"sky": "sunny", "temp_c": 21}
    roles = [m["role"] for m in third.body["messages"][1:]]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]  # the second question sees the first
