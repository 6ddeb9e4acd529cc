"""Kyutai STT as a batched streaming model: one LM stepping B session slots.

Kyutai's STT models run on the same ``moshi`` runtime as the front-end: an
``LMModel`` with ``dep_q=0`` and 32 input codebooks whose ``LMGen.step``
returns one text token per 80 ms frame from the first call. Like the
front-end engine, slots are attached (reset) and detached independently
and only the slots given a frame are stepped (exec mask,
``support_out_of_sync``). Decoding is greedy. Whoever holds an
:class:`SttCore` must call it from one thread only.

It can encode audio with its own 32-codebook Mimi (:meth:`SttCore.step_pcm`)
or take codes already computed by the front-end engine
(:meth:`SttCore.step_codes`), so that each frame is encoded once when both
models share a device.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kame.audio.media import FRAME_RATE, FRAME_SIZE
from kame.frontend.checkpoint import CheckpointFiles, resolve_checkpoint
from kame.frontend.loading import load_lm, load_mimi, load_tokenizer, resolve_dtype
from kame.frontend.moshi_gate import MoshiMode, make_kernels_compilable, moshi_call, resolve_compile
from kame.vocab import TextVocab

STT_CODEBOOKS = 32
#: The Kyutai STT whose config has the end-of-turn heads (4 heads, dim 6; head 2 > 0.5 = end of turn):
#: what Kyutai's own PyTorch script loads when it wants voice activity / turn ends.
EOT_MODEL = "kyutai/stt-1b-en_fr-candle"

log = logging.getLogger(__name__)


def silence_prefix_frames(seconds: float, frame_rate: float = FRAME_RATE) -> int:
    """Frames of silence fed before the audio: ``ceil(seconds * frame_rate)`` (1.0 s -> 13)."""
    return max(0, math.ceil(seconds * frame_rate - 1e-9))


@dataclass(frozen=True)
class SttStep:
    """One slot's output for one frame."""

    text_id: int
    end_prob: float | None  # probability that the user's turn ended (extra head), if the model has one


def stt_delays(files: CheckpointFiles) -> tuple[float, float]:
    """(text delay, silence prefix) in seconds, from the checkpoint's ``stt_config``."""
    cfg = files.stt_config or {}
    return float(cfg.get("audio_delay_seconds", 0.5)), float(cfg.get("audio_silence_prefix_seconds", 0.0))


class SttCore:
    """Kyutai STT LM (+ optionally its own Mimi) for ``batch_size`` slots."""

    def __init__(
        self,
        files: CheckpointFiles,
        device: torch.device,
        batch_size: int,
        *,
        dtype: str = "auto",
        own_mimi: bool = True,
        eot_head: int = 2,
        mode: MoshiMode | None = None,
    ) -> None:
        """``mode``: compile and CUDA graphs (``frontend.compile``, ``frontend.cuda_graphs``); default: compile on
        CUDA only, graphs on. An engine that steps this core sets :attr:`mode` to its own."""
        from moshi.models.lm import LMGen

        self.files = files
        self.device = device
        self.batch_size = batch_size
        loaded = load_lm(files, device, resolve_dtype(dtype, device))
        self.lm = loaded.lm
        if self.lm.dep_q != 0 or self.lm.n_q < STT_CODEBOOKS:
            raise ValueError(f"checkpoint {files.source}: not an STT model (dep_q={self.lm.dep_q}, n_q={self.lm.n_q})")
        self.tokenizer = load_tokenizer(files)
        self.vocab = TextVocab.from_model(self.lm, self.tokenizer)  #: its pad ids and word-start piece
        self.mimi = load_mimi(files, device, STT_CODEBOOKS) if own_mimi else None
        self.delay_s, self.silence_prefix_s = stt_delays(files)
        self.eot_head = eot_head if eot_head < len(self.lm.extra_heads) else None
        if self.eot_head is None:
            log.warning(
                "Kyutai STT %s has no end-of-turn heads (extra_heads): turn ends fall back to silence "
                "(asr.turn.end_silence_s); %s has them",
                files.source,
                EOT_MODEL,
            )
        self.gen = LMGen(self.lm, use_sampling=False, temp=0.0, temp_text=0.0, support_out_of_sync=True)
        self.mode = mode or MoshiMode(compile=resolve_compile("auto", device.type))
        if self.mode.compile:
            make_kernels_compilable()
        self._mask_host = torch.zeros(batch_size, dtype=torch.bool)
        self._mask: torch.Tensor | None = None
        self._mimi_mask: torch.Tensor | None = None
        with self._guard():
            if self.mimi is not None:
                self.mimi.streaming_forever(batch_size)
            self.gen.streaming_forever(batch_size)

    def restart_streaming(self) -> None:
        """A fresh streaming state for every slot (after a failed compile left a step half done); slots detached."""
        from kame.frontend.engine import end_streaming

        with self._guard():
            for module in (self.gen, self.mimi):
                if module is not None:
                    end_streaming(module)
            if self.mimi is not None:
                self.mimi.streaming_forever(self.batch_size)
            self.gen.streaming_forever(self.batch_size)
        self._mask = self._mimi_mask = None

    @classmethod
    def from_spec(
        cls, spec: str, device: torch.device, batch_size: int, *, cache_dir: str | Path | None = None, **kw: Any
    ) -> SttCore:
        """``spec``: a Hub id, a local directory or ``tiny:SEED`` (an STT-shaped tiny checkpoint)."""
        return cls(resolve_checkpoint(spec, cache_dir=cache_dir, stt=True), device, batch_size, **kw)

    @property
    def delay_frames(self) -> int:
        return round(self.delay_s * FRAME_RATE)

    @property
    def silence_prefix_frames(self) -> int:
        """``ceil(audio_silence_prefix_seconds * frame_rate)``, as Kyutai's own script counts it."""
        return silence_prefix_frames(self.silence_prefix_s)

    def piece_of(self, token_id: int) -> str:
        if 0 <= token_id < self.tokenizer.vocab_size():
            return str(self.tokenizer.id_to_piece(token_id))
        return ""

    def attach(self, slot: int) -> None:
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        mask[slot] = True
        with self._guard():
            if self.mimi is not None:
                self.mimi.reset_streaming(mask.to(self.device))
                self._mimi_mask = None
            self.gen.reset_streaming(mask.to(self.device))
        self._mask = None

    def step_pcm(self, frames: Mapping[int, np.ndarray]) -> dict[int, SttStep]:
        """Encode with the STT's own Mimi, then step."""
        assert self.mimi is not None, "this SttCore shares the front-end's Mimi: use step_codes"
        pcm = torch.zeros(self.batch_size, 1, FRAME_SIZE)
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        for slot, frame in frames.items():
            pcm[slot, 0] = torch.from_numpy(np.asarray(frame, dtype=np.float32).reshape(-1))
            mask[slot] = True
        with self._guard(), torch.no_grad():
            if self._mimi_mask is None or not torch.equal(self._mimi_mask, mask):
                self.mimi.set_exec_mask(mask.to(self.device))
                self._mimi_mask = mask.clone()
            codes = self.mimi.encode(pcm.to(self.device))
        return self.step_codes(codes, mask)

    def step_codes(self, codes: torch.Tensor, mask: torch.Tensor) -> dict[int, SttStep]:
        """Step the slots set in ``mask`` (bool [B]) with Mimi codes [B, >=32, 1]."""
        text, end = self.step_device(codes, mask)
        return self.host_steps(mask, text.cpu(), None if end is None else end.cpu())

    def step_device(self, codes: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`step_codes` without reading anything back: the text tokens [B] and end-of-turn probabilities [B]
        (None without the head) on the device, for the caller's one copy of a tick (:meth:`host_steps`)."""
        if codes.shape[1] < STT_CODEBOOKS:
            raise ValueError(f"Kyutai STT needs {STT_CODEBOOKS} codebooks, got {codes.shape[1]}")
        mask = mask.to("cpu")
        with self._guard(), torch.no_grad():
            if self._mask is None or not torch.equal(self._mask, mask):
                self.gen.set_exec_mask(mask.to(self.device))
                self._mask = mask.clone()
            if self.eot_head is not None:
                res = self.gen.step_with_extra_heads(codes[:, :STT_CODEBOOKS])
                assert res is not None
                tokens, heads = res
                end: torch.Tensor | None = heads[self.eot_head][:, 0, 0].float()
            else:
                tokens = self.gen.step(codes[:, :STT_CODEBOOKS])
                assert tokens is not None
                end = None
        return tokens[:, 0, 0], end

    @staticmethod
    def host_steps(mask: torch.Tensor, text: torch.Tensor, end: torch.Tensor | None) -> dict[int, SttStep]:
        """The per-slot steps of :meth:`step_device`'s outputs, once they are on the host."""
        ids = text.tolist()
        ends = None if end is None else end.tolist()
        out: dict[int, SttStep] = {}
        for slot in torch.nonzero(mask.to("cpu")).flatten().tolist():
            out[slot] = SttStep(text_id=int(ids[slot]), end_prob=None if ends is None else float(ends[slot]))
        return out

    def _guard(self) -> Any:
        """Every model call: alone in moshi, with this core's compile and CUDA-graph mode."""
        return moshi_call(self.mode)
