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


#: From a user turn's end: time for the end of turn to be detected, then how long its reply is measured.
SETTLE_S = 2.0
REPLY_WINDOW_S = 4.5


def test_livekit_a_reply_after_every_user_turn(kame_server: ServerProcess, llm_backend: LlmServer,
                                               question_audio: Path, tmp_path: Path) -> None:
    """LiveKit's default session (semantic_vad, interrupt_response, create_response): the user speaks over the
    greeting, then two more turns, one calling a function answered as AgentSession does (interrupt() then
    generate_reply()). After each turn's end the reply audio covers at least 0.8 of real time: what a cancel
    withheld ends when the user's turn is committed, even from a Moshi that never goes quiet."""
    llm_backend.reset()
    llm_backend.responder = llm
    run = run_driver("livekit", "drive_livekit_turns.py", kame_server, question_audio, tmp_path, seconds=50)
    assert run.errors == [], run.errors
    assert "timeout" not in run.report["notes"], run.report
    notes = run.report["notes"]
    assert "cancelled" in notes["responses"], notes["responses"]  # the barge-in on the greeting
    assert run.report["tool_runs"] == [{"name": "get_weather", "city": "Paris"}], run.report["tool_runs"]
    ends = notes["turn_ends"]
    assert len(ends) == 3, ends
    coverage = []
    for end in ends:
        start, stop = end + SETTLE_S, end + SETTLE_S + REPLY_WINDOW_S
        audio = sum(seconds for t, seconds in run.report["audio"] if start <= t < stop)
        coverage.append(round(audio / REPLY_WINDOW_S, 3))
    print(f"{run.report_name}: reply audio after each turn covers {coverage} of real time")
    assert all(c >= 0.8 for c in coverage), coverage
