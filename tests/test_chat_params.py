"""``/api/chat``'s parameters of PersonaPlex's clients (server/wires/moshi/params.py) and which clients get
kame's 0x04 / 0x05 messages (the wire). No server, no torch."""

from __future__ import annotations

import pytest

from kame.server.access.params import ParamError
from kame.server.runtime.end import SessionEnd
from kame.server.wires.moshi.params import MAX_TEXT_PROMPT_CHARS, ChatParams
from kame.server.wires.moshi.protocol import ServerInfo
from kame.server.wires.moshi.wire import MoshiWire
from kame.session.events import ToolsRefused
from kame.session.settings import SessionSettings

INFO = ServerInfo(text_temperature=0.7, text_topk=25, audio_temperature=0.8, audio_topk=250, lm_model_file="tiny:0",
                  instance_name="kame", version="kame test")
PERSONAPLEX = {"voice_prompt": "NATF2.pt", "text_prompt": "You are a pirate.", "seed": "42"}


def test_personaplex_url_the_persona_becomes_the_sessions_instructions() -> None:
    params = ChatParams.parse(PERSONAPLEX)
    assert params == ChatParams(text_prompt="You are a pirate.", seed=42, voice_prompt="NATF2.pt", kame_messages=False)
    settings = params.apply(SessionSettings(text_topk=10))
    assert settings.instructions == "You are a pirate." and settings.text_topk == 10
    notices = params.notices()
    assert len(notices) == 2 and "NATF2.pt" in notices[0] and notices[1].startswith("seed accepted")


def test_a_plain_moshi_url_keeps_kames_messages_and_the_servers_instructions() -> None:
    params = ChatParams.parse({"text_temperature": "0.7", "pad_mult": "0"})  # Kyutai's web client
    assert params == ChatParams() and params.kame_messages
    assert params.apply(SessionSettings()).instructions is None and params.notices() == []
    # an empty persona and PersonaPlex's "no seed" ask nothing, but still mark a PersonaPlex client
    quiet = ChatParams.parse({"text_prompt": " ", "voice_prompt": "", "seed": "-1"})
    assert quiet == ChatParams(kame_messages=False) and quiet.notices() == []
    assert ChatParams.parse({**PERSONAPLEX, "kame_messages": "1"}).kame_messages
    # PersonaPlex's own wrapping of the persona is its speech model's format, not the back-end's
    assert ChatParams.parse({"text_prompt": "<system> You are a pirate. <system>"}).text_prompt == "You are a pirate."
    assert not ChatParams.parse({"kame_messages": "0"}).kame_messages


@pytest.mark.parametrize(("query", "fragment"), [
    ({"seed": "lucky"}, "seed: expected an integer"),
    ({"seed": "-2"}, "seed: must be -1"),
    ({"voice_prompt": "../voices/NATF2.pt"}, "voice_prompt: a voice's file name"),
    ({"text_prompt": "x" * (MAX_TEXT_PROMPT_CHARS + 1)}, "text_prompt: at most"),
    ({"kame_messages": "maybe"}, "kame_messages: expected 0 or 1"),
])
def test_bad_values_are_refused_naming_the_parameter(query: dict[str, str], fragment: str) -> None:
    with pytest.raises(ParamError, match=fragment):
        ChatParams.parse(query)


def test_without_kame_messages_the_wire_sends_only_handshake_audio_and_text() -> None:
    end = SessionEnd("idle", 1000, "idle timeout")
    quiet = MoshiWire(server_info=INFO, kame_messages=False, notices=["a notice"])
    assert [o.data for o in quiet.opening(SessionSettings())] == [b"\x00"]
    assert quiet.expiring(30) == [] and quiet.draining(2) == [] and quiet.closing(end) == []
    assert quiet.event(ToolsRefused(backend="llm", reason="no tools")) == []
    talkative = MoshiWire(server_info=INFO, notices=["a notice"])
    kinds = [o.data[0] for o in talkative.opening(SessionSettings())]  # type: ignore[index]
    assert kinds == [0x00, 0x04, 0x05]
    assert [o.data for o in talkative.closing(end)] == [b"\x05idle timeout"]
