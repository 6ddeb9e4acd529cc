"""LiveKit Agents 1.8 (``RealtimeModel(base_url=...).session()``) against kame, in its own virtualenv:
``push_audio``, a function call run by the client and answered through ``update_chat_ctx`` +
``generate_reply``, then ``generate_reply(instructions=...)`` matched by its ``metadata.client_event_id``;
zero errors, reply audio at real time, transcripts, the function's output back at the back-end."""

from __future__ import annotations

from pathlib import Path

from scenario import llm, run_driver

from tests.support.llm_server import LlmServer
from tests.support.moshi_client import ServerProcess

GENERATE = "Tell the user a short joke about penguins."


def test_livekit_realtime_session(kame_server: ServerProcess, llm_backend: LlmServer, question_audio: Path,
                                  tmp_path: Path) -> None:
    llm_backend.reset()
    llm_backend.responder = llm
    run = run_driver("livekit", "drive_livekit.py", kame_server, question_audio, tmp_path)
    chat = llm_backend.chat_requests()
    seen = [(r.last_user_message, r.tool_names, len(r.tool_messages)) for r in chat]
    assert run.errors == [], run.errors
    assert "timeout" not in run.report["notes"], (run.report, seen)
    assert not [t for t in run.events if t.startswith("kame.")], run.events
    assert run.report["tool_runs"] == [{"name": "get_weather", "city": "Paris"}], run.report["tool_runs"]
    assert any("sunny and 21 degrees in Paris" in m["content"] for r in chat for m in r.tool_messages), seen
    # generate_reply: its response.created came at once, and the back-end was asked with its instructions
    assert run.report["notes"]["generate_reply_user_initiated"] is True
    assert run.report["notes"]["generate_reply_s"] < 1.0, run.report["notes"]
    assert any(GENERATE in str(r.body.get("messages")) for r in chat), seen
    # one response at a time: LiveKit kept receiving audio after the function call
    assert run.events.get("response.function_call_arguments.done") == 1
    assert any("weather" in t.lower() for t in run.report["user_transcripts"]), run.report["user_transcripts"]
    assert any(t.strip() for t in run.report["assistant_transcripts"]), run.report["assistant_transcripts"]
    audio_s, rtf = run.reply_rtf()
    print(f"{run.report_name}: reply audio {audio_s:.1f} s at RTF {rtf:.3f}, {sum(run.events.values())} server events")
    assert audio_s > 2.0 and rtf >= 0.98, (audio_s, rtf)
