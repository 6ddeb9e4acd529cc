#!/usr/bin/env python3
"""The scripted OpenAI-compatible LLM that scripts/pipecat_live_check.py runs kame and Pipecat against.

Run with kame's own environment (it uses the test suite's real HTTP server, tests/support/llm_server.py); it
prints its base URL on the first line, then serves until killed. One server plays two parts, told apart
by the requested model:

- ``pipecat-backend`` (Pipecat's client-delegation back-end, a ``BackendLLMWorker`` running
  ``OpenAILLMService``): a note, then a line marked ``>>`` (Pipecat's spoken mark), so Pipecat sends
  both a ``session.thinking.append`` and a ``session.commentary.append``;
- any other model (kame's back-end in Responses delegation): without tools a guess; with tools a
  ``get_weather`` call (and ``get_time`` too when the user asks for the time and it is offered), then
  an answer built on the function outputs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from tests.support.llm_server import LlmServer, RecordedRequest, Reply, ToolCallScript  # noqa: E402

BACKEND_MODEL = "pipecat-backend"


def _offered(body: dict[str, object], name: str) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and any(
        isinstance(t, dict) and (t.get("function") or {}).get("name") == name for t in tools
    )


def respond(rec: RecordedRequest) -> Reply:
    body = rec.body if isinstance(rec.body, dict) else {}
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if body.get("model") == BACKEND_MODEL:
        return Reply(text="I looked it up in the atlas.\n>> Paris is the capital of France.")
    if not body.get("tools"):
        return Reply(text="It is probably mild outside.")
    if last.get("role") == "tool":
        result: dict[str, object] = {}
        for m in messages[::-1]:
            if m.get("role") != "tool":
                break
            try:
                result.update(json.loads(m.get("content") or "{}"))
            except ValueError:
                pass
        text = f"It is {result.get('sky', 'unknown')} and {result.get('temp_c', 0)} degrees in Paris"
        if "time" in result:
            text += f", and it is {result['time']} there"
        return Reply(text=text + ".")
    weather = ToolCallScript("get_weather", {"city": "Paris"})
    if "time" in str(last.get("content", "")).lower() and _offered(body, "get_time"):
        return Reply(text="Let me check both.", tool_calls=[weather, ToolCallScript("get_time", {"city": "Paris"})])
    return Reply(text="Let me check.", tool_calls=[weather])


def main() -> None:
    server = LlmServer(models=["test-model", BACKEND_MODEL])
    server.responder = respond
    server.start()
    print(server.base_url, flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
