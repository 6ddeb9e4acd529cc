"""Past the context: kame's engine and moshi's own ``LMGen`` agree at every step of a call 4 times the
model's context long (the tiny checkpoint's context is 100 frames: 8 s).

Both keep a ring KV cache of ``context`` entries while absolute positions count on (Mimi likewise), so a
call of any length goes on the way moshi's does. The reference is moshi's batched API as documented
(``LMGen(support_out_of_sync=True)``, ``reset_streaming(mask)`` for a new session, ``set_exec_mask`` for
the slots that do not step, Mimi reset after a session's first frame as moshi's server does), driven on
the same schedule: batch 2, slot 1 joining 37 frames late and reset (a new session on it) midway, greedy
and seeded sampling. At batch 2 the reference must be batch 2 too: batched float sums differ from batch
1's in the last bits, and on this tiny random model that flipped a greedy choice of one session at its
step 139 against a batch-1 LMGen (the same engine matches a batch-2 LMGen). Here, not in the main suite:
over a minute of CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.engine_frames import frames, make_core

CONTEXT = 100  # the tiny checkpoint's LM context (frames)
UNGENERATED = -2
Row = tuple[int, tuple[int, ...] | None]
#: tick -> {slot: (frame, starts a session)}
Schedule = list[dict[int, tuple[np.ndarray, bool]]]


def schedule() -> Schedule:
    """Slot 0: one session of 4.6 contexts; slot 1: joins at 37, a 100-frame session, then at once a new one
    of 3.2 contexts (the reset midway)."""
    late, first = 37, 100
    fa = frames(late + first + 320, seed=31)
    fb = frames(len(fa) - late, seed=32)
    ticks: Schedule = []
    for i, f in enumerate(fa):
        tick = {0: (f, i == 0)}
        if i >= late:
            tick[1] = (fb[i - late], i in (late, late + first))
        ticks.append(tick)
    return ticks


def kame_rows(ckpt: Path, ticks: Schedule, *, greedy: bool, seed: int) -> list[list[Row]]:
    """Per tick, per slot in it, what kame's engine gave."""
    core = make_core(ckpt, 2, greedy=greedy)
    torch.manual_seed(seed)
    out: list[list[Row]] = []
    for tick in ticks:
        for slot, (_, starts) in tick.items():
            if starts:
                if slot in core.attached_slots():
                    core.detach(slot)
                core.attach(slot)
        got = core.tick({slot: f for slot, (f, _) in tick.items()})
        out.append([(o.text_id if o.text_id is not None else UNGENERATED, o.audio_codes)
                    for o in (got[slot] for slot in tick)])
    return out


def lmgen_rows(ckpt: Path, ticks: Schedule, *, greedy: bool, seed: int) -> list[list[Row]]:
    """Per tick, per slot in it, what moshi's batched LMGen + Mimi give on the same schedule."""
    from moshi.models import loaders
    from moshi.models.lm import LMGen
    from moshi.utils.compile import no_compile

    info = loaders.CheckpointInfo.from_hf_repo(
        "local/unused", moshi_weights=ckpt / "model.safetensors", mimi_weights=ckpt / "mimi.safetensors",
        tokenizer=ckpt / "tokenizer.model", config_path=ckpt / "config.json",
        mimi_config_path=ckpt / "mimi_config.json")
    lm = info.get_moshi(device="cpu", dtype=torch.float32)
    mimi = info.get_mimi("cpu")
    gen = LMGen(lm, use_sampling=not greedy, support_out_of_sync=True, **info.lm_gen_config)
    torch.manual_seed(seed)
    out: list[list[Row]] = []
    with no_compile(), torch.no_grad():
        mimi.streaming_forever(2)
        gen.streaming_forever(2)
        for tick in ticks:
            active = torch.tensor([s in tick for s in range(2)])
            starts = torch.tensor([s in tick and tick[s][1] for s in range(2)])
            if starts.any():
                mimi.reset_streaming(starts)
                gen.reset_streaming(starts)
            pcm = torch.zeros(2, 1, 1920)
            for slot, (f, _) in tick.items():
                pcm[slot, 0] = torch.from_numpy(f)
            mimi.set_exec_mask(active)
            codes = mimi.encode(pcm)
            if starts.any():
                mimi.reset_streaming(starts)  # moshi's server: Mimi reset after a session's first frame
            gen.set_exec_mask(active)
            tokens = gen.step(codes)
            assert tokens is not None
            row: list[Row] = []
            for slot in tick:
                t = tokens[slot, :, 0].tolist()
                row.append((t[0], tuple(t[1:]) if all(c != UNGENERATED for c in t) else None))
            out.append(row)
    return out


def test_checkpoint_context_is_what_this_test_assumes(tiny_moshi_ckpt: Path) -> None:
    assert json.loads((tiny_moshi_ckpt / "config.json").read_text())["context"] == CONTEXT


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
def test_batch2_staggered_reset_past_context_identical_to_lmgen(tiny_moshi_ckpt: Path, greedy: bool) -> None:
    ticks = schedule()
    ours = kame_rows(tiny_moshi_ckpt, ticks, greedy=greedy, seed=7)
    ref = lmgen_rows(tiny_moshi_ckpt, ticks, greedy=greedy, seed=7)
    assert len(ours) == len(ref) == len(ticks) > 4 * CONTEXT
    first_diff = next((k for k, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    assert first_diff is None, f"tick {first_diff}: kame {ours[first_diff]} != LMGen {ref[first_diff]}"
    # not a trivial agreement: both slots generated audio all along and said different things late in the call
    generated = [sum(1 for row in ours if len(row) > s and row[s][1] is not None) for s in (0, 1)]
    assert generated[0] >= len(ticks) - 2 and generated[1] >= len(ticks) - 37 - 4
    assert len({row[0] for row in ours[-CONTEXT:]}) > 10
