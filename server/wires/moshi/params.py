"""The ``/api/chat`` query parameters of Moshi-protocol clients beyond the sampling options. No I/O.

NVIDIA's PersonaPlex server (a Moshi fork) and clients written for it, such as
LiveKit's NVIDIA plugin, open ``/api/chat?voice_prompt=NATF2.pt&text_prompt=...&seed=...``.
There ``text_prompt`` is the speech model's own system prompt; with KAME
weights its meaningful home is the back-end's instructions (the session's
``instructions``). ``voice_prompt`` names one of PersonaPlex's voices, which a
Moshi/KAME checkpoint does not have; ``seed`` seeds PersonaPlex's one-session
sampler, while kame samples every slot of the engine in one batch with one
generator. Both are accepted, each with one notice.

Those clients know only the 0x00, 0x01 and 0x02 message kinds (LiveKit's
plugin logs ``Unknown PersonaPlex message type`` for any other), so kame's
extra server messages (the 0x04 server info, the 0x05 notices and close
reasons) go only to clients that understand them: by default every client
except one that sends ``voice_prompt`` or ``text_prompt``; ``kame_messages=0``
/ ``1`` chooses explicitly. docs/protocol.md section 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from kame.server.access.params import ParamError
from kame.session.settings import SessionSettings

#: Longest ``text_prompt`` (the same bound as ``/v1/realtime``'s ``session.instructions``).
MAX_TEXT_PROMPT_CHARS = 20_000
#: Longest ``voice_prompt`` name.
MAX_VOICE_PROMPT_CHARS = 256
#: How PersonaPlex's speech model marks its system prompt (both ends).
SYSTEM_TAG = "<system>"
#: PersonaPlex's ``seed`` value for "no seed".
NO_SEED = -1


@dataclass(frozen=True)
class ChatParams:
    """What the URL of one ``/api/chat`` session asks beyond :class:`~kame.server.access.params.QueryParams`."""

    #: The session's instructions for the back-end (None: the server's ``oracle.instructions``).
    text_prompt: str | None = None
    #: A sampling seed (None: none asked, or PersonaPlex's ``-1``).
    seed: int | None = None
    #: A voice's name as PersonaPlex clients send it (``NATF2.pt``); the name only, never a path.
    voice_prompt: str | None = None
    #: The client gets kame's 0x04 server info and 0x05 notices.
    kame_messages: bool = True
    #: ``kame_resume=1``: the client gets resume handles as 0x04 JSON messages (server/runtime/resume.py).
    kame_resume: bool = False

    #: The query parameters read here (not reported as ignored); ``resume`` carries a handle back.
    known: ClassVar[frozenset[str]] = frozenset({"text_prompt", "seed", "voice_prompt", "kame_messages", "kame_resume",
                                                 "resume"})

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> ChatParams:
        """Validate the query string, or raise :class:`ParamError` naming the parameter."""
        text = query.get("text_prompt")
        if text is not None and len(text) > MAX_TEXT_PROMPT_CHARS:
            raise ParamError(f"query parameter text_prompt: at most {MAX_TEXT_PROMPT_CHARS} characters")
        voice = query.get("voice_prompt")
        if voice is not None:
            if len(voice) > MAX_VOICE_PROMPT_CHARS:
                raise ParamError(f"query parameter voice_prompt: at most {MAX_VOICE_PROMPT_CHARS} characters")
            if "/" in voice or "\\" in voice or voice in (".", ".."):
                raise ParamError("query parameter voice_prompt: a voice's file name, not a path")
        seed = _seed(query.get("seed"))
        persona_client = "voice_prompt" in query or "text_prompt" in query
        raw = (query.get("kame_messages") or "").strip().lower()
        if raw not in ("", "0", "1", "true", "false"):
            raise ParamError("query parameter kame_messages: expected 0 or 1")
        messages = (raw in ("1", "true")) if raw else not persona_client
        resume = (query.get("kame_resume") or "").strip().lower()
        if resume not in ("", "0", "1", "true", "false"):
            raise ParamError("query parameter kame_resume: expected 0 or 1")
        persona = _without_system_tags(text) if text is not None else ""
        return cls(
            text_prompt=persona or None,
            seed=seed,
            voice_prompt=voice or None,
            kame_messages=messages,
            kame_resume=resume in ("1", "true"),
        )

    def apply(self, settings: SessionSettings) -> SessionSettings:
        """The session's settings with the text prompt as its instructions."""
        return replace(settings, instructions=self.text_prompt) if self.text_prompt is not None else settings

    def notices(self, has_voices: bool = False) -> list[str]:
        """One line per parameter accepted without effect (sent as 0x05 where the client gets kame's messages).

        ``has_voices``: the checkpoint has voices (PersonaPlex), so ``voice_prompt`` chooses one (an unknown
        name's notice comes from the voice catalogue, which also picks the default instead)."""
        out: list[str] = []
        if self.voice_prompt is not None and not has_voices:
            out.append(f"voice_prompt {self.voice_prompt[:64]!r} accepted, not applied: this checkpoint has no voice "
                       "prompts, Moshi speaks in its own voice")
        if self.seed is not None:
            out.append("seed accepted, not applied: the engine samples every session in one batch with one generator, "
                       "so a session cannot have a seed of its own")
        return out


def _without_system_tags(text: str) -> str:
    """A persona without the ``<system> ... <system>`` wrapping of PersonaPlex's speech model (its server adds it
    when missing, so a client may send it either way); the back-end reads plain instructions."""
    cleaned = text.strip()
    if cleaned.startswith(SYSTEM_TAG) and cleaned.endswith(SYSTEM_TAG) and len(cleaned) >= 2 * len(SYSTEM_TAG):
        cleaned = cleaned[len(SYSTEM_TAG):-len(SYSTEM_TAG)].strip()
    return cleaned


def _seed(raw: str | None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ParamError("query parameter seed: expected an integer") from None
    if not -1 <= value < 2**63:
        raise ParamError("query parameter seed: must be -1 (none) or an integer from 0 to 2**63-1")
    return None if value == NO_SEED else value
