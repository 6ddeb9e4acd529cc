"""OpenAI's Agents SDK (``RealtimeRunner``, openai-agents 0.24) against kame, in its own virtualenv:
a function tool, two user turns with an interruption, a typed message; zero errors, reply audio at real
time, transcripts, the function run by the SDK and its output back at the back-end."""

from __future__ import annotations

from pathlib import Path

from scenario import llm, run_driver

from tests.support.llm_server import LlmServer
from tests.support.moshi_client import ServerProcess

TYPED = "Please tell me a short joke about penguins."


def test_agents_sdk_realtime_runner(kame_server: ServerProcess, llm_backend: LlmServer, question_audio: Path,
                                    tmp_path: Path) -> None:
    llm_backend.reset()
    llm_backend.responder = llm
    run = run_driver("openai-agents", "drive_agents.py", kame_server, question_audio, tmp_path)
    assert run.errors == [], run.errors
    chat = llm_backend.chat_requests()
    seen = [(r.last_user_message, r.tool_names, len(r.tool_messages)) for r in chat]
    assert "timeout" not in run.report["notes"], (run.report, seen)
    assert not [t for t in run.events if t.startswith("kame.")], run.events
    # the function ran in the SDK, and its output came back to the back-end
    assert run.report["tool_runs"] and run.report["tool_runs"][0]["city"] == "Paris", run.report["tool_runs"]
    assert any("sunny and 21 degrees in Paris" in m["content"] for r in chat for m in r.tool_messages), \
        [r.tool_messages for r in chat]
    # the typed message reached the back-end, and was answered
    assert any(TYPED in str(r.body.get("messages")) for r in chat), [r.last_user_message for r in chat]
    # the SDK cancelled on the user's speech through interrupt_response (no response.cancel error)
    assert run.events.get("response.done", 0) >= 2, run.events
    assert any("weather" in t.lower() for t in run.report["user_transcripts"]), run.report["user_transcripts"]
    assert len(run.report["user_transcripts"]) >= 2, run.report["user_transcripts"]
    assert any(t.strip() for t in run.report["assistant_transcripts"]), run.report["assistant_transcripts"]
    audio_s, rtf = run.reply_rtf()
    print(f"{run.report_name}: reply audio {audio_s:.1f} s at RTF {rtf:.3f}, {sum(run.events.values())} server events")
    assert audio_s > 2.0 and rtf >= 0.98, (audio_s, rtf)
