"""PersonaPlex's system prompts as per-slot state of the batched engine.

PersonaPlex conditions a session by stepping its LM through prompt frames
before the conversation (its ``LMGen.step_system_prompts``): the voice
prompt (saved input embeddings replayed through the transformer, then the
saved token cache put in place), ``silence_frames`` frames of silence (the
agent's audio forced to fixed silence tokens, the user's to fixed "sine"
tokens, the text to pad), one frame per role token (text forced), and the
silence again. Its LMGen forces a frame ``j``'s tokens into cache position
``j + delay`` and runs the transformer on position ``offset - 1``; with
moshi's LMGen (which reads position ``offset`` and writes what it samples at
``offset + 1``) the same model evaluations come out when, before moshi step
``m`` of a slot, position ``m`` is overwritten with the forced tokens of the
frame each row holds there (row ``k`` holds frame ``m - delay[k]``), and
the user's frame ``m`` is moshi step ``m``'s input. Two consequences, both
PersonaPlex's own behaviour: the user's audio reaches the LM one frame
after it arrived (PersonaPlex's first step only stores its input), and the
first reply frame is the one moshi step ``P - 1`` gives, after the last
prompt frame.

Each slot has its own plan and step counter, so a slot's prompt steps run
in the same batched ticks as other slots' conversations (and in extra
prompt-only ticks when the engine has time); PersonaPlex keeps the voice,
its cache and the role as LMGen attributes (one session at a time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kame.frontend.personaplex import PersonaPlexSpec
from kame.frontend.voices import SavedVoice


@dataclass(frozen=True)
class PromptPlan:
    """One session's prompt frames, indexed as PersonaPlex's frames ``0 .. total - 1``.

    Frames ``0 .. voice_frames - 1`` are the voice: replayed ``embeddings``
    (``[voice_frames - 1, dim]``) with ``saved_cache`` (``[codebooks, columns]``)
    after them, or forced frames (a wav voice). ``forced[i]`` is frame
    ``first_forced + i``: its text token and the agent's tokens.
    """

    voice: str | None
    voice_frames: int
    embeddings: torch.Tensor | None
    saved_cache: torch.Tensor | None
    first_forced: int
    forced: tuple[tuple[int, tuple[int, ...]], ...]
    sine_tokens: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.first_forced + len(self.forced)

    def forced_frame(self, j: int) -> tuple[int, tuple[int, ...]] | None:
        i = j - self.first_forced
        return self.forced[i] if 0 <= i < len(self.forced) else None


def build_plan(
    spec: PersonaPlexSpec,
    pad_id: int,
    role_ids: Sequence[int],
    voice: SavedVoice | None = None,
    *,
    voice_name: str | None = None,
    wav_codes: Sequence[Sequence[int]] | None = None,
) -> PromptPlan:
    """The frames of ``step_system_prompts``: voice, silence, ``role_ids`` (text forced), silence."""
    silent = (pad_id, tuple(spec.silence_tokens))
    forced: list[tuple[int, tuple[int, ...]]] = []
    if voice is not None:
        voice_frames, first = voice.frames, voice.frames
    elif wav_codes is not None:
        voice_frames, first = len(wav_codes), 0
        forced.extend((pad_id, tuple(int(c) for c in codes)) for codes in wav_codes)
    else:
        voice_frames, first = 0, 0
    forced.extend([silent] * spec.silence_frames)
    forced.extend((int(t), tuple(spec.silence_tokens)) for t in role_ids)
    forced.extend([silent] * spec.silence_frames)
    return PromptPlan(
        voice=voice_name if voice is None else voice.name,
        voice_frames=voice_frames,
        embeddings=None if voice is None else voice.embeddings,
        saved_cache=None if voice is None else voice.cache,
        first_forced=first,
        forced=tuple(forced),
        sine_tokens=tuple(spec.sine_tokens),
    )


@dataclass
class _SlotPrompt:
    plan: PromptPlan
    step: int = 0  # the slot's next moshi step (= its LMGen offset)
    #: the moshi step at which this pass of the prompts began: 0 at the session's start, later for a refresh
    #: (kame.frontend.prompt_refresh); the plan's frame ``j`` is then stepped at ``base + j``
    base: int = 0
    held: torch.Tensor | None = field(default=None)  # the user's codes that the next step consumes
    sine: torch.Tensor | None = field(default=None)  # the plan's sine tokens [agent, 1] on the device, made once

    @property
    def prompting(self) -> bool:
        """Still stepping prompt frames that take no user audio (moshi steps ``0 .. total - 2``)."""
        return self.step - self.base < self.plan.total - 1


class PromptSlots:
    """Per-slot PersonaPlex prompt state for an :class:`~kame.frontend.engine.EngineCore`.

    The engine calls, around each LM step: :meth:`lm_codes` (the input codes
    of its slots), :meth:`before_step` (cache writes and embedding
    overrides), :meth:`after_step`. Only the engine thread calls it.
    """

    def __init__(self, lm: Any, batch_size: int, device: torch.device) -> None:
        self.lm = lm
        self.batch_size = batch_size
        self.device = device
        self.delays = [int(d) for d in lm.delays]
        self.agent = int(lm.dep_q)
        self.slots: dict[int, _SlotPrompt] = {}
        dim = int(lm.dim)
        dtype = lm.dtype
        # Persistent buffers, updated in place: the hook stays valid inside moshi's CUDA graph.
        self._emb = torch.zeros(batch_size, 1, dim, dtype=dtype, device=device)
        self._emb_on = torch.zeros(batch_size, 1, 1, dtype=torch.bool, device=device)
        self._emb_host = torch.zeros(batch_size, dtype=torch.bool)
        self._hook = lm.transformer.register_forward_pre_hook(self._override, with_kwargs=True)

    def _override(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = args[0]
        return (torch.where(self._emb_on, self._emb.to(x.dtype), x), *args[1:]), kwargs

    def remove(self) -> None:
        self._hook.remove()

    # ---------------------------------------------------------------- slot lifecycle
    def start(self, slot: int, plan: PromptPlan) -> None:
        sine = torch.tensor(plan.sine_tokens, dtype=torch.long, device=self.device)[:, None]  # once a session, not a tick
        self.slots[slot] = _SlotPrompt(plan=plan, sine=sine)

    def restart(self, slot: int) -> None:
        """Step the slot's prompts again from its next step on, after its conversation (a refresh in a long
        call): the same frames as at its start, at the latest positions; its cache and offsets are kept."""
        state = self.slots[slot]
        self.slots[slot] = _SlotPrompt(plan=state.plan, step=state.step, base=state.step, sine=state.sine)

    def refreshing(self, slot: int) -> bool:
        """Stepping its prompts again, after a conversation (not the session's start)."""
        state = self.slots.get(slot)
        return state is not None and state.prompting and state.base > 0

    def clear(self, slot: int) -> None:
        self.slots.pop(slot, None)

    def owns(self, slot: int) -> bool:
        return slot in self.slots

    def prompting(self, slot: int) -> bool:
        state = self.slots.get(slot)
        return state is not None and state.prompting

    def prompting_slots(self) -> list[int]:
        return [s for s, st in self.slots.items() if st.prompting]

    # ---------------------------------------------------------------- around one LM step
    def lm_codes(self, codes: torch.Tensor, stepped: Sequence[int]) -> torch.Tensor:
        """The LM's input codes ``[B, 8, 1]``: a prompting slot's are the sine tokens; a PersonaPlex slot in
        conversation gets the codes of its previous frame (the sine tokens before the first) and keeps
        this frame's for the next step."""
        mine = [s for s in stepped if s in self.slots]
        if not mine:
            return codes
        out = codes[:, : self.agent].clone()
        for slot in mine:
            state = self.slots[slot]
            assert state.sine is not None
            sine = state.sine
            if state.prompting:
                out[slot] = sine
                continue
            fresh = out[slot].clone()
            out[slot] = sine if state.held is None else state.held
            state.held = fresh
        return out

    def before_step(self, cache: torch.Tensor, stepped: Sequence[int]) -> None:
        """Forced tokens into each stepped slot's read position; embedding overrides for the voice replay."""
        writes: list[tuple[int, int, int, int]] = []
        self._emb_host.zero_()
        for slot in stepped:
            state = self.slots.get(slot)
            if state is None:
                continue
            plan, m = state.plan, state.step - state.base  # m: the plan's step; state.step: the cache position
            if plan.embeddings is not None and 0 <= m < plan.voice_frames - 1:
                self._emb[slot, 0].copy_(plan.embeddings[m].to(self._emb.device, self._emb.dtype))
                self._emb_host[slot] = True
                continue
            for k in range(1 + self.agent):
                value = self._forced_value(plan, m, k)
                if value is not None:
                    writes.append((slot, k, state.step, value))
        self._emb_on.copy_(self._emb_host.view(-1, 1, 1).to(self.device, non_blocking=True))
        self._write(cache, None, writes)

    def _write(self, cache: torch.Tensor, out: torch.Tensor | None, writes: list[tuple[int, int, int, int]]) -> None:
        """``(slot, row, position, token)`` into the cache (column ``position % columns``) and, with ``out``,
        into that step's output row."""
        if not writes:
            return
        slots, rows, positions, values = (list(x) for x in zip(*writes))
        columns = [p % cache.shape[-1] for p in positions]
        # one host-to-device transfer for the whole tick's writes
        packed = torch.tensor([slots, rows, columns, values], dtype=torch.long).to(cache.device, non_blocking=True)
        slot_t, row_t, col_t = packed[0], packed[1], packed[2]
        val_t = packed[3].to(cache.dtype)
        cache.index_put_((slot_t, row_t, col_t), val_t)
        if out is not None:
            out.index_put_((slot_t, row_t, torch.zeros_like(slot_t)), val_t.to(out.dtype))

    def _forced_value(self, plan: PromptPlan, m: int, k: int) -> int | None:
        """The token row ``k`` (text or agent) must hold at position ``m``, or None (the model's own)."""
        j = m - self.delays[k]  # the frame whose token row k holds at position m
        if j < 0:
            return None
        if plan.saved_cache is not None and j < plan.voice_frames:
            # the voice's own frames: from its saved cache, for the positions still read after the replay
            if m >= plan.voice_frames - 1:
                return int(plan.saved_cache[k, m % plan.saved_cache.shape[-1]])
            return None
        frame = plan.forced_frame(j)
        if frame is None:
            return None
        text, agent = frame
        return text if k == 0 else agent[k - 1]

    def after_step(self, cache: torch.Tensor, out: torch.Tensor | None, stepped: Sequence[int]) -> None:
        """The step's own writes of forced tokens: a row whose delay puts its output beyond the read position
        (the agent's delayed codebooks) holds a forced token there in PersonaPlex, in the cache and in the
        output of this step, where moshi wrote what it sampled."""
        writes: list[tuple[int, int, int, int]] = []
        max_delay = max(self.delays)
        for slot in stepped:
            state = self.slots.get(slot)
            if state is None:
                continue
            m = state.step - state.base  # the plan's step
            state.step += 1
            if state.plan.embeddings is not None and 0 <= m < state.plan.voice_frames - 2:
                continue  # still replaying the voice: positions it reaches are overwritten from its cache
            for k in range(1 + self.agent):
                position = m + 1 - max_delay + self.delays[k]
                if position <= m:
                    continue
                value = self._forced_value(state.plan, position, k)
                if value is not None:
                    writes.append((slot, k, state.base + position, value))
        if out is not None:
            self._write(cache, out, writes)
        if bool(self._emb_host.any()):
            self._emb_host.zero_()
            self._emb_on.zero_()
