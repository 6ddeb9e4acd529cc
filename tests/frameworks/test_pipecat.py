"""Pipecat 1.14's ``OpenAIRealtimeLLMService`` against kame, in its own virtualenv: its context loaded as
``conversation.item.create`` events and one ``response.create``, a function Pipecat runs, an interruption
(``conversation.item.truncate``); zero errors (Pipecat treats an error as fatal), reply audio at real time,
transcripts, the context and the function's output at the back-end."""

from __future__ import annotations

from pathlib import Path

from scenario import llm, run_driver

from tests.support.llm_server import LlmServer
from tests.support.moshi_client import ServerProcess

CONTEXT_NOTE = "The user's name is Ann and she lives in Paris."


def test_pipecat_openai_realtime_service(kame_server: ServerProcess, llm_backend: LlmServer, question_audio: Path,
                                         tmp_path: Path) -> None:
    llm_backend.reset()
    llm_backend.responder = llm
    run = run_driver("pipecat", "drive_pipecat.py", kame_server, question_audio, tmp_path)
    chat = llm_backend.chat_requests()
    seen = [(r.last_user_message, r.tool_names, len(r.tool_messages)) for r in chat]
    assert run.errors == [], run.errors
    assert run.events.get("error", 0) == 0, run.events  # not even the two codes Pipecat tolerates
    assert "timeout" not in run.report["notes"], (run.report["notes"], seen)
    assert not [t for t in run.events if t.startswith("kame.")], run.events
    # the context's message joined the back-end's context, and Pipecat's response.create asked it at once
    assert chat and CONTEXT_NOTE in str(chat[0].body.get("messages")), seen
    assert run.report["tool_runs"] == [{"name": "get_weather", "city": "Paris"}], run.report["tool_runs"]
    assert any("sunny and 21 degrees in Paris" in m["content"] for r in chat for m in r.tool_messages), seen
    # the user spoke over the assistant: Pipecat interrupted and truncated what it had played
    assert run.report["notes"].get("interruptions", 0) >= 1 and run.events.get("conversation.item.truncated", 0) >= 1
    assert any("weather" in t.lower() for t in run.report["user_transcripts"]), run.report["user_transcripts"]
    assert any(t.strip() for t in run.report["assistant_transcripts"]), run.report["assistant_transcripts"]
    audio_s, rtf = run.reply_rtf()
    print(f"{run.report_name}: reply audio {audio_s:.1f} s at RTF {rtf:.3f}, {sum(run.events.values())} server events")
    assert audio_s > 2.0 and rtf >= 0.98, (audio_s, rtf)
