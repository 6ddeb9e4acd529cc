"""kame eval's judge against a real HTTP chat-completions server: prompts, retries, garbled judgements."""

from __future__ import annotations

import asyncio

from kame.eval.judge import Judge, JudgeConfig
from kame.eval.questions import load_judge_prompts, load_questions
from tests.support.llm_server import LlmServer, Reply


def _judge(server: LlmServer, retries: int = 2) -> Judge:
    return Judge(JudgeConfig("judge-x", server.base_url, "sk-test", retries=retries, backoff_s=0.01),
                 load_judge_prompts())


def test_garbled_judgement_is_retried_then_scored(llm_server: LlmServer) -> None:
    q = {x.question_id: x for x in load_questions()}[104]
    llm_server.push(Reply("Looks fine, 6 out of 10."), Reply("Still no brackets."), Reply("Fine. Rating: [[6]]"))

    async def main() -> object:
        judge = _judge(llm_server)
        try:
            return await judge.grade(q, 1, ["He has no brother."])
        finally:
            await judge.aclose()

    j = asyncio.run(main())
    assert (j.score, j.attempts, j.error, j.prompt) == (6.0, 3, None, "single-math-v1")
    assert j.explanation == "Fine. Rating: [[6]]"
    reqs = llm_server.chat_requests()
    assert len(reqs) == 3
    body = reqs[0].body
    assert body["model"] == "judge-x" and body["temperature"] == 0.0 and not body.get("stream")
    assert reqs[0].headers["authorization"] == "Bearer sk-test"
    assert body["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    assert q.reference is not None and q.reference[0] in body["messages"][1]["content"]


def test_garbled_after_all_retries_is_marked_and_api_errors_are_retried(llm_server: LlmServer) -> None:
    q = {x.question_id: x for x in load_questions()}[151]
    llm_server.push(Reply("no rating here"), Reply("Rating: [[12]]"))

    async def main() -> tuple[object, object]:
        judge = _judge(llm_server, retries=1)
        try:
            marked = await judge.grade(q, 2, ["one", "two"])
            llm_server.push(Reply(status=500), Reply("Rating: [[4]]"))
            recovered = await judge.grade(q, 1, ["one"])
            return marked, recovered
        finally:
            await judge.aclose()

    marked, recovered = asyncio.run(main())
    assert marked.score is None and marked.attempts == 2  # type: ignore[attr-defined]
    assert "no [[rating]]" in marked.error and marked.explanation == "Rating: [[12]]"  # type: ignore[attr-defined]
    assert marked.prompt == "single-v1-multi-turn"  # type: ignore[attr-defined]
    assert (recovered.score, recovered.attempts) == (4.0, 2)  # type: ignore[attr-defined]
    multi = llm_server.chat_requests()[0].body["messages"]
    assert multi[0]["content"].startswith("Please act as an impartial judge")
    assert q.turns[0] in multi[1]["content"] and q.turns[1] in multi[1]["content"] and "two" in multi[1]["content"]
