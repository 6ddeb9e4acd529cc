"""PersonaPlex's prompts stepped again at a pause in a long call (``frontend.refresh_prompts: at_pause``).

On the tiny PersonaPlex checkpoint (context 100 frames, prompts P = 51 positions), greedy: a slot whose
prompts have begun to leave the window waits through its own speech and the caller's, refreshes at the
first pause of ``refresh_pause_s`` on both sides, and afterwards the ring KV cache's latest P positions
hold the prompt frames again: layer 0's values there (which depend on the input alone, no rotary position)
equal those session start wrote. The refresh's frames are silent and keep the cadence; refreshes are at
least ``context`` LM steps apart. With the setting off (the default) the slot never refreshes, and both
runs are step-identical until the refresh starts. The slot's text is steered through moshi's text-logits
hook (pad forced while the script wants it silent, banned while it talks): a random model's text is
never pad by itself.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kame.frontend.config import FrontendConfig
from kame.frontend.engine import EngineCore, SlotOutput
from kame.frontend.engine_thread import EngineThread, PromptRequest
from kame.frontend.models import FrontendModels, load_frontend
from kame.server.telemetry.metrics import ServerMetrics

CONTEXT = 100
PAUSE_FRAMES = 3
ACCELERATED = 40  #: prompt-only ticks run during the second refresh
VOICE, PERSONA = "NATF2", "Be kind and talk about the sea."


def _caches(lm: Any) -> list[Any]:
    """Each attention layer's ring KV cache, first layer first."""
    out = [state.kv_cache for m in lm.transformer.modules()
           if (state := getattr(m, "_streaming_state", None)) is not None and getattr(state, "kv_cache", None) is not None]
    assert out and all(c.capacity == CONTEXT for c in out)
    return out


def _written(lm: Any) -> int:
    offsets = {int(c.end_offset[0]) for c in _caches(lm)}
    assert len(offsets) == 1  # every layer slides alike
    return offsets.pop()


def _values(lm: Any, positions: range) -> torch.Tensor:
    """Layer 0's cached values at absolute ``positions`` (slot 0): a function of those steps' inputs only."""
    cache = _caches(lm)[0].cache  # [2, B, heads, capacity, dim]
    return cache[1, 0, :, [p % CONTEXT for p in positions], :].clone()


class Steer:
    """The slot's text through moshi's text-logits hook: pad while ``silent``, never pad while it talks."""

    def __init__(self, core: EngineCore, models: FrontendModels) -> None:
        self.inner = core.lm_gen.on_text_logits_hook
        self.pad = int(models.lm.text_padding_token_id)
        self.epad = int(models.lm.end_of_text_padding_id)
        self.silent = False
        core.lm_gen.on_text_logits_hook = self

    def __call__(self, logits: torch.Tensor) -> None:
        if self.inner is not None:
            self.inner(logits)
        if self.silent:
            logits[..., self.pad] = logits.max() + 10.0
        else:
            logits[..., self.pad] = float("-inf")
            logits[..., self.epad] = float("-inf")


def _script() -> list[tuple[bool, bool]]:
    """(caller speaks, slot speaks) a frame: both talk past the point the prompts start to leave (49 frames),
    then the caller is quiet while the slot talks, then the slot is silent while the caller talks, then a
    long pause on both sides."""
    return [(True, True)] * 80 + [(False, True)] * 10 + [(True, False)] * 10 + [(False, False)] * 120


def _run(ckpt: Path, mode: str, frames: int) -> dict[str, Any]:
    cfg = FrontendConfig(checkpoint=str(ckpt), dtype="float32", batch_size=1, refresh_prompts=mode,  # type: ignore[arg-type]
                         refresh_pause_s=PAUSE_FRAMES * 0.08)
    cfg.sampling.use_sampling = False
    models = load_frontend(cfg, torch.device("cpu"))
    core = EngineCore(models, cfg)
    steer = Steer(core, models)
    plan = models.prompt_plan(VOICE, PERSONA)
    assert plan is not None
    core.attach(0, plan)
    while core.prompting(0):
        core.prompt_tick()
    p = plan.total - 1  # moshi steps 0 .. total - 2 take no caller audio: the prompt's positions
    assert _written(models.lm) == p
    start_values = _values(models.lm, range(p))
    rng = np.random.default_rng(7)
    rows, refreshing, written_before = [], [], []
    refreshed_values, before_values = [], []
    for i, (caller, slot_talks) in enumerate(_script()[:frames]):
        steer.silent = not slot_talks
        frame = (0.2 * rng.standard_normal(1920)).astype(np.float32) if caller else np.zeros(1920, np.float32)
        written_before.append(_written(models.lm))
        out = core.tick({0: frame})[0]
        assert not out.prompting  # the session's frame, every frame: the cadence holds
        refreshing.append(out.refreshing)
        rows.append((out.text_id, out.audio_codes))
        if out.refreshing:
            assert out.text_id is None and out.audio_codes is None and not out.pcm.any()
        if out.refreshing and (i == 0 or not refreshing[i - 1]):  # a refresh's first step: the window before it
            end = written_before[i]
            before_values.append(_values(models.lm, range(end - p, end)))
            if len(before_values) == 2:  # the server's prompt-only ticks (no frame due) speed a refresh up
                for _ in range(ACCELERATED):
                    assert core.prompt_tick() == 1
        if i > 0 and refreshing[i - 1] and not out.refreshing:  # the first frame after a refresh
            end = written_before[i]
            refreshed_values.append((end, _values(models.lm, range(end - p, end))))
    core.close()
    return {"p": p, "start": start_values, "rows": rows, "refreshing": refreshing, "written": written_before,
            "refreshed": refreshed_values, "before": before_values, "count": core.prompt_refreshes}


def _starts(flags: list[bool]) -> list[int]:
    return [i for i, f in enumerate(flags) if f and (i == 0 or not flags[i - 1])]


def test_prompts_are_stepped_again_at_a_pause_once_a_window(tiny_personaplex_ckpt: Path) -> None:
    on = _run(tiny_personaplex_ckpt, "at_pause", 220)
    p = on["p"]
    starts = _starts(on["refreshing"])
    script = _script()
    # Not mid-speech: through 80 frames of talk (31 past the point the prompts begin to leave), the caller's
    # silence while the slot talks, the slot's while the caller talks; then the PAUSE_FRAMES-th frame of quiet.
    pause = script.index((False, False))
    assert starts[0] == pause + PAUSE_FRAMES, starts
    assert on["written"][starts[0]] - p >= CONTEXT - p  # the prompts had begun to leave the window
    # One refresh is P silent frames at the session's cadence (no prompt-only ticks here), and it ends.
    assert on["refreshing"][starts[0]: starts[0] + p] == [True] * p
    assert not on["refreshing"][starts[0] + p]
    # The ring's latest P positions hold the prompt frames again: layer 0's values as session start wrote them.
    end, values = on["refreshed"][0]
    assert end == on["written"][starts[0]] + p
    assert torch.allclose(values, on["start"], atol=1e-5), float((values - on["start"]).abs().max())
    # ... where the conversation's were just before it.
    assert not torch.allclose(on["before"][0], on["start"], atol=1e-3)
    # At most once a window, however long the pause: the next refresh comes CONTEXT LM steps after the first.
    assert len(starts) == 2 and on["count"] == 2
    assert on["written"][starts[1]] - on["written"][starts[0]] == CONTEXT
    # The second one, sped up by prompt-only ticks, takes P - ACCELERATED of the session's frames and leaves
    # the prompts at the latest positions all the same.
    assert on["refreshing"][starts[1]:] == [True] * (p - ACCELERATED) + [False] * (220 - starts[1] - p + ACCELERATED)
    end, values = on["refreshed"][1]
    assert end == on["written"][starts[1]] + p
    assert torch.allclose(values, on["start"], atol=1e-5)

    off = _run(tiny_personaplex_ckpt, "never", starts[0] + 20)
    assert not any(off["refreshing"]) and off["count"] == 0  # the default: moshi's sliding window
    assert off["rows"][: starts[0]] == on["rows"][: starts[0]]  # step-identical until the refresh acts
    assert off["rows"][starts[0]:] != on["rows"][starts[0]: starts[0] + 20]


def test_the_engine_thread_refreshes_between_frames_at_the_sessions_cadence(tiny_personaplex_ckpt: Path) -> None:
    """The server's path: frames fed at real time to an :class:`EngineThread`; the refresh runs in the
    ticks of the session's frames (each answered by one silent frame) and in prompt-only ticks between
    them, and Prometheus's count hears of it."""
    cfg = FrontendConfig(checkpoint=str(tiny_personaplex_ckpt), dtype="float32", batch_size=1,
                         refresh_prompts="at_pause", refresh_pause_s=PAUSE_FRAMES * 0.08)
    cfg.sampling.use_sampling = False
    models = load_frontend(cfg, torch.device("cpu"))
    core = EngineCore(models, cfg)
    Steer(core, models).silent = True  # the slot says nothing; the caller is quiet: the pause comes when due
    metrics = ServerMetrics()
    thread = EngineThread(core, on_tick=metrics.on_tick)
    outputs: queue.SimpleQueue[SlotOutput] = queue.SimpleQueue()
    errors: list[str] = []
    ready = threading.Event()
    thread.start()
    try:
        slot = thread.attach(outputs.put, errors.append, lambda _slot: ready.set(), PromptRequest(VOICE, PERSONA))
        assert ready.wait(10)
        seen: list[SlotOutput] = []
        fed = 0
        t0 = time.monotonic()
        while fed < 400:  # bound: ~32 s; ends at the first conversation frame after the refresh
            time.sleep(max(0.0, t0 + fed * 0.08 - time.monotonic()))
            thread.feed(slot, np.zeros(1920, np.float32))
            fed += 1
            while not outputs.empty():
                seen.append(outputs.get())
            kinds = ["r" if o.refreshing else "p" if o.prompting else "c" for o in seen]
            if "rc" in "".join(kinds):
                break
        deadline = time.monotonic() + 10
        while len(seen) < fed and time.monotonic() < deadline:  # the frames still in the engine
            seen.append(outputs.get(timeout=max(0.01, deadline - time.monotonic())))
    finally:
        thread.stop()
        core.close()
    assert errors == []
    assert len(seen) == fed  # one output a frame fed: the cadence holds through the refresh
    kinds = "".join("r" if o.refreshing else "p" if o.prompting else "c" for o in seen)
    first, last = kinds.index("r"), kinds.rindex("r")
    assert kinds[first: last + 1] == "r" * (last - first + 1)  # one refresh, its frames in a row
    assert kinds.count("c", 0, first) >= CONTEXT - 51  # not before the prompts begin to leave the window
    assert all(not seen[i].pcm.any() for i in range(first, last + 1))
    assert last - first + 1 <= 51  # at most P frames of the session's: prompt-only ticks may shorten it
    assert thread.prompt_ticks > 0
    assert "kame_prompt_refreshes_total 1.0" in metrics.render().decode()
