"""Pipecat 1.14's ``OpenAIRealtimeLLMService`` driven by its own VAD (``turn_detection: null``, Silero in the
user aggregator) against kame, in its own virtualenv: Pipecat commits each turn and asks for the answer,
clears and cancels when the user speaks over the assistant; zero error events, transcripts from the commits,
reply audio at real time, the function's output back at the back-end."""

from __future__ import annotations

from pathlib import Path

from scenario import llm, run_driver

from tests.support.llm_server import LlmServer
from tests.support.moshi_client import ServerProcess


def test_pipecat_with_its_own_vad(kame_server: ServerProcess, llm_backend: LlmServer, question_audio: Path,
                                  tmp_path: Path) -> None:
    llm_backend.reset()
    llm_backend.responder = llm
    run = run_driver("pipecat", "drive_pipecat_vad.py", kame_server, question_audio, tmp_path)
    chat = llm_backend.chat_requests()
    seen = [(r.last_user_message, r.tool_names, len(r.tool_messages)) for r in chat]
    sent = run.report["notes"].get("client_events", {})
    assert run.errors == [] and run.events.get("error", 0) == 0, (run.errors, run.events)
    assert "timeout" not in run.report["notes"], (run.report["notes"], seen)
    assert not [t for t in run.events if t.startswith("kame.")], run.events
    # Pipecat decided the turns: it committed and cleared, and kame answered each
    assert sent.get("input_audio_buffer.commit", 0) >= 1 and sent.get("input_audio_buffer.clear", 0) >= 1, sent
    assert run.events.get("input_audio_buffer.committed", 0) == sent["input_audio_buffer.commit"], (run.events, sent)
    assert run.events.get("input_audio_buffer.cleared", 0) == sent["input_audio_buffer.clear"], (run.events, sent)
    assert sent.get("response.cancel", 0) >= 1, sent
    assert "input_audio_buffer.speech_started" not in run.events  # no server VAD events in this mode
    assert any("weather" in t.lower() for t in run.report["user_transcripts"]), run.report["user_transcripts"]
    # the back-end was asked on Pipecat's response.create with the committed words, and got the function's output
    assert any("What is the weather like in Paris" in str(r.body.get("messages")) for r in chat), seen
    assert run.report["tool_runs"] == [{"name": "get_weather", "city": "Paris"}], run.report["tool_runs"]
    assert any("sunny and 21 degrees in Paris" in m["content"] for r in chat for m in r.tool_messages), seen
    audio_s, rtf = run.reply_rtf()
    print(f"{run.report_name} (own VAD): reply audio {audio_s:.1f} s at RTF {rtf:.3f}, {sum(run.events.values())} server events")
    assert audio_s > 2.0 and rtf >= 0.98, (audio_s, rtf)
