"""The batched streaming core: one Mimi + one LM stepping B independent slots.

Whoever holds an :class:`EngineCore` must call it from one thread only (the
server's :class:`~kame.frontend.engine_thread.EngineThread` owns it; the
offline runner and tests call it directly). Each :meth:`EngineCore.tick`
steps exactly the slots given a frame; the others are masked out with
moshi's exec mask and keep their streaming state untouched. The LMGen runs
with ``support_out_of_sync=True`` so resetting one slot never costs another
slot a frame; rows still inside the acoustic delay come back as -2 and are
turned into silence here, never decoded.

Moshi's first-frame rule holds per slot: right after a slot's first frame
is encoded, that slot's Mimi streaming state is reset (as moshi's and KAME's
servers do for a session), and the LM is still stepped with that frame.

Sampling in moshi is batch-wide (audio temperature and top-k, and the
default text ones). Per slot we honour the text temperature and text top-k
through the text-logits hook: logits are rescaled by
``temp_text / slot_temp`` and cut to the slot's top-k before moshi samples.
"""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kame.audio.media import FRAME_S
from kame.frontend.config import FrontendConfig
from kame.frontend.host_copy import HostCopy
from kame.frontend.models import FrontendModels
from kame.frontend.moshi_gate import (
    MoshiMode,
    first_line,
    gate_check_from_env,
    make_kernels_compilable,
    moshi_call,
    resolve_compile,
)
from kame.frontend.oracle_fifo import OracleFifo
from kame.frontend.oracle_input import OracleTextEmbedding, install_oracle_input
from kame.frontend.personaplex import install_full_depformer
from kame.frontend.prompt_refresh import PromptRefresh, frame_dbfs
from kame.frontend.prompts import PromptPlan, PromptSlots

if TYPE_CHECKING:
    from kame.asr.kyutai_core import SttCore, SttStep

log = logging.getLogger(__name__)

UNGENERATED = -2
MOSHI_SAMPLING_DEFAULTS = {"temp": 0.8, "temp_text": 0.7, "top_k": 250, "top_k_text": 25}


@dataclass(frozen=True)
class SlotOutput:
    """What one slot produced in one tick."""

    slot: int
    step: int  # index of this slot's step since it was attached (0-based)
    pcm: np.ndarray  # float32 [frame_size]; zeros while nothing is generated yet
    text_id: int | None  # sampled text token, None while inside the acoustic delay
    oracle_id: int  # the oracle token fed at this step
    audio_codes: tuple[int, ...] | None = None  # the LM's audio tokens (None while ungenerated)
    stt: SttStep | None = None  # when a shared Kyutai STT listens to this slot
    prompting: bool = False  # a PersonaPlex prompt step: the input frame was not heard, the output is silence
    #: a PersonaPlex slot stepping its prompts again mid-call (frontend.refresh_prompts): the output is silence and
    #: the input frame reached Mimi (and a shared STT) but not the LM; the session's frame all the same
    refreshing: bool = False


class EngineStepError(RuntimeError):
    """A model step failed; every slot stepped in that tick is affected."""

    def __init__(self, slots: list[int], cause: BaseException) -> None:
        super().__init__(f"engine step failed for slots {slots}: {cause.__class__.__name__}: {cause}")
        self.slots = slots
        self.cause = cause


@dataclass
class _SlotState:
    fifo: OracleFifo
    attached: bool = False
    steps: int = 0
    temp_text: float | None = None
    top_k_text: int | None = None


def resolve_sampling(cfg: FrontendConfig, lm_gen_config: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling kwargs for LMGen: config > checkpoint's lm_gen_config > moshi defaults."""
    out: dict[str, Any] = {}
    for key, default in MOSHI_SAMPLING_DEFAULTS.items():
        value = getattr(cfg.sampling, key)
        if value is None:
            value = lm_gen_config.get(key, default)
        out[key] = value
    out["use_sampling"] = cfg.sampling.use_sampling
    return out


def _streaming_children(root: Any) -> list[tuple[str, Any]]:
    """The (name, module) pairs moshi's ``StreamingModule._apply_named_streaming`` caches for ``root``:
    the streaming modules below it, pre-order, not entering those detached from their parent."""
    from moshi.modules.streaming import StreamingModule

    out: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        prefix, module = stack.pop()
        if isinstance(module, StreamingModule):
            if module._streaming_detached and prefix != "":
                continue
            out.append((prefix, module))
        children = [(f"{prefix}.{name}" if prefix else name, child) for name, child in module.named_children()]
        stack.extend(reversed(children))
    return out


class _ApplyToCachedChildren:
    """moshi's ``_apply_named_streaming`` of one module, over its children listed beforehand.

    moshi's own version defines, at every call, a recursive local function that
    refers to itself and to the module: garbage that holds the module (and so
    the model's weights) until the collector runs. This one makes none and
    holds its module weakly.
    """

    __slots__ = ("_module",)

    def __init__(self, module: Any) -> None:
        self._module = weakref.ref(module)

    def __call__(self, fn: Callable[[str, Any], None]) -> None:
        module = self._module()
        if module is not None:
            for name, child in module._cached_children:
                fn(name, child)


def prime_streaming_children(root: Any) -> None:
    """List every streaming module's streaming children under ``root`` once, and step them without
    moshi's self-referencing local function (see :class:`_ApplyToCachedChildren`)."""
    from moshi.modules.streaming import StreamingModule

    for module in root.modules():
        if isinstance(module, StreamingModule) and module._cached_children is None:
            module._cached_children = _streaming_children(module)
            object.__setattr__(module, "_apply_named_streaming", _ApplyToCachedChildren(module))


def end_streaming(root: Any) -> None:
    """Drop the streaming state of every streaming module under ``root`` (detached ones too: the LM under
    its LMGen, the depformer) and the lists of :func:`prime_streaming_children`: states hold graphed
    closures of their own module, and each list holds its own module, cycles both."""
    from moshi.modules.streaming import StreamingModule

    for module in root.modules():
        if isinstance(module, StreamingModule):
            module._streaming_state = None
            module._cached_children = None
            module.__dict__.pop("_apply_named_streaming", None)


def _weak_hook(method: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
    """``method`` through a weak reference: the LMGen that calls it must not keep its engine alive."""
    ref = weakref.WeakMethod(method)

    def hook(logits: torch.Tensor) -> None:
        bound = ref()
        if bound is not None:
            bound(logits)

    return hook


class EngineCore:
    """Mimi + LM in streaming mode for ``batch_size`` slots, plus their oracle FIFOs."""

    def __init__(
        self, models: FrontendModels, cfg: FrontendConfig, batch_size: int | None = None, *, stt: SttCore | None = None
    ) -> None:
        """``stt``: an optional :class:`~kame.asr.kyutai_core.SttCore` (``own_mimi=False``)
        stepped in the same tick with the same Mimi codes; Mimi must then encode
        32 codebooks (the LM uses the first 8)."""
        from moshi.models.lm import LMGen

        self.models = models
        self.cfg = cfg
        if models.device.type == "cpu" and cfg.cpu_threads is not None:
            torch.set_num_threads(cfg.cpu_threads)
        self.batch_size = int(batch_size or cfg.batch_size)
        self.device = models.device
        self.frame_size = models.frame_size
        self.idle_id = models.idle_id(cfg.oracle_idle)
        self.start_id = models.start_id
        self.sampling = resolve_sampling(cfg, models.files.lm_gen_config)
        self.oracle_input: OracleTextEmbedding = install_oracle_input(
            models.lm, models.oracle_weight, self.batch_size, self.idle_id
        )
        self.lm_gen = LMGen(
            models.lm,
            use_sampling=self.sampling["use_sampling"],
            temp=self.sampling["temp"],
            temp_text=self.sampling["temp_text"],
            top_k=self.sampling["top_k"],
            top_k_text=self.sampling["top_k_text"],
            support_out_of_sync=True,
            on_text_logits_hook=_weak_hook(self._text_logits_hook),
        )
        self.mode = MoshiMode(compile=resolve_compile(cfg.compile, self.device.type), cuda_graphs=cfg.cuda_graphs)
        models.mode = self.mode  # a wav voice's Mimi pass runs as the ticks do
        if gate_check_from_env():
            log.info("moshi gate check on (KAME_MOSHI_GATE_CHECK=1): a call into moshi outside the gate raises")
        if self.mode.compile:
            make_kernels_compilable()
        #: PersonaPlex checkpoints: each slot's system prompts (kame.frontend.prompts); None otherwise.
        self.prompts: PromptSlots | None = None
        if models.personaplex is not None:
            self.prompts = PromptSlots(models.lm, self.batch_size, self.device)
        #: PersonaPlex slots whose prompts are stepped again at a pause (frontend.refresh_prompts: at_pause)
        self.refresh: dict[int, PromptRefresh] = {}
        #: prompt refreshes started since the engine was built (kame.frontend.prompt_refresh)
        self.prompt_refreshes = 0
        self._silent_text = frozenset({int(models.lm.text_padding_token_id), int(models.lm.end_of_text_padding_id)})
        #: Slots fed only the idle oracle token (models.oracle_off_reason): the FIFO is kept but never read.
        self.oracle_off = models.oracle_off_reason is not None
        if models.depformer_steps > int(models.lm.dep_q):
            install_full_depformer(self.lm_gen, models.depformer_steps)
        self.stt = stt
        if stt is not None:
            stt.mode = self.mode  # stepped inside this engine's calls: one mode for both
        self._stt_mask = torch.zeros(self.batch_size, dtype=torch.bool)
        self._stt_silence: torch.Tensor | None = None
        self._stt_lag: dict[int, deque[torch.Tensor]] = {}  # slot -> STT input delayed by the silence prefix
        if stt is not None:
            if models.mimi.num_codebooks < 32:
                raise ValueError("a shared Kyutai STT needs Mimi with 32 codebooks (load_frontend(mimi_codebooks=32))")
            if stt.batch_size != self.batch_size:
                raise ValueError("the shared STT must have as many slots as the engine")
        self.slots = [_SlotState(fifo=OracleFifo(self.start_id, self.idle_id, cfg.oracle_fifo_size)) for _ in range(self.batch_size)]
        self._oracle_host = torch.full((self.batch_size,), self.idle_id, dtype=torch.long)
        self._mask_host = torch.zeros(self.batch_size, dtype=torch.bool)
        self._first_host = torch.zeros(self.batch_size, dtype=torch.bool)  # slots stepping their first frame
        self._prompt_host = torch.zeros(self.batch_size, dtype=torch.bool)  # slots stepping a prompt frame
        # slots stepping a refresh of their prompts with a caller's frame: Mimi (and a shared STT) still hear it
        self._listen_host = torch.zeros(self.batch_size, dtype=torch.bool)
        self._pcm_host = torch.zeros(self.batch_size, 1, self.frame_size, dtype=torch.float32)
        # LM steps of each slot since its reset (moshi's ``offsets``, kept on the host): a slot's output is
        # generated once they pass the acoustic delay, known without reading the tokens back
        self._lm_steps = torch.zeros(self.batch_size, dtype=torch.long)
        self._max_delay = int(self.lm_gen.max_delay)
        #: every device-to-host copy of a tick goes through it: one a tick
        self.host_copy = HostCopy(self.device)
        self._temp_scale = torch.ones(self.batch_size, 1, device=self.device)
        self._topk = torch.zeros(self.batch_size, dtype=torch.long)
        self._per_slot_sampling = False
        # Last exec masks given to Mimi and the LM: setting one walks every
        # streaming module, so it is only done when the mask changes.
        self._mimi_mask: torch.Tensor | None = None
        self._lm_mask: torch.Tensor | None = None
        self.ticks = 0
        self.log_step_errors = True  #: off while a warm-up handles a failure itself (compile fallback)
        try:  # the first model calls of a load (a shared STT's silence prefix through Mimi compiles first)
            self._stt_silence = None if stt is None else self._silence_codes(stt.silence_prefix_frames)
            self._start_streaming()
        except Exception as exc:
            if not self.mode.compile:
                raise
            self.fall_back_to_eager("load", exc)

    def _start_streaming(self) -> None:
        prime_streaming_children(self.lm_gen)
        prime_streaming_children(self.models.mimi)
        with self._compile_guard():
            self.models.mimi.streaming_forever(self.batch_size)
            self.lm_gen.streaming_forever(self.batch_size)

    def fall_back_to_eager(self, where: str, exc: BaseException) -> None:
        """Compiling failed at ``where`` (load, warm-up): one log line, then eager from a rebuilt streaming
        state (a step that failed half-way leaves offsets and caches of some modules advanced, and its
        CUDA graphs half captured): the LM, Mimi and a shared STT restart, every slot detached."""
        log.warning("torch.compile failed at %s, running eager: %s", where, first_line(exc))
        self.disable_compile()
        with self._compile_guard():
            for module in (self.lm_gen, self.mimi):
                end_streaming(module)
        if self.stt is not None:
            self.stt.restart_streaming()
            self._stt_silence = self._silence_codes(self.stt.silence_prefix_frames)  # before Mimi streams for B
        self._start_streaming()
        for slot, state in enumerate(self.slots):
            state.attached = False
            state.steps = 0
            state.fifo.clear()
            if self.prompts is not None:
                self.prompts.clear(slot)
        self.refresh.clear()
        self._mimi_mask = self._lm_mask = None
        self._lm_steps.zero_()
        self._stt_mask.zero_()
        self._stt_lag.clear()

    # ------------------------------------------------------------------ set-up helpers
    def _compile_guard(self) -> Any:
        """The context every model call runs in: alone in moshi, with this engine's :class:`MoshiMode`.

        ``frontend.compile`` decides whether moshi's kernels compile and
        ``frontend.cuda_graphs: false`` turns moshi's CUDA graphs off; both
        are process globals in moshi read at each call, so they are set
        around every call (see :mod:`kame.frontend.moshi_gate`). A method, not
        a closure kept on the engine: that would hold the engine in a cycle.
        """
        return moshi_call(self.mode)

    def disable_compile(self) -> None:
        """Run eager from now on (compiling failed); a shared STT follows."""
        self.mode = MoshiMode(compile=False, cuda_graphs=self.mode.cuda_graphs)
        self.models.mode = self.mode
        if self.stt is not None:
            self.stt.mode = self.mode

    @property
    def mimi(self) -> Any:
        return self.models.mimi

    def close(self) -> None:
        """End streaming on the LM, Mimi and a shared STT, so that the models can be freed at once.

        moshi's streaming state holds the CUDA-graphed bound methods of its own
        module (``LMGen.depformer_step``), and each streaming module lists
        itself among its cached streaming children: cycles that only a full
        garbage collection breaks, which ``torch.cuda.empty_cache()`` does not
        wait for. Dropping both breaks them; the engine is unusable afterwards.
        """
        with self._compile_guard():
            for module in (self.lm_gen, self.mimi, *((self.stt.gen, self.stt.mimi) if self.stt is not None else ())):
                if module is not None:
                    end_streaming(module)
        self._stt_lag.clear()
        for state in self.slots:
            state.attached = False

    # ------------------------------------------------------------------ slot lifecycle
    def attach(self, slot: int, prompt: PromptPlan | None = None) -> None:
        """Give ``slot`` to a new session: reset its Mimi and LM state and its FIFO only.

        ``prompt``: a PersonaPlex session's system prompts, stepped by the
        slot's next ticks (:meth:`prompting` says while) before it hears audio."""
        self._check_slot(slot)
        mask = torch.zeros(self.batch_size, dtype=torch.bool)
        mask[slot] = True
        mask_dev = mask.to(self.device)
        with self._compile_guard():
            self.mimi.reset_streaming(mask_dev)
            self.lm_gen.reset_streaming(mask_dev)
        self._mimi_mask = self._lm_mask = None  # reset re-enables the slot's exec mask
        self._lm_steps[slot] = 0
        self._stt_mask[slot] = False
        self._stt_lag.pop(slot, None)
        state = self.slots[slot]
        state.fifo.clear()
        state.attached = True
        state.steps = 0
        self.set_slot_sampling(slot, None, None)
        if self.prompts is not None:
            if prompt is None:
                prompt = self.models.prompt_plan(None, None)
            assert prompt is not None
            self.prompts.start(slot, prompt)
            self.refresh.pop(slot, None)
            if self.cfg.refresh_prompts == "at_pause":
                self.refresh[slot] = PromptRefresh(
                    context=int(self.models.lm.context), prompt_frames=prompt.total - 1,
                    pause_frames=max(1, round(self.cfg.refresh_pause_s / FRAME_S)),
                )
        elif prompt is not None:
            raise ValueError("this checkpoint takes no system prompts (not a PersonaPlex checkpoint)")

    def prompting(self, slot: int) -> bool:
        """The slot still steps its system prompts (its input frames are not heard yet)."""
        return self.prompts is not None and self.prompts.prompting(slot)

    def prompting_slots(self) -> list[int]:
        return [] if self.prompts is None else self.prompts.prompting_slots()

    def prompt_tick(self) -> int:
        """Step every slot still in its system prompts once, no other slot; returns how many stepped.

        Lets prompts run faster than real time when the engine has time between two ticks."""
        slots = [s for s in self.prompting_slots() if self.slots[s].attached]
        if slots:
            self.tick({s: None for s in slots})
        return len(slots)

    def detach(self, slot: int) -> None:
        self._check_slot(slot)
        state = self.slots[slot]
        state.attached = False
        state.fifo.clear()
        if self.prompts is not None:
            self.prompts.clear(slot)
        self.refresh.pop(slot, None)
        self._stt_mask[slot] = False
        self._stt_lag.pop(slot, None)
        self.set_slot_sampling(slot, None, None)

    def stt_attach(self, slot: int) -> None:
        """Start the shared STT on ``slot`` (after :meth:`attach`), silence prefix included.

        The prefix costs no tick: instead of stepping the STT ``prefix``
        extra times now (which would stall every other slot's frame), the
        slot's STT input is delayed by ``prefix`` frames through a FIFO that
        starts full of silence codes. Each tick then steps the STT once, as
        usual, and the session's audio reaches the STT after the silence,
        exactly as Kyutai feeds it.
        """
        if self.stt is None:
            raise RuntimeError("this engine has no shared STT")
        with self._compile_guard():
            self.stt.attach(slot)
        self._stt_mask[slot] = True
        self._stt_lag.pop(slot, None)
        if self._stt_silence is not None and self._stt_silence.shape[-1]:
            self._stt_lag[slot] = deque(self._stt_silence[0, :, i : i + 1].clone() for i in range(self._stt_silence.shape[-1]))

    @property
    def stt_lag_frames(self) -> int:
        """Frames by which a shared-STT slot's text lags its audio beyond the model's own delay."""
        return 0 if self._stt_silence is None else int(self._stt_silence.shape[-1])

    def _stt_codes(self, codes: torch.Tensor, stt_mask: torch.Tensor) -> torch.Tensor:
        """The codes each STT slot consumes this tick: its own, or ``stt_lag_frames`` older ones."""
        if not self._stt_lag:
            return codes
        feed = codes.clone()
        for slot, fifo in self._stt_lag.items():
            if bool(stt_mask[slot]):
                fifo.append(codes[slot, :, :].clone())
                feed[slot] = fifo.popleft()
        return feed

    def _silence_codes(self, frames: int) -> torch.Tensor:
        """Codes of ``frames`` frames of silence from a fresh Mimi (the STT's silence prefix)."""
        codes = []
        with self._compile_guard(), torch.no_grad(), self.mimi.streaming(1):
            for _ in range(frames):
                codes.append(self.mimi.encode(torch.zeros(1, 1, self.frame_size, device=self.device)))
        if not codes:
            return torch.zeros(1, self.mimi.num_codebooks, 0, dtype=torch.long, device=self.device)
        return torch.cat(codes, dim=-1)

    def attached_slots(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.attached]

    # ------------------------------------------------------------------ oracle
    def oracle_reset(self, slot: int, first_ids: list[int]) -> None:
        self._check_slot(slot)
        self.slots[slot].fifo.reset(first_ids)

    def oracle_push(self, slot: int, ids: list[int]) -> None:
        self._check_slot(slot)
        self.slots[slot].fifo.push(ids)

    def oracle_clear(self, slot: int) -> None:
        self._check_slot(slot)
        self.slots[slot].fifo.clear()

    # ------------------------------------------------------------------ sampling per slot
    def set_slot_sampling(self, slot: int, temp_text: float | None, top_k_text: int | None) -> None:
        """Per-slot text temperature / top-k (None = the engine-wide value)."""
        state = self.slots[slot]
        state.temp_text = temp_text
        state.top_k_text = top_k_text
        base_t = float(self.sampling["temp_text"])
        t = base_t if temp_text is None else float(temp_text)
        self._temp_scale[slot, 0] = 1.0 if t <= 0 or base_t <= 0 else base_t / t
        self._topk[slot] = 0 if top_k_text is None else int(top_k_text)
        self._per_slot_sampling = any(s.temp_text is not None or s.top_k_text is not None for s in self.slots)

    def _text_logits_hook(self, logits: torch.Tensor) -> None:
        """Apply per-slot text temperature and top-k in place, before moshi samples."""
        if not self._per_slot_sampling:
            return
        flat = logits.view(logits.shape[0], -1)
        flat.mul_(self._temp_scale.to(flat.dtype))
        ks = self._topk.tolist()
        for slot, k in enumerate(ks):
            if 0 < k < flat.shape[1]:
                row = flat[slot]
                kth = torch.topk(row, k).values[-1]
                row.masked_fill_(row < kth, float("-inf"))

    # ------------------------------------------------------------------ stepping
    def tick(self, frames: Mapping[int, np.ndarray | None]) -> dict[int, SlotOutput]:
        """Step every slot in ``frames`` (one ``frame_size`` float32 frame each) once.

        A slot still in its system prompts steps its next prompt frame instead
        and its input frame is dropped (None is allowed for such a slot only).

        Raises :class:`EngineStepError` if the model fails; the caller ends
        those slots. Slots not in ``frames`` are left exactly as they were.
        """
        if not frames:
            return {}
        stepped = sorted(frames)
        for slot in stepped:
            self._check_slot(slot)
            if not self.slots[slot].attached:
                raise ValueError(f"slot {slot} is not attached")
        self._mask_host.zero_()
        self._pcm_host.zero_()
        self._first_host.zero_()
        self._prompt_host.zero_()
        self._listen_host.zero_()
        quiet: dict[int, bool] = {}
        for slot in stepped:
            if self.prompting(slot):
                self._prompt_host[slot] = True
                self._mask_host[slot] = True
                self._oracle_host[slot] = self.idle_id
                frame = frames[slot]
                if frame is not None and self.prompts is not None and self.prompts.refreshing(slot):
                    self._listen(slot, frame)
                continue
            if frames[slot] is None:
                raise ValueError(f"slot {slot}: no frame")
            # A PersonaPlex slot keeps Mimi's state from its reset at attach (no first-frame reset).
            self._first_host[slot] = self.slots[slot].steps == 0 and not (self.prompts is not None and self.prompts.owns(slot))
            pcm = np.asarray(frames[slot], dtype=np.float32).reshape(-1)
            if pcm.shape[0] != self.frame_size:
                raise ValueError(f"slot {slot}: frame has {pcm.shape[0]} samples, expected {self.frame_size}")
            self._pcm_host[slot, 0].copy_(torch.from_numpy(pcm))
            if slot in self.refresh:
                rms = float(np.sqrt(np.mean(np.square(pcm, dtype=np.float64))))
                quiet[slot] = frame_dbfs(rms) < self.cfg.refresh_quiet_dbfs
            self._mask_host[slot] = True
            # A front-end not trained with KAME's oracle stream (PersonaPlex, plain Moshi) is fed the idle token.
            self._oracle_host[slot] = self.idle_id if self.oracle_off else self.slots[slot].fifo.pop()
        try:
            with self._compile_guard(), torch.no_grad():
                out_tokens, pcm_out, stt_out = self._model_step()
        except Exception as exc:  # noqa: BLE001 - report and keep the engine alive
            if self.log_step_errors:
                log.exception("engine step failed for slots %s", stepped)
            raise EngineStepError(stepped, exc) from exc
        self.ticks += 1
        results: dict[int, SlotOutput] = {}
        for slot in stepped:
            state = self.slots[slot]
            if bool(self._listen_host[slot]):  # a refresh of the prompts, mid-call: a silent frame at its cadence
                results[slot] = SlotOutput(slot=slot, step=state.steps, pcm=np.zeros(self.frame_size, np.float32),
                                           text_id=None, oracle_id=self.idle_id, stt=stt_out.get(slot), refreshing=True)
                state.steps += 1
                continue
            if bool(self._prompt_host[slot]):
                results[slot] = SlotOutput(slot=slot, step=state.steps, pcm=np.zeros(self.frame_size, np.float32),
                                           text_id=None, oracle_id=self.idle_id, prompting=True)
                continue
            text = int(out_tokens[slot, 0])
            generated = text != UNGENERATED and bool((out_tokens[slot, 1:] != UNGENERATED).all())
            pcm = pcm_out[slot] if generated and pcm_out is not None else np.zeros(self.frame_size, np.float32)
            results[slot] = SlotOutput(
                slot=slot,
                step=state.steps,
                pcm=pcm,
                text_id=text if text != UNGENERATED else None,
                oracle_id=int(self._oracle_host[slot]),
                audio_codes=tuple(int(x) for x in out_tokens[slot, 1:]) if generated else None,
                stt=stt_out.get(slot),
            )
            state.steps += 1
            if slot in quiet:
                self._maybe_refresh(slot, text, quiet[slot])
        return results

    def _listen(self, slot: int, frame: np.ndarray) -> None:
        """A caller's frame during a refresh of the slot's prompts: encoded (Mimi's stream and a shared STT go
        on), not given to the LM, which steps the prompts."""
        pcm = np.asarray(frame, dtype=np.float32).reshape(-1)
        if pcm.shape[0] != self.frame_size:
            raise ValueError(f"slot {slot}: frame has {pcm.shape[0]} samples, expected {self.frame_size}")
        self._pcm_host[slot, 0].copy_(torch.from_numpy(pcm))
        self._listen_host[slot] = True

    def _maybe_refresh(self, slot: int, text: int, caller_quiet: bool) -> None:
        """After a conversation frame: start stepping the prompts again when they are leaving the window and
        both sides pause (kame.frontend.prompt_refresh)."""
        agent_silent = text == UNGENERATED or text in self._silent_text
        if self.refresh[slot].observe(agent_silent, caller_quiet):
            assert self.prompts is not None
            self.prompts.restart(slot)
            self.prompt_refreshes += 1
            clock = self.refresh[slot]
            log.info("slot %d: prompts stepped again at a pause (refresh %d of the session, %d prompt steps: "
                     "at most %.1f s of the session's audio)", slot, clock.refreshes, clock.prompt_frames,
                     clock.prompt_frames * FRAME_S)

    def refreshing(self, slot: int) -> bool:
        """The slot steps its prompts again (a refresh in a long call): its output is silence meanwhile."""
        return self.prompts is not None and self.prompts.refreshing(slot)

    def _set_mimi_mask(self, mask: torch.Tensor) -> None:
        if self._mimi_mask is None or not torch.equal(self._mimi_mask, mask):
            self.mimi.set_exec_mask(mask.to(self.device))
            self._mimi_mask = mask.clone()

    def _set_lm_mask(self, mask: torch.Tensor) -> None:
        if self._lm_mask is None or not torch.equal(self._lm_mask, mask):
            self.lm_gen.set_exec_mask(mask.to(self.device))
            self._lm_mask = mask.clone()

    def _model_step(self) -> tuple[np.ndarray, np.ndarray | None, dict[int, Any]]:
        mask = self._mask_host
        heard = mask & ~self._prompt_host  # slots whose input frame is audio (not a prompt step)
        encoded = heard | self._listen_host  # a refresh's caller frames go through Mimi too (not to the LM)
        if bool(encoded.any()):
            self._set_mimi_mask(encoded)
            codes = self.mimi.encode(self._pcm_host.to(self.device, non_blocking=True))
        else:  # only prompt steps: nothing to encode (their LM input is set by the prompts)
            codes = torch.zeros(self.batch_size, self.mimi.num_codebooks, 1, dtype=torch.long, device=self.device)
        first = heard & self._first_host
        if bool(first.any()):
            # Moshi's rule (moshi's and KAME's servers): Mimi's streaming state is reset right
            # after encoding a session's first frame; the LM is still stepped with that frame.
            self.mimi.reset_streaming(first.to(self.device))
            self._mimi_mask = None  # the reset re-enabled those slots
        self.oracle_input.set_tokens(self._oracle_host.to(self.device, non_blocking=True))
        self._set_lm_mask(mask)
        lm_codes = codes
        if self.prompts is not None:
            stepped = [int(s) for s in torch.nonzero(mask).flatten().tolist()]
            lm_codes = self.prompts.lm_codes(codes, stepped)
            cache = self.lm_gen._streaming_state.cache
            self.prompts.before_step(cache, stepped)
            out = None
            try:
                out = self.lm_gen.step(lm_codes)
            finally:
                self.prompts.after_step(cache, out, stepped)
        else:
            out = self.lm_gen.step(lm_codes)  # moshi slices the 8 codebooks it needs
        assert out is not None  # support_out_of_sync: never None
        self._lm_steps += mask.long()  # moshi: offsets + 1 where the exec mask is set
        stt_dev: tuple[torch.Tensor, torch.Tensor | None] | None = None
        stt_mask = encoded & self._stt_mask
        if self.stt is not None and bool(stt_mask.any()):
            stt_dev = self.stt.step_device(self._stt_codes(codes, stt_mask), stt_mask)
        # moshi's rule (LMGen._step): a row is ungenerated while offsets <= max_delay or masked out
        generated = heard & (self._lm_steps > self._max_delay)
        has_pcm = bool(generated.any())
        parts = [out[:, :, 0]]
        if has_pcm:
            self._set_mimi_mask(generated)
            audio = out[:, 1:, :]
            audio = torch.where(audio == UNGENERATED, torch.zeros_like(audio), audio)
            parts.append(self.mimi.decode(audio)[:, 0, :])  # [B, frame]
        if stt_dev is not None:
            parts.append(stt_dev[0])
            if stt_dev[1] is not None:
                parts.append(stt_dev[1])
        host = self.host_copy.fetch(parts)  # the tick's one device-to-host copy
        tokens = host[0]
        pcm_np = host[1].numpy() if has_pcm else None
        stt_out: dict[int, Any] = {}
        if stt_dev is not None:
            assert self.stt is not None
            k = 2 if pcm_np is not None else 1
            stt_out = self.stt.host_steps(stt_mask, host[k], host[k + 1] if stt_dev[1] is not None else None)
        return tokens.numpy(), pcm_np, stt_out

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.batch_size:
            raise IndexError(f"slot {slot} out of range 0..{self.batch_size - 1}")
