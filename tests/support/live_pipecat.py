"""Pipecat's own Live API event models (pipecat-ai 1.14, ``pipecat/services/openai/live/events.py``).

``OpenAILiveLLMService`` builds every client event with these models and parses every server event
with ``parse_server_event``; a server event that fails its model is dropped, and every ``error`` is a
pipeline error. The module needs only pydantic, so it is loaded from the installed distribution by
file (``scripts/install.sh --test`` installs ``pipecat-ai`` with ``--no-deps``: the rest of Pipecat,
numba and onnxruntime among its dependencies, is not needed for its wire protocol, and importing the
``pipecat`` package would patch ``asyncio.wait_for`` process-wide).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import distribution
from types import ModuleType

MODULE = "pipecat_live_events"


def pipecat_live_events() -> ModuleType:
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    dist = distribution("pipecat-ai")
    assert dist.version == "1.14.0", dist.version
    path = dist.locate_file("pipecat/services/openai/live/events.py")
    spec = importlib.util.spec_from_file_location(MODULE, str(path))
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    spec.loader.exec_module(module)
    return module
