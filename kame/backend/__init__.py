"""LLM back-ends: stream a chat reply as text chunks from any OpenAI-compatible server (or a script).

Entry points: :class:`BackendRegistry` (``BackendRegistry.from_config(cfg, os.environ)``),
``registry.stream(name, messages)``; see ``docs/backends.md``. Names are
imported lazily so that ``kame.config`` (which needs only the settings
models) does not pull in the ``openai`` package.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChatMessage": "kame.backend.base",
    "BackendHealth": "kame.backend.base",
    "LlmBackend": "kame.backend.base",
    "BackendConfig": "kame.backend.config",
    "LlmConfig": "kame.backend.config",
    "BackendError": "kame.backend.errors",
    "BackendTimeout": "kame.backend.errors",
    "BackendRateLimited": "kame.backend.errors",
    "BackendServerError": "kame.backend.errors",
    "BackendAuthError": "kame.backend.errors",
    "BackendRequestError": "kame.backend.errors",
    "BackendMalformedStream": "kame.backend.errors",
    "BackendUnavailable": "kame.backend.errors",
    "BackendBusy": "kame.backend.errors",
    "BackendCircuitOpen": "kame.backend.errors",
    "BackendToolsRefused": "kame.backend.errors",
    "tools_refusal": "kame.backend.tool_refusal",
    "UnknownBackend": "kame.backend.errors",
    "PRESETS": "kame.backend.presets",
    "resolve_backends": "kame.backend.resolve",
    "ResolvedBackends": "kame.backend.resolve",
    "BackendConfigError": "kame.backend.resolve",
    "BackendRegistry": "kame.backend.registry",
    "ReplyStream": "kame.backend.registry",
    "BackendEvent": "kame.backend.stats",
    "BackendStats": "kame.backend.stats",
    "OpenAIBackend": "kame.backend.openai_backend",
    "ScriptedBackend": "kame.backend.scripted",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kame.backend' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
