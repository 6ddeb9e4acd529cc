"""What the framework tests share: kame's configuration, the LLM's script, the questions, and a runner for
the drivers that live in the frameworks' own virtualenvs (tests/frameworks/venvs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.llm_server import RecordedRequest, Reply, ToolCallScript
from tests.support.moshi_client import ServerProcess

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import venvs  # noqa: E402

CONFIG = """
device: cpu
frontend:
  checkpoint: "tiny:0"
asr:
  kind: whisper
  device: cpu
backends:
  llm:
    base_url: {base_url}
    model: tools-model
    api_key_env: ""
    allow_tools: true
    breaker: {{enabled: false}}
default_backend: llm
tools:
  call_timeout_s: 15
server:
  max_sessions: 2
  idle_timeout_s: 20
"""

#: What the user says (espeak-ng), by file name.
QUESTIONS = {
    "weather": "What is the weather like in Paris today?",
    "interrupt": "Wait, tell me something else please.",
    "hello": "Hello there, how are you doing today?",
}


def llm(rec: RecordedRequest) -> Reply:
    """Answers from a function's output; calls get_weather when it hears 'weather' and may call functions."""
    results = rec.tool_messages
    if results:
        return Reply(text=f"Good news, {results[-1]['content']}.", first_token_delay_s=0.05)
    heard = (rec.last_user_message or "").lower()
    if "weather" in heard and "get_weather" in rec.tool_names:
        return Reply(text="Let me check.", first_token_delay_s=0.05, tool_calls=[ToolCallScript("get_weather", {"city": "Paris"})])
    if "joke" in heard:
        return Reply(text="Penguins wear tuxedos because they are always ready for a party.", first_token_delay_s=0.05)
    return Reply(text="I am listening, go on.", first_token_delay_s=0.05)


@dataclass
class DriverRun:
    """What a driver reported (tests/frameworks/drive_common.py)."""

    report: dict[str, Any]
    stdout: str
    report_name: str = ""

    @property
    def errors(self) -> list[str]:
        return list(self.report["errors"])

    @property
    def events(self) -> dict[str, int]:
        return dict(self.report["server_events"])

    def reply_rtf(self, gap_s: float = 0.4) -> tuple[float, float]:
        """(audio seconds, RTF) of the reply audio: audio received / wall time within each burst of chunks
        (chunks less than ``gap_s`` apart), the last chunk's own length included."""
        chunks = [tuple(c) for c in self.report["audio"]]
        if not chunks:
            return 0.0, 0.0
        audio = wall = 0.0
        start, last_t, last_len, burst = chunks[0][0], chunks[0][0], chunks[0][1], chunks[0][1]
        for t, seconds in chunks[1:]:
            if t - last_t > gap_s + last_len:
                audio, wall = audio + burst, wall + (last_t - start) + last_len
                start, burst = t, 0.0
            burst += seconds
            last_t, last_len = t, seconds
        audio, wall = audio + burst, wall + (last_t - start) + last_len
        return audio, audio / wall if wall > 0 else 0.0


def run_driver(framework: str, script: str, server: ServerProcess, audio: Path, out_dir: Path, seconds: float = 45) -> DriverRun:
    """Run ``tests/frameworks/<script>`` with the framework's interpreter (its virtualenv built if missing)."""
    python = venvs.ensure(framework, log=out_dir / f"{framework}-pip.log")
    out = out_dir / f"{framework}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAME_", "OPENAI_", "LIVEKIT_"))}
    env.update({"PYTHONPATH": str(HERE), "PYTHONUNBUFFERED": "1", "OPENAI_API_KEY": "none"})
    proc = subprocess.run(
        [str(python), str(HERE / script), "--url", server.http_url, "--audio", str(audio), "--out", str(out),
         "--seconds", str(seconds)],
        env=env, capture_output=True, text=True, timeout=seconds + 60,
    )
    assert proc.returncode == 0 and out.exists(), f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return DriverRun(json.loads(out.read_text()), proc.stdout + proc.stderr, framework)
