"""Is an HTTP error a server's refusal of the request's function tools (and nothing else)?

OpenAI-compatible servers that cannot take tools say so in an ordinary
error response. Only these exact refusals count, so that an unrelated 400
(a bad parameter, a prompt too long) is never mistaken for one and never
switches a back-end's tools off:

- vLLM started without ``--enable-auto-tool-choice`` / ``--tool-call-parser``
  answers HTTP 400 ``{"error": {"message": "\\"auto\\" tool choice requires
  --enable-auto-tool-choice and --tool-call-parser to be set", "type":
  "BadRequestError", "param": null, "code": 400}}`` (older releases: the same
  fields without the ``error`` wrapper) to any request with tools and
  ``tool_choice`` auto or absent (absent means auto).
- llama.cpp's ``llama-server`` without ``--jinja`` (before it became the
  default) answers ``tools param requires --jinja flag`` (HTTP 500 in the
  releases that send it, ``type: server_error``), older builds
  ``Unsupported param: tools``.
- Ollama, for a model whose template has no tool support, answers HTTP 400
  ``{"error": {"message": "<model> does not support tools", ...}}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class _Refusal:
    server: str
    statuses: frozenset[int]
    pattern: re.Pattern[str]


_REFUSALS = (
    _Refusal("vLLM", frozenset({400}), re.compile(r"tool choice requires --enable-auto-tool-choice", re.I)),
    _Refusal("llama.cpp", frozenset({400, 500}), re.compile(r"tools param requires --jinja", re.I)),
    _Refusal("llama.cpp", frozenset({400, 500}), re.compile(r"unsupported param: tools\b", re.I)),
    _Refusal("Ollama", frozenset({400}), re.compile(r"\bdoes not support tools\b", re.I)),
)


def tools_refusal(status: int, message: str) -> str | None:
    """The server whose tool refusal this is (``vLLM``, ``llama.cpp``, ``Ollama``), or None.

    ``status`` is the HTTP status, ``message`` the error message of the body.
    """
    for refusal in _REFUSALS:
        if status in refusal.statuses and refusal.pattern.search(message):
            return refusal.server
    return None
