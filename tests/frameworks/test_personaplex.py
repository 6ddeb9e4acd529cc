"""LiveKit's NVIDIA PersonaPlex realtime model (livekit-plugins-nvidia 1.8.9) against kame's ``/api/chat``, in
LiveKit's virtualenv: the plugin's ``voice_prompt``, ``text_prompt`` and ``seed`` are accepted, its persona
(``text_prompt``) is the back-end's instructions (before and after the reconnect a new persona causes), it
gets only the message kinds it knows (no warning, no error) and the reply audio comes at real time."""

from __future__ import annotations

from pathlib import Path

from scenario import llm, run_driver

from tests.support.llm_server import LlmServer
from tests.support.moshi_client import ServerProcess

PERSONA = "You are Captain Nemo, a terse submarine captain."
PERSONA_2 = "You are Ada, a cheerful librarian who loves puzzles."


def test_personaplex_plugin_on_api_chat(kame_server: ServerProcess, llm_backend: LlmServer, question_audio: Path,
                                        tmp_path: Path) -> None:
    llm_backend.reset()
    llm_backend.responder = llm
    run = run_driver("livekit", "drive_personaplex.py", kame_server, question_audio, tmp_path)
    chat = llm_backend.chat_requests()
    systems = [" ".join(str(m.get("content")) for m in r.body.get("messages", []) if m.get("role") == "system")
               for r in chat]
    assert run.errors == [], run.errors
    assert "timeout" not in run.report["notes"], run.report
    assert run.events.get("session_reconnected") == 1, run.events
    # the persona reached the back-end, and after update_instructions the new one did
    assert any(PERSONA in s for s in systems), systems
    assert any(PERSONA_2 in s for s in systems), systems
    first_2 = next(i for i, s in enumerate(systems) if PERSONA_2 in s)
    assert not any(PERSONA in s for s in systems[first_2:]), systems
    audio_s, rtf = run.reply_rtf()
    print(f"{run.report_name}: reply audio {audio_s:.1f} s at RTF {rtf:.3f}, {len(chat)} back-end requests")
    assert audio_s > 8.0 and rtf >= 0.98, (audio_s, rtf)
