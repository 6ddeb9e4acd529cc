"""Answers built on tools reach the oracle; speculation shares read-only calls and runs side effects once.

The LLM is a real local server streaming ``tool_calls`` in the chat-completions
format, reached through the real ``openai`` client.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from kame.backend.registry import BackendRegistry
from kame.backend.speculation import SpeculativeCalls, ToolCallEvent
from kame.backend.tool_loop import ToolLoopLimits
from kame.backend.tools import ToolCall, ToolResult, ToolSpec
from kame.config import KameConfig
from kame.oracle.config import OracleConfig
from kame.oracle.loop import OracleLoop, SessionOracleSettings
from kame.oracle.session_tools import SessionTools
from kame.oracle.switch import FeedState, decide_switch
from tests.support.llm_server import LlmServer, RecordedRequest, Reply, ToolCallScript
from tests.support.oracle_loop import RecordingSink

WEATHER = ToolSpec("get_weather", "Weather of a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}}, read_only=True)
BOOK = ToolSpec("book_table", "Book a table (side effect).", {"type": "object", "properties": {}})
POLICIES = ["reset", "keep_if_same_start", "freeze_when_speaking"]


@pytest.fixture(scope="module")
def sp(tiny_kame_ckpt: Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(tiny_kame_ckpt / "tokenizer.model"))


class Tools:
    """Real async tools with a delay; counts executions."""

    def __init__(self, delay_s: float = 0.5) -> None:
        self.delay_s = delay_s
        self.runs: list[str] = []

    async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
        self.runs.append(call.name)
        await asyncio.sleep(self.delay_s)
        out = "sunny" if call.name == "get_weather" else "booked for seven"
        return ToolResult(call.id, call.name, "ok", out)


def llm(rec: RecordedRequest) -> Reply:
    """The LLM: answers from a tool message; else calls the tool the question needs, if offered."""
    results = rec.tool_messages
    if results:
        return Reply(text=f"It is {results[-1]['content']} in Paris." if "sunny" in results[-1]["content"]
                     else f"Done, {results[-1]['content']}.", chunk_delay_s=0.01)
    user = (rec.last_user_message or "").lower()
    if "joke" in user:
        return Reply(text="Why did the turtle cross the road.")
    if "weather" in user and "get_weather" in rec.tool_names:
        return Reply(text="Let me check.", tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])
    if "book" in user and "book_table" in rec.tool_names:
        return Reply(text="One moment.", tool_calls=[ToolCallScript("book_table", {})])
    return Reply(text="I am not sure.")


def make_loop(server: LlmServer, sp: spm.SentencePieceProcessor, tools: Tools, events: list[tuple[str, dict]],
              sink: RecordingSink, policy: str = "reset", observed: list[ToolCallEvent] | None = None) -> OracleLoop:
    cfg = KameConfig.model_validate({"backends": {"main": {
        "base_url": server.base_url, "model": "m", "api_key_env": "", "allow_tools": True,
        "breaker": {"enabled": False}}}})
    reg = BackendRegistry.from_config(cfg, {})
    config = OracleConfig(policy=policy, word_end_pad_steps=2)  # type: ignore[arg-type]
    session_tools = SessionTools.create(ToolLoopLimits(call_timeout_s=3.0),
                                        observer=(observed.append if observed is not None else None))
    session_tools.routes.set("test", [WEATHER, BOOK], tools)
    return OracleLoop(config=config, registry=reg, sink=sink, encode=sp.encode, piece_of=sp.id_to_piece,
                      emit=lambda e: events.append((e.name, e.fields())),
                      settings=SessionOracleSettings(policy=policy, barge_in="keep"), tools=session_tools)


async def wait_for(pred: Any, timeout: float = 6.0) -> None:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def kinds(events: list[tuple[str, dict]]) -> list[str]:
    return [k for k, _ in events]


# ---------------------------------------------------------------------- the rule, pure


@pytest.mark.parametrize("policy", POLICIES)
def test_rule_tool_answer_resets_even_after_the_assistant_spoke(policy: str) -> None:
    spoke = FeedState(turn_id=1, fed_words=("Let", "me", "check."), assistant_spoke=True)
    d = decide_switch(policy, spoke, answer_turn_id=1, current_turn_id=1,  # type: ignore[arg-type]
                      answer_words=["It", "is", "sunny."], answer_complete=False, built_on_tools=True)
    assert d.action == "reset"
    # The same answer not built on tools follows the policy (freeze drops it, keep_if_same_start resets
    # because it starts differently).
    plain = decide_switch(policy, spoke, answer_turn_id=1, current_turn_id=1,  # type: ignore[arg-type]
                          answer_words=["It", "is", "sunny."], answer_complete=False)
    assert plain.action == ("ignore" if policy == "freeze_when_speaking" else "reset")


@pytest.mark.parametrize("policy", POLICIES)
def test_rule_staleness_after_a_backchannel(policy: str) -> None:
    state = FeedState(turn_id=1, fed_words=("Let", "me", "check."), assistant_spoke=True)
    common: dict[str, Any] = dict(answer_turn_id=1, current_turn_id=2, answer_words=["Sunny."], answer_complete=True)
    assert decide_switch(policy, state, built_on_tools=True, backchannel_only=True, **common).action == "reset"  # type: ignore[arg-type]
    assert decide_switch(policy, state, built_on_tools=True, backchannel_only=False, **common).action == "ignore"  # type: ignore[arg-type]
    assert decide_switch(policy, state, backchannel_only=True, **common).action == "ignore"  # type: ignore[arg-type]


# ---------------------------------------------------------------------- through the oracle loop


@pytest.mark.parametrize("policy", POLICIES)
def test_answer_on_tool_result_is_a_new_sequence_after_the_assistant_spoke_and_a_backchannel(
    llm_server: LlmServer, sp: spm.SentencePieceProcessor, policy: str
) -> None:
    llm_server.responder = llm
    tools = Tools(delay_s=0.6)

    async def main() -> tuple[RecordingSink, list[tuple[str, dict]]]:
        events: list[tuple[str, dict]] = []
        sink = RecordingSink()
        loop = make_loop(llm_server, sp, tools, events, sink, policy)
        loop.on_user_final("what is the weather in Paris")
        await wait_for(lambda: "tool.call_started" in kinds(events))
        await wait_for(lambda: len(sink.sequences()) == 1 and "check" in str(events))
        # While the tool runs: the assistant says its words, and the user backchannels.
        for tid in sp.encode("Let me check"):
            loop.on_assistant_token(tid)
        for _ in range(3):
            loop.on_assistant_token(3)
        assert loop.transcript.assistant_spoke
        loop.on_user_partial("uh huh")
        loop.on_user_final("uh huh")
        await wait_for(lambda: "llm.done" in kinds(events))
        await loop.aclose()
        return sink, events

    sink, events = asyncio.run(main())
    seqs = sink.sequences()
    assert seqs == [sp.encode("Let me check."), sp.encode("It is sunny in Paris.")]
    assert [c[0] for c in sink.calls].count("reset") == 2  # each its own sequence
    assert tools.runs == ["get_weather"]
    finished = [d for k, d in events if k == "tool.call_finished"]
    assert finished and finished[0]["outcome"] == "ok" and finished[0]["duration_s"] >= 0.5
    assert "llm.dropped" not in kinds(events)
    # the backchannel did not start a request of its own
    assert kinds(events).count("llm.request_started") == 1


def test_a_real_user_turn_while_tools_run_makes_the_tool_answer_stale(
    llm_server: LlmServer, sp: spm.SentencePieceProcessor
) -> None:
    llm_server.responder = llm
    tools = Tools(delay_s=0.6)

    async def main() -> tuple[RecordingSink, list[tuple[str, dict]]]:
        events: list[tuple[str, dict]] = []
        sink = RecordingSink()
        loop = make_loop(llm_server, sp, tools, events, sink)
        loop.on_user_final("what is the weather in Paris")
        await wait_for(lambda: "tool.call_started" in kinds(events))
        loop.on_user_partial("no wait tell me a joke")
        await wait_for(lambda: kinds(events).count("llm.request_started") == 2)
        await asyncio.sleep(1.0)
        await loop.aclose()
        return sink, events

    sink, events = asyncio.run(main())
    assert "llm.cancelled" in kinds(events)
    assert sink.sequences() == [sp.encode("Let me check."), sp.encode("Why did the turtle cross the road.")]


def test_read_only_call_on_a_partial_survives_its_request_and_is_reused(
    llm_server: LlmServer, sp: spm.SentencePieceProcessor
) -> None:
    llm_server.responder = llm
    tools = Tools(delay_s=0.8)
    observed: list[ToolCallEvent] = []

    async def main() -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        loop = make_loop(llm_server, sp, tools, events, RecordingSink(), observed=observed)
        loop.on_user_partial("what is the weather")  # partial: read-only tools only
        await wait_for(lambda: "tool.call_started" in kinds(events))
        loop.on_user_partial("what is the weather in Paris")  # supersedes the request while the tool runs
        await wait_for(lambda: kinds(events).count("llm.cancelled") == 1)
        loop.on_user_final("what is the weather in Paris today")
        await wait_for(lambda: "llm.done" in kinds(events))
        await loop.aclose()
        return events

    events = asyncio.run(main())
    reqs = llm_server.chat_requests()
    assert "book_table" not in reqs[0].tool_names and "get_weather" in reqs[0].tool_names
    assert "book_table" in reqs[-1].tool_names  # the request after the turn ended gets every tool
    assert tools.runs == ["get_weather"], "the read-only call was issued again"
    assert [e.kind for e in observed] == ["started", "finished"]
    done = [d for k, d in events if k == "llm.done"][-1]
    assert done["text"] == "It is sunny in Paris."


def test_side_effecting_call_runs_once_after_the_turn_and_its_result_reaches_the_next_request(
    llm_server: LlmServer, sp: spm.SentencePieceProcessor
) -> None:
    llm_server.responder = llm
    tools = Tools(delay_s=0.8)

    async def main() -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        loop = make_loop(llm_server, sp, tools, events, RecordingSink())
        loop.on_user_partial("please book a table")  # partial: book_table is not offered
        await wait_for(lambda: "llm.done" in kinds(events))
        assert tools.runs == []
        loop.on_user_final("please book a table")  # the turn ended: offered, called
        await wait_for(lambda: "tool.call_started" in kinds(events))
        loop.on_user_final("please book a table for seven")  # a corrected final supersedes it mid-call
        await wait_for(lambda: kinds(events).count("llm.done") == 2, timeout=8)
        await loop.aclose()
        return events

    events = asyncio.run(main())
    assert tools.runs == ["book_table"], "the side-effecting call was issued twice or never"
    reqs = llm_server.chat_requests()
    assert "book_table" not in reqs[0].tool_names
    last = reqs[-1]
    assert [m["content"] for m in last.tool_messages] == ["booked for seven"]
    assert [d for k, d in events if k == "llm.done"][-1]["text"] == "Done, booked for seven."


# ---------------------------------------------------------------------- SpeculativeCalls alone


def test_speculation_shares_caches_and_never_caches_failures() -> None:
    class Flaky:
        def __init__(self) -> None:
            self.n = 0

        async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
            self.n += 1
            await asyncio.sleep(0.1)
            if self.n == 1:
                raise RuntimeError("first call breaks")
            return ToolResult(call.id, call.name, "ok", f"run {self.n}")

    async def main() -> None:
        now = [0.0]
        inner = Flaky()
        spec = SpeculativeCalls(inner, cache_ttl_s=10, clock=lambda: now[0])
        ex = spec.executor(turn_id=1, turn_ended=False)
        a = await ex.execute(ToolCall("a", "get_weather", '{"city":"Paris"}'), WEATHER)
        assert a.outcome == "error" and "first call breaks" in a.output
        b, c = await asyncio.gather(
            ex.execute(ToolCall("b", "get_weather", '{"city": "Paris"}'), WEATHER),
            ex.execute(ToolCall("c", "get_weather", '{ "city":"Paris" }'), WEATHER),
        )
        assert (b.output, c.output, b.call_id, c.call_id) == ("run 2", "run 2", "b", "c")
        now[0] = 5.0
        assert (await ex.execute(ToolCall("d", "get_weather", '{"city":"Paris"}'), WEATHER)).output == "run 2"
        now[0] = 30.0
        assert (await ex.execute(ToolCall("e", "get_weather", '{"city":"Paris"}'), WEATHER)).output == "run 3"
        refused = await ex.execute(ToolCall("f", "book_table", "{}"), BOOK)
        assert refused.outcome == "refused" and inner.n == 3

    asyncio.run(main())


def test_speculation_a_cancelled_request_does_not_cancel_shared_or_effect_calls() -> None:
    async def main() -> None:
        tools = Tools(delay_s=0.3)
        spec = SpeculativeCalls(tools, call_timeout_s=2)
        ex = spec.executor(turn_id=1, turn_ended=True)
        t1 = asyncio.create_task(ex.execute(ToolCall("a", "get_weather", "{}"), WEATHER))
        t2 = asyncio.create_task(ex.execute(ToolCall("b", "book_table", "{}"), BOOK))
        await asyncio.sleep(0.05)
        t1.cancel()
        t2.cancel()
        carried = spec.carry_over()
        assert [p.call.id for p in carried] == ["b"]
        assert (await carried[0].result).output == "booked for seven"
        again = await spec.executor(turn_id=1, turn_ended=True).execute(ToolCall("c", "get_weather", "{}"), WEATHER)
        assert again.output == "sunny" and tools.runs == ["get_weather", "book_table"]
        spec.mark_delivered([carried[0].call])
        assert spec.carry_over() == []
        # Same turn, asked again after delivery: still not re-issued.
        await spec.executor(turn_id=1, turn_ended=True).execute(ToolCall("d", "book_table", "{}"), BOOK)
        assert tools.runs.count("book_table") == 1
        # A later turn asking again is a new action.
        await spec.executor(turn_id=2, turn_ended=True).execute(ToolCall("e", "book_table", "{}"), BOOK)
        assert tools.runs.count("book_table") == 2
        await spec.aclose()

    asyncio.run(main())


def test_speculation_session_end_lets_side_effects_finish() -> None:
    async def main() -> None:
        tools = Tools(delay_s=0.3)
        spec = SpeculativeCalls(tools, call_timeout_s=2)
        observed: list[ToolCallEvent] = []
        spec.observer = observed.append
        asyncio.create_task(spec.executor(turn_id=1, turn_ended=True).execute(ToolCall("b", "book_table", "{}"), BOOK))
        asyncio.create_task(spec.executor(turn_id=1, turn_ended=True).execute(ToolCall("a", "get_weather", "{}"), WEATHER))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await spec.aclose()
        assert time.monotonic() - t0 < 0.2, "closing waited for the side effect"
        outcomes = {e.name: e.outcome for e in observed if e.kind == "finished"}
        assert outcomes == {"get_weather": "error"}  # the read-only call was cancelled at once
        await asyncio.sleep(0.4)  # ... and the side effect runs to its end, after the session
        outcomes = {e.name: e.outcome for e in observed if e.kind == "finished"}
        assert outcomes == {"book_table": "ok", "get_weather": "error"}

    asyncio.run(main())


def test_routed_tools_send_each_call_to_its_source() -> None:
    from kame.oracle.session_tools import RoutedTools

    class Named:
        def __init__(self, label: str) -> None:
            self.label = label

        async def execute(self, call: ToolCall, spec: ToolSpec) -> ToolResult:
            return ToolResult(call.id, call.name, "ok", self.label)

    async def main() -> None:
        routes = RoutedTools()
        routes.set("mcp", [WEATHER], Named("mcp"))
        routes.set("client", [BOOK, ToolSpec("get_weather")], Named("client"))
        assert [s.name for s in routes.specs] == ["get_weather", "book_table"]
        assert (await routes.execute(ToolCall("1", "get_weather"), WEATHER)).output == "mcp"
        assert (await routes.execute(ToolCall("2", "book_table"), BOOK)).output == "client"
        assert (await routes.execute(ToolCall("3", "nope"), BOOK)).outcome == "refused"
        routes.set("mcp", [], Named("mcp"))
        assert (await routes.execute(ToolCall("4", "get_weather"), WEATHER)).output == "client"

    asyncio.run(main())
