"""An OpenAI-compatible test server that refuses function tools the way vLLM does.

vLLM started without ``--enable-auto-tool-choice`` / ``--tool-call-parser``
answers every chat request whose ``tool_choice`` is ``auto`` (or absent with
``tools`` present, which vLLM defaults to auto) with HTTP 400 and, since
0.10, the body ``{"error": {"message": "\\"auto\\" tool choice requires
--enable-auto-tool-choice and --tool-call-parser to be set", "type":
"BadRequestError", "param": null, "code": 400}}`` (content type
application/json); ``tool_choice`` none or a named/required choice is
accepted (vLLM serves those with guided decoding). Everything else is
:class:`llm_server.LlmServer`. With ``refuse_tools`` False it accepts tools
(a server started with tool calling on).

What it does not cover: vLLM's other validation errors, the older body
without the ``error`` wrapper (the same fields at the top level; the client
code reads both).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from tests.support.llm_server import LlmServer, RecordedRequest

VLLM_TOOLS_MESSAGE = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


class VllmLikeServer(LlmServer):
    """:class:`LlmServer` answering requests with auto tool choice as vLLM without tool calling does."""

    def __init__(self, models: list[str] | None = None, *, refuse_tools: bool = True) -> None:
        super().__init__(models)
        self.refuse_tools = refuse_tools
        self.refused: list[RecordedRequest] = []

    async def _serve_chat(self, rec: RecordedRequest, writer: asyncio.StreamWriter,
                          gone: asyncio.Future[bytes]) -> None:
        body = rec.body if isinstance(rec.body, dict) else {}
        if self.refuse_tools and body.get("tools") and body.get("tool_choice", "auto") == "auto":
            self.refused.append(rec)
            await self._send_json(writer, 400, {"error": {"message": VLLM_TOOLS_MESSAGE, "type": "BadRequestError",
                                                          "param": None, "code": 400}})
            rec.completed = True
            return
        await super()._serve_chat(rec, writer, gone)


@contextlib.contextmanager
def running_vllm_like_server(models: list[str] | None = None, *, refuse_tools: bool = True) -> Iterator[VllmLikeServer]:
    server = VllmLikeServer(models, refuse_tools=refuse_tools).start()
    try:
        yield server
    finally:
        server.stop()
