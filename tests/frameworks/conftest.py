"""Fixtures of the framework tests: one kame server (CPU demo model, Whisper ASR, a local LLM server that
calls ``get_weather``) shared by them, and the questions as audio files."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.llm_server import LlmServer, running_llm_server
from tests.support.moshi_client import ServerProcess
from tests.support.speech import silence, synthesize

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenario import CONFIG, QUESTIONS, llm  # noqa: E402


@pytest.fixture(scope="session")
def llm_backend() -> Iterator[LlmServer]:
    with running_llm_server(["tools-model"]) as srv:
        srv.responder = llm
        yield srv


@pytest.fixture(scope="session")
def kame_server(kame_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory, llm_backend: LlmServer) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("frameworks")
    config = tmp / "frameworks.yaml"
    config.write_text(CONFIG.format(base_url=llm_backend.base_url))
    srv = ServerProcess(cache_dir=kame_cache_dir, log_path=tmp / "server.log", config=str(config)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def question_audio(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The questions as 24 kHz PCM16 ``.raw`` files (with a little silence after each)."""
    out = tmp_path_factory.mktemp("questions")
    for name, text in QUESTIONS.items():
        pcm = np.concatenate([synthesize(text), silence(0.3)])
        (out / f"{name}.raw").write_bytes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return out
