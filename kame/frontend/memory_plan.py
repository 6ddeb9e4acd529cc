"""How many sessions fit on a card: the arithmetic of a memory plan (no torch).

A plan adds up what the server holds on its device: the weights of every model
it loads (front-end LM with its oracle table, Mimi, a Kyutai STT on the same
device) and, per engine slot, the streaming key/value caches of every
attention (moshi's ``RingKVCache``: keys and values of ``capacity`` steps, in
the attention's weight dtype). What it does not count -- the CUDA context,
cuBLAS workspaces, CUDA-graph pools, step activations, allocator
fragmentation, a second Mimi held for a moment while the STT's is loaded --
is kept free as the stated :class:`Headroom`. :mod:`kame.frontend.plan_models`
builds these figures from the models on the meta device; this module only
adds them up, so that the refusal a server prints is a pure function of them.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class AttentionCache:
    """One attention's streaming KV cache for one slot."""

    num_heads: int
    head_dim: int
    capacity: int  # steps kept: the context, or the depformer's steps per frame
    bytes_per_value: int

    @property
    def bytes_per_slot(self) -> int:
        return 2 * self.num_heads * self.capacity * self.head_dim * self.bytes_per_value


@dataclass(frozen=True)
class ModelFootprint:
    """One model on the device: its weights and its KV caches per slot."""

    name: str
    params: int
    weight_bytes: int
    kv_bytes_per_slot: int
    #: held only while loading (a LoRA file's tensors before they are fused), on top of ``weight_bytes``
    load_extra_bytes: int = 0


def kv_bytes_per_slot(caches: list[AttentionCache]) -> int:
    return sum(c.bytes_per_slot for c in caches)


@dataclass(frozen=True)
class Headroom:
    """What the plan keeps free beyond what it counts: a fixed amount (CUDA context, cuBLAS workspaces) plus a
    fraction of the counted bytes (step activations, CUDA-graph pools, allocator fragmentation grow with them).
    A fraction of what kame uses, not of the card: a card shared with an LLM server is planned the same way."""

    fixed_bytes: int = 2 * GIB
    fraction: float = 0.10

    def bytes_for(self, used_bytes: int) -> int:
        return self.fixed_bytes + int(self.fraction * used_bytes)

    def describe(self) -> str:
        return f"{self.fixed_bytes / GIB:.1f} GiB + {self.fraction:.0%}"


@dataclass(frozen=True)
class MemoryPlan:
    """The models of one configuration, and what a batch of slots of it needs."""

    models: tuple[ModelFootprint, ...]
    dtype: str
    headroom: Headroom = Headroom()
    #: "bf16" (the linear layers in ``dtype``) or "int8" (moshi's 8-bit linears: 1 byte a weight + a float32
    #: scale a row; embeddings, the oracle table, norms and the KV caches stay in ``dtype``)
    weights: str = "bf16"

    @property
    def params(self) -> int:
        return sum(m.params for m in self.models)

    @property
    def weight_bytes(self) -> int:
        return sum(m.weight_bytes for m in self.models)

    @property
    def load_bytes(self) -> int:
        """Weights plus what is held only while loading (the peak before any slot exists)."""
        return self.weight_bytes + max((m.load_extra_bytes for m in self.models), default=0)

    @property
    def kv_bytes_per_slot(self) -> int:
        return sum(m.kv_bytes_per_slot for m in self.models)

    def model(self, name: str) -> ModelFootprint:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def bytes_for(self, batch: int) -> int:
        """Weights and KV caches of ``batch`` slots (the load peak if larger), headroom not included."""
        return max(self.load_bytes, self.weight_bytes + batch * self.kv_bytes_per_slot)

    def needed_bytes(self, batch: int) -> int:
        """:meth:`bytes_for` plus the headroom: what must be free on the card."""
        used = self.bytes_for(batch)
        return used + self.headroom.bytes_for(used)

    def max_batch(self, available_bytes: int) -> int:
        """The largest batch whose :meth:`needed_bytes` fit ``available_bytes``; 0 if not even one does."""
        if self.needed_bytes(1) > available_bytes:
            return 0
        if self.kv_bytes_per_slot <= 0:
            return 1 << 30
        # needed(n) = fixed + (1 + fraction) * (weights + n * kv) once past the load peak: solve, then step
        # down past the rounding of int(fraction * used)
        room = (available_bytes - self.headroom.fixed_bytes) / (1 + self.headroom.fraction) - self.weight_bytes
        n = max(1, int(room // self.kv_bytes_per_slot) + 1)
        while n > 1 and self.needed_bytes(n) > available_bytes:
            n -= 1
        return n


def largest_batch(plan: MemoryPlan, free_bytes: int) -> int:
    """The largest ``frontend.batch_size`` that fits ``free_bytes``: what ``kame plan`` prints and the server's
    refusal names (one function, so they agree); 0 if not even one session fits."""
    from kame.frontend.config import MAX_BATCH_SIZE

    return min(plan.max_batch(free_bytes), MAX_BATCH_SIZE)


def refusal(plan: MemoryPlan, batch_size: int, free_bytes: int, total_bytes: int, device: str = "cuda") -> str | None:
    """The one line a server prints instead of loading a batch that cannot fit ``free_bytes``, else None."""
    fits = largest_batch(plan, free_bytes)
    if batch_size <= fits:
        return None
    kind = "int8 weights" if plan.weights == "int8" else "weights"
    what = (
        f"frontend.batch_size {batch_size} needs {plan.needed_bytes(batch_size) / GIB:.1f} GiB "
        f"({plan.weight_bytes / GIB:.1f} GiB {kind}, {plan.kv_bytes_per_slot / GIB:.3f} GiB KV cache a slot, "
        f"headroom {plan.headroom.describe()}), {free_bytes / GIB:.1f} GiB free of {total_bytes / GIB:.1f} GiB on {device}"
    )
    if fits == 0:
        return f"{what}: not even one session fits (use a larger GPU, or free this one)"
    return f"{what}: the largest batch that fits is {fits} (kame serve --max-sessions {fits})"
