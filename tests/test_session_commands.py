"""The conversation commands a wire hands the pipeline (kame.session.commands): client messages join the
back-end's context and ask nothing, deleted and unheard words leave it, a requested answer is asked now with
its instructions and fed whatever the switch policy, a cancel stops the request and clears the oracle stream.
The oracle loop runs against a real OpenAI-compatible server on 127.0.0.1 (real ``openai`` client)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from kame.backend.registry import BackendRegistry
from kame.config import KameConfig
from kame.oracle.config import OracleConfig
from kame.oracle.loop import OracleLoop, SessionOracleSettings
from kame.oracle.prompt import build_messages
from kame.oracle.transcript import Transcript
from kame.session.commands import utterance_key
from tests.support.llm_server import LlmServer, RecordedRequest, Reply


@pytest.fixture(scope="module")
def sp(tiny_kame_ckpt: Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(tiny_kame_ckpt / "tokenizer.model"))


class Sink:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def oracle_reset(self, first_ids: list[int]) -> None:
        self.calls.append("reset")

    def oracle_push(self, ids: list[int]) -> None:
        self.calls.append("push")

    def oracle_clear(self) -> None:
        self.calls.append("clear")


def _loop(server: LlmServer, sp: spm.SentencePieceProcessor, events: list[Any], sink: Sink, policy: str = "reset") -> OracleLoop:
    cfg = KameConfig.model_validate({"backends": {"main": {"base_url": server.base_url, "model": "m", "api_key_env": "",
                                                           "breaker": {"enabled": False}}}, "default_backend": "main"})
    reg = BackendRegistry.from_config(cfg, {})
    config = OracleConfig(policy=policy)  # type: ignore[arg-type]
    return OracleLoop(config=config, registry=reg, sink=sink, encode=sp.encode, piece_of=sp.id_to_piece,
                      emit=events.append, settings=SessionOracleSettings(policy=policy))


async def _until(pred: Any, timeout: float = 5.0) -> None:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "condition not reached"
        await asyncio.sleep(0.01)


def test_client_items_join_the_context_and_can_be_forgotten() -> None:
    t = Transcript()
    t.user_partial("hello")
    t.user_final("hello there", utterance_key(1))
    t.add_item("item_a", "user", "My name is Ann.")
    t.add_item("item_s", "system", "The user is in Paris.")
    for step, piece in enumerate(["\u2581Nice", "\u2581to", "\u2581meet", "\u2581you", "\u2581Ann"], start=10):
        t.assistant_piece(piece)
        t._step = step  # noqa: SLF001 - what assistant_token(step=) records
    t.assistant_flush()
    msgs = build_messages(t.view())
    assert "The user is in Paris." in msgs[0]["content"] and msgs[0]["role"] == "system"
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == "hello there My name is Ann."
    # what the user did not hear (words completed at steps 12 and later) leaves the history
    assert t.forget_steps(12, 100) > 0
    assert build_messages(t.view())[2]["content"].startswith("Nice to") and "Ann" not in build_messages(t.view())[2]["content"]
    assert t.forget("item_a") and t.forget(utterance_key(1)) and t.forget("item_s")
    assert not any(m["role"] == "user" and "Ann" in m["content"] for m in build_messages(t.view()))
    assert "Paris" not in build_messages(t.view())[0]["content"]


def test_a_requested_answer_is_asked_now_with_its_instructions_and_fed_whatever_the_policy(
    llm_server: LlmServer, sp: spm.SentencePieceProcessor
) -> None:
    seen: list[RecordedRequest] = []

    def answer(rec: RecordedRequest) -> Reply:
        seen.append(rec)
        return Reply(text="Here is the answer you asked for.", first_token_delay_s=0.02)

    llm_server.reset()
    llm_server.responder = answer

    async def main() -> tuple[list[Any], Sink]:
        events: list[Any] = []
        sink = Sink()
        loop = _loop(llm_server, sp, events, sink, policy="freeze_when_speaking")
        loop.transcript.add_item("item_1", "user", "Tell me about owls.")
        await asyncio.sleep(0.2)
        assert not seen, "a client message asks nothing by itself"
        # the assistant has spoken: freeze_when_speaking would drop an unrequested answer now
        loop.on_user_final("owls")
        for piece in ["\u2581Owls", "\u2581are", "\u2581birds"]:
            loop.on_assistant_token(sp.piece_to_id(piece) if sp.piece_to_id(piece) else 5, 1)
        loop.transcript.add_assistant_words(["Owls", "are", "birds."])
        await _until(lambda: len(seen) >= 1)
        await asyncio.sleep(0.3)
        before = len(sink.calls)
        rid = loop.respond("Answer in French.")
        assert rid is not None
        await _until(lambda: any(getattr(e, "request_id", None) == rid and e.name == "oracle.reset" for e in events))
        assert len(sink.calls) > before
        # a cancel stops the request in flight and clears the oracle stream
        llm_server.responder = lambda rec: Reply(text="A long slow answer.", first_token_delay_s=2.0)
        rid2 = loop.respond()
        await asyncio.sleep(0.1)
        loop.cancel("client_cancelled")
        await asyncio.sleep(0.1)
        names = [e.name for e in events]
        assert "llm.cancelled" in names and "oracle.cleared" in names and sink.calls[-1] == "clear"
        assert not any(getattr(e, "request_id", None) == rid2 and e.name == "oracle.reset" for e in events)
        await loop.aclose()
        return events, sink

    asyncio.run(main())
    requested = seen[-1].body["messages"]  # the requested one (the cancelled one had another responder)
    assert "Answer in French." in requested[0]["content"]
    assert any("Tell me about owls." in m["content"] for m in requested if m["role"] == "user")
