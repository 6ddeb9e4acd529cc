"""A reference for PersonaPlex sessions, for parity tests: NOT kame's engine, and no code of NVIDIA's.

NVIDIA's PersonaPlex code (github NVIDIA/personaplex, ``moshi/moshi/models/lm.py``
``step_system_prompts`` and ``server.py`` ``handle_chat``) cannot be vendored,
so this module restates its algorithm, for ONE session, directly on moshi's
``LMGen`` (batch 1), written apart from ``kame.frontend.prompts`` and with
another mechanism: PersonaPlex's LMGen writes a frame's forced tokens at
``position + delay`` and keeps them ("provided"); here moshi's own hooks
overwrite, in place, the text token and audio tokens that moshi writes at
``offset + 1`` (``on_text_hook``, ``on_audio_hook``) with the token
PersonaPlex holds at that position, and the voice's embeddings replace the
transformer's input through a forward pre-hook.

What it restates:

* the embedding-saving path (``save_voice``): a wav's Mimi codes forced as
  the agent's audio, the text as pad, the user as the fixed sine tokens;
  the transformer input of every step saved (PersonaPlex saves none for
  its first frame, which only stores its input), and the token cache at the
  end in PersonaPlex's layout (``[1, codebooks, max_delay + 3]``, column =
  position modulo 4);
* a session (``session``): seed, reset, the voice's embeddings replayed and
  its cache in place, 6 silent frames, one frame per token of
  ``<system> ROLE <system>``, 6 silent frames, then each user frame encoded
  by Mimi (no reset after the first) and the LM stepped with the PREVIOUS
  frame's codes (PersonaPlex's first step only stores its input), every
  output decoded;
* its 16-step depformer (the user's 8 codebooks sampled and dropped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

PAD = 3
SILENT_FRAMES = 6


@dataclass
class RefFrame:
    text: int
    codes: tuple[int, ...]
    pcm: np.ndarray


class PersonaPlexReference:
    """Loads a tiny PersonaPlex-layout checkpoint with moshi's own loaders and runs one session at a time."""

    def __init__(self, directory: Path, *, use_sampling: bool = True) -> None:
        import sentencepiece
        from moshi.models import loaders
        from moshi.models.lm import LMGen

        self.directory = Path(directory)
        config = json.loads((self.directory / "config.json").read_text())
        lm_keys = {k: v for k, v in config.items() if k not in (
            "moshi_name", "mimi_name", "mimi_config_name", "tokenizer_name", "model_type", "lm_gen_config", "personaplex")}
        names = {"moshi_name": loaders.MOSHI_NAME, "mimi_name": loaders.MIMI_NAME,
                 "tokenizer_name": loaders.TEXT_TOKENIZER_NAME}
        names.update({k: config[k] for k in names if k in config})
        self.lm = loaders.get_moshi_lm(str(self.directory / names["moshi_name"]), lm_kwargs=lm_keys, device="cpu",
                                       dtype=torch.float32)
        self.lm.eval()
        self.depformer_steps = int(self.lm.dep_q)  # 16, as the checkpoint asks
        self.lm.dep_q = 8  # what LMGen must see: 8 generated codebooks, 8 user codebooks as input
        mimi_cfg = json.loads((self.directory / config["mimi_config_name"]).read_text())
        self.mimi = loaders.get_mimi(str(self.directory / names["mimi_name"]), mimi_cfg, device="cpu", num_codebooks=8)
        self.tokenizer = sentencepiece.SentencePieceProcessor(str(self.directory / names["tokenizer_name"]))
        section = config["personaplex"]
        self.silence = [int(t) for t in section["silence_tokens"]]
        self.sine = [int(t) for t in section["sine_tokens"]]
        self.delays = [int(d) for d in self.lm.delays]
        gen = dict(config.get("lm_gen_config") or {})
        self.lm_gen = LMGen(self.lm, use_sampling=use_sampling, temp=gen.get("temp", 0.8),
                            temp_text=gen.get("temp_text", 0.7), top_k=gen.get("top_k", 250),
                            top_k_text=gen.get("top_k_text", 25), on_text_hook=self._on_text,
                            on_audio_hook=self._on_audio)
        self.lm_gen.depformer_step = self._depformer  # before streaming: moshi wraps it then
        self.frame_size = int(self.mimi.sample_rate / self.mimi.frame_rate)
        self._embedding: torch.Tensor | None = None
        self._captured: list[torch.Tensor] = []
        self._capture = False
        self.lm.transformer.register_forward_pre_hook(self._transformer_input, with_kwargs=True)
        self._writes: dict[int, int] = {}  # row -> token to write at offset + 1 in the step now running
        self.mimi.streaming_forever(1)
        self.lm_gen.streaming_forever(1)

    # ------------------------------------------------------------ hooks
    def _transformer_input(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = args[0]
        if self._capture:
            self._captured.append(x.detach().clone())
        if self._embedding is not None:
            x = self._embedding.view(1, 1, -1).to(x.dtype)
        return (x, *args[1:]), kwargs

    def _on_text(self, text_token: torch.Tensor) -> None:
        if 0 in self._writes:
            text_token[0] = self._writes[0]

    def _on_audio(self, audio_tokens: torch.Tensor) -> None:
        for row, value in self._writes.items():
            if row >= 1:
                audio_tokens[0, row - 1] = value

    def _depformer(self, text_token: torch.Tensor, transformer_out: torch.Tensor) -> torch.Tensor:
        from moshi.utils.sampling import sample_token

        lm, gen = self.lm, self.lm_gen
        prev = text_token
        out = []
        with lm.depformer.streaming(1):
            for cb in range(self.depformer_steps):
                logits = lm.forward_depformer(cb, prev[:, None, None], transformer_out)
                tok = sample_token(logits.float(), gen.use_sampling, gen.temp, gen.top_k)[:, 0, 0]
                out.append(tok)
                prev = tok
        return torch.stack(out[:8], dim=1)

    # ------------------------------------------------------------ PersonaPlex's positions
    def _held(self, frames: dict[int, tuple[int, list[int]]], saved: torch.Tensor | None, voice_frames: int,
              position: int, row: int) -> int | None:
        """The token PersonaPlex keeps at ``position`` in ``row`` (text or agent), or None (sampled)."""
        frame = position - self.delays[row]
        if frame < 0:
            return None
        if saved is not None and frame < voice_frames:
            return int(saved[0, row, position % saved.shape[-1]]) if position >= voice_frames - 1 else None
        if frame not in frames:
            return None
        text, agent = frames[frame]
        return text if row == 0 else agent[row - 1]

    def _step(self, codes: list[int] | torch.Tensor, writes: dict[int, int]) -> torch.Tensor | None:
        self._writes = writes
        tensor = codes if isinstance(codes, torch.Tensor) else torch.tensor(codes, dtype=torch.long).view(1, 8, 1)
        try:
            return self.lm_gen.step(tensor)
        finally:
            self._writes = {}

    def _writes_for(self, frames: dict[int, tuple[int, list[int]]], saved: torch.Tensor | None, voice_frames: int,
                    step: int) -> dict[int, int]:
        out = {}
        for row in range(9):
            value = self._held(frames, saved, voice_frames, step + 1, row)
            if value is not None:
                out[row] = value
        return out

    # ------------------------------------------------------------ the embedding-saving path
    def save_voice(self, pcm: np.ndarray, path: Path) -> None:
        """PersonaPlex's ``save_voice_prompt_embeddings`` path for a 24 kHz wav, written to ``path``."""
        codes = self._encode(np.asarray(pcm, np.float32).reshape(-1))
        n = len(codes)
        self.lm_gen.reset_streaming()
        with torch.no_grad():
            frames = {j: (PAD, codes[j]) for j in range(n)}
            self._captured = []
            self._capture = True
            try:
                for step in range(n - 1):  # PersonaPlex's calls 1 .. n-1; its call 0 runs no model
                    self._step(self.sine, self._writes_for(frames, None, 0, step))
            finally:
                self._capture = False
        embeddings = torch.stack(self._captured, dim=0)  # [n - 1, 1, 1, dim]
        torch.save({"embeddings": embeddings, "cache": self._personaplex_cache(codes)}, str(path))

    def _encode(self, pcm: np.ndarray) -> list[list[int]]:
        """A wav's Mimi codes from a fresh streaming state, the last frame padded with zeros."""
        n = -(-pcm.size // self.frame_size)
        padded = np.zeros(n * self.frame_size, np.float32)
        padded[: pcm.size] = pcm
        self.mimi.reset_streaming()
        with torch.no_grad():
            return [self.mimi.encode(torch.from_numpy(padded[i * self.frame_size:(i + 1) * self.frame_size])[None, None])
                    [0, :, 0].tolist() for i in range(n)]

    def _personaplex_cache(self, codes: list[list[int]]) -> torch.Tensor:
        """PersonaPlex's token cache after a voice prompt of ``codes``: every token it keeps is forced, so the
        cache follows from its writes (frame c's tokens at ``c + delay``, initial tokens where ``c <= delay``)."""
        rows = len(self.delays)
        columns = max(self.delays) + 3
        cache = torch.full((1, rows, columns), -2, dtype=torch.long)
        initial = [int(self.lm.text_initial_token_id)] + [int(self.lm.initial_token_id)] * (rows - 1)
        for c, frame in enumerate(codes):
            for row in range(rows):
                value = PAD if row == 0 else frame[row - 1] if row <= 8 else self.sine[row - 9]
                cache[0, row, (c + self.delays[row]) % columns] = value
            for row in range(rows):
                if c <= self.delays[row] or c == 0:
                    cache[0, row, c % columns] = initial[row]
        return cache

    # ------------------------------------------------------------ a session
    def session(self, voice_path: Path, role: str, seed: int | None, user_pcm: np.ndarray) -> list[RefFrame]:
        if seed is not None:
            torch.manual_seed(seed)
        self.mimi.reset_streaming()
        self.lm_gen.reset_streaming()
        frames: dict[int, tuple[int, list[int]]] = {}
        if voice_path.suffix == ".wav":  # PersonaPlex's wav path: the voice's Mimi codes forced, frame by frame
            import sphn

            pcm, _ = sphn.read(str(voice_path))  # 24 kHz mono here
            codes = self._encode(np.asarray(pcm, np.float32).reshape(-1))
            embeddings, cache = None, None
            voice_frames = len(codes)
            frames.update({j: (PAD, c) for j, c in enumerate(codes)})
        else:
            saved = torch.load(str(voice_path), weights_only=True)
            embeddings = saved["embeddings"]
            cache = saved["cache"]
            voice_frames = embeddings.shape[0] + 1
        role_ids = self.tokenizer.encode(f"<system> {role.strip()} <system>") if role.strip() else []
        forced: list[tuple[int, list[int]]] = [(PAD, self.silence)] * SILENT_FRAMES
        forced += [(int(t), self.silence) for t in role_ids]
        forced += [(PAD, self.silence)] * SILENT_FRAMES
        frames.update({voice_frames + i: f for i, f in enumerate(forced)})
        total = voice_frames + len(forced)
        out: list[RefFrame] = []
        with torch.no_grad():
            for step in range(voice_frames - 1 if embeddings is not None else 0):  # a saved voice: replayed
                self._embedding = embeddings[step].reshape(-1)
                try:
                    self._step(self.sine, self._writes_for(frames, cache, voice_frames, step))
                finally:
                    self._embedding = None
            for step in range(voice_frames - 1 if embeddings is not None else 0, total - 1):  # (voice,) silence, role, silence
                self._step(self.sine, self._writes_for(frames, cache, voice_frames, step))
            self.mimi.reset_streaming()
            held = torch.tensor(self.sine, dtype=torch.long).view(1, 8, 1)
            user = np.asarray(user_pcm, np.float32).reshape(-1)
            for i in range(user.size // self.frame_size):
                step = total - 1 + i
                chunk = torch.from_numpy(user[i * self.frame_size:(i + 1) * self.frame_size].copy())[None, None]
                fresh = self.mimi.encode(chunk)
                tokens = self._step(held, self._writes_for(frames, cache, voice_frames, step))
                held = fresh
                assert tokens is not None
                pcm = self.mimi.decode(tokens[:, 1:9])
                out.append(RefFrame(text=int(tokens[0, 0, 0]), codes=tuple(int(c) for c in tokens[0, 1:9, 0]),
                                    pcm=pcm[0, 0].numpy().copy()))
        return out
