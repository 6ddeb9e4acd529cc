"""NVIDIA PersonaPlex checkpoints: what sets them apart from Moshi's, as facts kame needs.

PersonaPlex (``nvidia/personaplex-7b-v1``) is a Moshi fine-tune whose
sessions start with *system prompts* stepped through the LM: a voice prompt
(saved input embeddings plus a token cache, from ``voices.tgz``), half a
second of silence, the role text ``<system> ROLE <system>`` one token a
frame, and half a second of silence again (:mod:`kame.frontend.prompts`).

Its depformer has 16 steps (``dep_q`` 16): the agent's 8 codebooks and then
the user's 8, which PersonaPlex predicts and throws away (the user's tokens
come from the user's audio). moshi 0.2.13's ``LMGen`` would then expect no
user audio at all (it takes ``num_codebooks - dep_q - 1`` input codebooks),
so the model is built with 16 depformer steps (its weights load as they
are) and then told ``dep_q`` 8 for ``LMGen``; :func:`install_full_depformer`
runs all 16 steps each frame, so sampling draws from the random generator
exactly as PersonaPlex does (its seeded output depends on it).

PersonaPlex's own server reads none of ``config.json``: its loader always
builds the 7B layout with ``dep_q`` 16. A checkpoint is taken as PersonaPlex
when its ``config.json`` says ``"model_type": "personaplex"`` or it ships
voices (``voices.tgz`` or a ``voices/`` folder).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kame.errors import CheckpointError

MODEL_TYPE = "personaplex"
#: Depformer steps of a PersonaPlex checkpoint: the agent's 8 codebooks, then the user's 8.
DEPFORMER_STEPS = 16
#: Codebooks the LM generates for the agent (what LMGen and Mimi see).
AGENT_CODEBOOKS = 8
#: Frames of silence before and after the role text (half a second at 12.5 Hz, as PersonaPlex's server).
SILENCE_FRAMES = 6
#: PersonaPlex's fixed agent tokens for a silent frame and user tokens for its 440 Hz "sine" frame
#: (the real Mimi's codes; a checkpoint may give its own in ``config.json`` ``personaplex``).
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
#: The voice PersonaPlex's README uses in its first example; the default when the checkpoint has it.
PREFERRED_DEFAULT_VOICE = "NATF2"
VOICES_ARCHIVE = "voices.tgz"
VOICES_DIR = "voices"


def is_personaplex(raw_config: Mapping[str, Any] | None, has_voices: bool) -> bool:
    if raw_config is not None and str(raw_config.get("model_type", "")) == MODEL_TYPE:
        return True
    return has_voices


def personaplex_lm_kwargs(lm_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The LM keywords PersonaPlex's loader uses: moshi's 7B ones (or the checkpoint's), ``dep_q`` 16."""
    from moshi.models import loaders

    out = dict(loaders._lm_kwargs)
    out.update(dict(lm_kwargs or {}))
    out["dep_q"] = DEPFORMER_STEPS
    return out


def wrap_system_tags(text: str) -> str:
    """``<system> ROLE <system>``, as PersonaPlex's server wraps a role that lacks the tags."""
    cleaned = text.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


@dataclass(frozen=True)
class PersonaPlexSpec:
    """The fixed tokens of a checkpoint's prompt frames."""

    silence_tokens: tuple[int, ...] = SILENCE_TOKENS
    sine_tokens: tuple[int, ...] = SINE_TOKENS
    silence_frames: int = SILENCE_FRAMES

    @classmethod
    def from_config(cls, raw_config: Mapping[str, Any] | None, card: int) -> PersonaPlexSpec:
        """From ``config.json``'s optional ``personaplex`` object; every token must be below ``card``."""
        section = dict((raw_config or {}).get(MODEL_TYPE) or {})
        spec = cls(
            silence_tokens=_tokens(section.get("silence_tokens", SILENCE_TOKENS), "silence_tokens"),
            sine_tokens=_tokens(section.get("sine_tokens", SINE_TOKENS), "sine_tokens"),
            silence_frames=int(section.get("silence_frames", SILENCE_FRAMES)),
        )
        for name, toks in (("silence_tokens", spec.silence_tokens), ("sine_tokens", spec.sine_tokens)):
            if any(not 0 <= t < card for t in toks):
                raise CheckpointError(
                    f"PersonaPlex {name} {list(toks)} do not fit the LM's audio card {card} "
                    f"(give them in config.json as personaplex.{name})"
                )
        return spec

    def role_ids(self, tokenizer: Any, persona: str | None) -> list[int]:
        """The role's tokens, ``<system>``-wrapped; none for an empty role (PersonaPlex would fail on it)."""
        if persona is None or not persona.strip():
            return []
        return list(tokenizer.encode(wrap_system_tags(persona)))


def _tokens(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or len(value) != AGENT_CODEBOOKS:
        raise CheckpointError(f"PersonaPlex {name}: expected {AGENT_CODEBOOKS} integers, got {value!r}")
    return tuple(int(v) for v in value)


def install_full_depformer(lm_gen: Any, steps: int) -> None:
    """Make ``lm_gen`` run all ``steps`` depformer steps a frame and keep the first ``lm.dep_q``.

    Must be called before ``streaming_forever`` (moshi wraps ``depformer_step``
    in its CUDA graph then). The extra steps' tokens (PersonaPlex's guesses of
    the user's codebooks) are sampled and dropped, as in PersonaPlex; here each
    extra step is fed the previous sampled token, where PersonaPlex feeds the
    user's actual token: that changes only the dropped tokens, never the
    number of draws from the random generator, nor the agent's tokens.
    """
    import torch
    from moshi.utils.sampling import sample_token

    lm = lm_gen.lm_model
    keep = int(lm.dep_q)

    def depformer_step(text_token: torch.Tensor, transformer_out: torch.Tensor) -> torch.Tensor:
        (batch,) = text_token.shape
        prev = text_token
        tokens: list[torch.Tensor] = []
        with lm.depformer.streaming(batch):
            for cb_index in range(steps):
                logits = lm.forward_depformer(cb_index, prev[:, None, None], transformer_out)
                nxt = sample_token(logits.float(), lm_gen.use_sampling, lm_gen.temp, lm_gen.top_k)[:, 0, 0]
                tokens.append(nxt)
                prev = nxt
        return torch.stack(tokens[:keep], dim=1)

    lm_gen.depformer_step = depformer_step
