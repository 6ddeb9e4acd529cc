"""`kame run --asr whisper --backend NAME`: the whole loop on a file, at real time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kame.audio.files import write_wav
from tests.support.llm_server import LlmServer, Reply
from tests.support.speech import silence, speech_end, synthesize

QUESTION = "What is the capital of France and why is it famous?"
ANSWER = "The capital of France is Paris, famous for art, food and the Eiffel Tower."


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    pcm = np.concatenate([silence(0.5), synthesize(QUESTION), silence(0.3)])
    path = tmp_path_factory.mktemp("tandem") / "q.wav"
    write_wav(path, pcm)
    return path, speech_end(pcm)


@pytest.mark.realtime  # the pipeline's own deadline (30 s + the input's length) starved on a niced worker
def test_tandem_run_end_to_end(tiny_kame_ckpt: Path, question_wav: tuple[Path, float], llm_server: LlmServer,
                               tmp_path: Path) -> None:
    wav, end_s = question_wav
    llm_server.set_default(Reply(text=ANSWER, first_token_delay_s=0.1, chunk_delay_s=0.02))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "backends:\n"
        f"  local:\n    base_url: {llm_server.base_url}\n    model: served-model\n    api_key_env: ''\n"
        "default_backend: local\n"
    )
    out, events_path = tmp_path / "reply.wav", tmp_path / "events.jsonl"
    env = dict(os.environ, KAME_CACHE_DIR=str(tmp_path))
    res = subprocess.run(
        [sys.executable, "-m", "kame.cli", "run", "--config", str(cfg), "--checkpoint", str(tiny_kame_ckpt),
         "--input", str(wav), "--output", str(out), "--asr", "whisper", "--backend", "local",
         "--events-out", str(events_path), "--tail", "2", "--seed", "1"],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    types = [e["type"] for e in events]
    assert all("t_s" in e for e in events)
    partials = [e for e in events if e["type"] == "asr.partial"]
    assert partials and partials[0]["t_s"] < end_s + 0.5  # transcribed while the user speaks
    assert "asr.final" in types
    started = [e for e in events if e["type"] == "llm.request_started"]
    assert started and started[0]["t_s"] < end_s + 1.5
    assert "llm.first_token" in types and "oracle.reset" in types
    # the oracle stream fed to the model, token by token, equals encode(sanitize(answer)) after the start id
    import sentencepiece as spm

    from kame.oracle.sanitize import sanitize

    sp = spm.SentencePieceProcessor(model_file=str(tiny_kame_ckpt / "tokenizer.model"))
    tokens = [e for e in events if e["type"] == "oracle.token"]
    steps = [e["step"] for e in tokens]
    assert steps == sorted(steps)
    ids = [e["id"] for e in tokens]
    last_start = max(i for i, t in enumerate(ids) if t == 200)  # tiny text_card = start id
    fed = ids[last_start + 1 :]  # in order, never skipped: a prefix of the answer's encoding
    assert len(fed) >= 5 and fed == sp.encode(sanitize(ANSWER))[: len(fed)]
    assert any(e["type"] == "text" for e in events)
    req = llm_server.chat_requests()[-1]
    assert "capital" in json.dumps(req.body["messages"]).lower()
    assert out.stat().st_size > 44 + 2 * 24000 * 2  # the reply covers the input and the tail


def test_unknown_backend_is_one_line(tiny_kame_ckpt: Path, question_wav: tuple[Path, float], tmp_path: Path) -> None:
    wav, _ = question_wav
    res = subprocess.run(
        [sys.executable, "-m", "kame.cli", "run", "--checkpoint", str(tiny_kame_ckpt), "--input", str(wav),
         "--output", str(tmp_path / "o.wav"), "--backend", "nope", "--asr", "none"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, KAME_LLM_BASE_URL="http://127.0.0.1:9/v1", KAME_LLM_MODEL="m"),
    )
    assert res.returncode == 2 and "nope" in res.stderr and "Traceback" not in res.stderr
