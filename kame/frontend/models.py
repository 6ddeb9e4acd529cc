"""Everything the front-end needs from a checkpoint, loaded once."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from kame.errors import CheckpointError
from kame.frontend.checkpoint import CheckpointFiles, default_cache_dir, resolve_checkpoint, resolve_lora_file
from kame.frontend.config import FrontendConfig
from kame.frontend.loading import (
    lm_num_codebooks,
    load_lm,
    load_mimi,
    load_tokenizer,
    resolve_dtype,
)
from kame.frontend.moshi_gate import MoshiMode, moshi_call
from kame.frontend.personaplex import DEPFORMER_STEPS, PersonaPlexSpec
from kame.frontend.prompts import PromptPlan, build_plan
from kame.frontend.voices import SavedVoice, UnknownVoice, VoiceCatalog, WavVoice, unpack_voices
from kame.vocab import TextVocab


@dataclass
class FrontendModels:
    """Mimi, the LM (oracle input not yet installed), its oracle table and the tokenizer."""

    files: CheckpointFiles
    device: torch.device
    lm: Any
    mimi: Any
    tokenizer: Any
    oracle_weight: torch.Tensor
    has_oracle: bool
    #: PersonaPlex checkpoints only: their prompt tokens and voices (None otherwise).
    personaplex: PersonaPlexSpec | None = None
    voices: VoiceCatalog | None = None
    #: Depformer steps run a frame (PersonaPlex: 16, of which the agent's 8 are kept).
    depformer_steps: int = 0
    #: The LM's linear weights: "int8" (moshi's 8-bit layers: a q8 checkpoint or frontend.weights int8) or "bf16".
    weights: str = "bf16"
    #: how moshi runs for these models (the engine sets its own: a wav voice's Mimi pass runs like its ticks)
    mode: MoshiMode = MoshiMode()
    _wav_mimi: Any = None
    _wav_codes_cache: dict[str, list[list[int]]] = field(default_factory=dict)

    @cached_property
    def vocab(self) -> TextVocab:
        """Pad and end-of-padding ids and the word-start symbol of this checkpoint's LM and tokenizer."""
        return TextVocab.from_model(self.lm, self.tokenizer)

    @property
    def start_id(self) -> int:
        return int(self.lm.text_initial_token_id)

    def idle_id(self, policy: str = "auto") -> int:
        """pad (3) for KAME weights, -1 (exact vanilla Moshi) for plain Moshi ones."""
        if policy == "pad":
            return int(self.lm.text_padding_token_id)
        if policy == "zero":
            return -1
        return int(self.lm.text_padding_token_id) if self.has_oracle else -1

    @property
    def oracle_off_reason(self) -> str | None:
        """Why this checkpoint's slots are fed only the idle oracle token (None: the oracle is on). A front-end
        that was not trained with KAME's oracle stream runs as it was released, whatever the back-end answers."""
        if self.personaplex is not None:
            return "PersonaPlex was not trained with KAME's oracle stream"
        if not self.has_oracle:
            return "the checkpoint has no oracle table (a plain Moshi front-end)"
        return None

    @property
    def frame_size(self) -> int:
        return int(self.mimi.sample_rate / self.mimi.frame_rate)

    @property
    def sample_rate(self) -> int:
        return int(self.mimi.sample_rate)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def voice_names(self) -> list[str]:
        return [] if self.voices is None else self.voices.names

    def prompt_plan(self, voice: str | None, persona: str | None) -> PromptPlan | None:
        """A PersonaPlex session's prompt frames (None on other checkpoints). ``voice`` None = the default;
        an unknown one raises :class:`~kame.frontend.voices.UnknownVoice`. Loads the voice on first use."""
        if self.personaplex is None:
            return None
        name = None if self.voices is None else self.voices.resolve(voice)
        if voice and name is None:
            raise UnknownVoice(voice, [])
        role = self.personaplex.role_ids(self.tokenizer, persona)
        pad = int(self.lm.text_padding_token_id)
        if name is None:
            return build_plan(self.personaplex, pad, role)
        assert self.voices is not None
        loaded = self.voices.load(name)
        if isinstance(loaded, SavedVoice):
            return build_plan(self.personaplex, pad, role, loaded)
        return build_plan(self.personaplex, pad, role, voice_name=name, wav_codes=self._wav_codes(loaded))

    def encode_wav_voices(self) -> int:
        """Every wav voice's Mimi codes computed now (the warm-up does it, so no session runs that Mimi pass in
        the engine thread), then the Mimi they needed freed; returns how many were encoded."""
        if self.voices is None:
            return 0
        names = self.voices.wav_names
        for name in names:
            loaded = self.voices.load(name)
            assert isinstance(loaded, WavVoice)
            self._wav_codes(loaded)
        self._wav_mimi = None
        return len(names)

    def _wav_codes(self, voice: WavVoice) -> list[list[int]]:
        """A wav voice's Mimi codes (computed once a voice), frame by frame from a fresh streaming state (a Mimi
        of its own: the engine's is streaming for its slots), the last frame padded with zeros, as
        PersonaPlex encodes it."""
        cached = self._wav_codes_cache.get(voice.name)
        if cached is None:
            cached = self._wav_codes_cache[voice.name] = self._encode_wav(voice)
        return cached

    def _encode_wav(self, voice: WavVoice) -> list[list[int]]:
        import numpy as np

        from kame.frontend.loading import load_mimi

        pcm = np.asarray(voice.pcm, np.float32).reshape(-1)
        n = -(-pcm.size // self.frame_size)
        padded = np.zeros(n * self.frame_size, np.float32)
        padded[: pcm.size] = pcm
        frames = torch.from_numpy(padded).view(n, 1, 1, self.frame_size).to(self.device)
        got = []
        # inside the process-wide moshi gate, with the engine's mode: the engine thread is inside moshi too
        with moshi_call(self.mode), torch.no_grad():
            if self._wav_mimi is None:
                self._wav_mimi = load_mimi(self.files, self.device, lm_num_codebooks(self.files))
            with self._wav_mimi.streaming(1):
                for i in range(n):
                    got.append(self._wav_mimi.encode(frames[i])[0, :, 0])
        return [[int(c) for c in row] for row in torch.stack(got).cpu().tolist()]


def runnable_mismatch(
    *, dep_q: int, n_q: int, card: int, text_card: int, mimi_cardinality: int, mimi_codebooks: int, tokenizer_pieces: int
) -> str | None:
    """Why an LM, Mimi and tokenizer that loaded cannot drive the engine together (None: they can). Each would
    otherwise fail at the first step or in the middle of a session (an index out of range)."""
    if dep_q <= 0:
        return "its LM generates no audio (dep_q 0: a speech-to-text model?); the front-end needs a Moshi-type LM"
    if card != mimi_cardinality:
        return f"the LM's audio tokens have {card} values but Mimi's codebooks {mimi_cardinality} entries"
    if max(dep_q, n_q - dep_q) > mimi_codebooks:
        return f"the LM reads {max(dep_q, n_q - dep_q)} audio codebooks but Mimi has {mimi_codebooks}"
    if tokenizer_pieces > text_card:
        return (f"the tokenizer has {tokenizer_pieces} pieces but the LM's text (and oracle) table {text_card} rows: "
                f"an oracle answer's tokens would be out of range")
    return None


def check_runnable(files: CheckpointFiles, lm: Any, mimi: Any, tokenizer: Any) -> None:
    """:func:`runnable_mismatch` for loaded models: one sentence naming the checkpoint and the mismatch."""
    why = runnable_mismatch(
        dep_q=int(lm.dep_q), n_q=int(lm.n_q), card=int(lm.card), text_card=int(lm.text_card),
        mimi_cardinality=int(mimi.cardinality), mimi_codebooks=int(mimi.total_codebooks),
        tokenizer_pieces=int(tokenizer.vocab_size()),
    )
    if why is not None:
        raise CheckpointError(f"checkpoint {files.source}: the engine cannot run it: {why}")


def load_frontend(
    cfg: FrontendConfig,
    device: torch.device,
    *,
    mimi_codebooks: int | None = None,
    cache_dir: str | Path | None = None,
) -> FrontendModels:
    """Resolve ``cfg.checkpoint`` (``tiny:SEED`` in ``cache_dir``, local dir or Hub id) and load its three parts."""
    files = resolve_checkpoint(cfg.checkpoint, cfg.revision, cache_dir=cache_dir)
    dtype = resolve_dtype(cfg.dtype, device)
    lora = resolve_lora_file(cfg.lora_weights) if cfg.lora_weights else None
    loaded = load_lm(files, device, dtype, lora_weights=lora, fuse_lora=cfg.fuse_lora, weights=cfg.weights)
    mimi = load_mimi(files, device, mimi_codebooks or lm_num_codebooks(files))
    tokenizer = load_tokenizer(files)
    check_runnable(files, loaded.lm, mimi, tokenizer)
    spec: PersonaPlexSpec | None = None
    voices: VoiceCatalog | None = None
    if files.personaplex:
        spec = PersonaPlexSpec.from_config(files.raw_config, int(loaded.lm.card))
        folder = files.voices
        if folder is not None and folder.is_file():
            folder = unpack_voices(folder, Path(cache_dir) if cache_dir is not None else default_cache_dir())
        voices = VoiceCatalog(folder, cfg.voice)
    return FrontendModels(
        files=files,
        device=device,
        lm=loaded.lm,
        mimi=mimi,
        tokenizer=tokenizer,
        oracle_weight=loaded.oracle_weight,
        has_oracle=loaded.has_oracle,
        personaplex=spec,
        voices=voices,
        depformer_steps=DEPFORMER_STEPS if files.personaplex else int(loaded.lm.dep_q),
        weights=loaded.weights,
    )
