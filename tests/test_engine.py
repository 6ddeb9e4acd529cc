"""The batched engine: oracle input, FIFO semantics, slot isolation, vanilla equivalence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kame.frontend.config import FrontendConfig
from kame.frontend.engine import EngineCore
from kame.frontend.models import load_frontend
from kame.frontend.oracle_fifo import OracleFifo
from tests.support.engine_frames import frames, make_core

N_STEPS = 16


# --------------------------------------------------------------------------- FIFO


def test_fifo_reset_queues_start_with_first_word_and_bounds() -> None:
    f = OracleFifo(start_id=200, idle_id=3, capacity=8)
    assert f.pop() == 3
    with pytest.raises(ValueError):
        f.reset([])
    f.reset([10, 11])
    f.push([12])
    assert [f.pop() for _ in range(5)] == [200, 10, 11, 12, 3]
    f.reset([20])
    f.push(list(range(30, 40)))  # 2 + 10 > 8: 4 dropped and counted
    assert len(f) == 8 and f.dropped == 4
    f.reset([50])  # mid-sequence reset: the old tail is gone
    assert [f.pop() for _ in range(3)] == [200, 50, 3]


# --------------------------------------------------------------------------- oracle input


def test_oracle_buffer_storage_is_persistent(tiny_kame_ckpt: Path) -> None:
    core = make_core(tiny_kame_ckpt, 2)
    ptr = core.oracle_input.tokens.data_ptr()
    core.attach(0)
    core.attach(1)
    core.oracle_reset(0, [10, 11, 12])
    for i, f in enumerate(frames(6)):
        core.tick({0: f, 1: f} if i % 2 else {0: f})
        assert core.oracle_input.tokens.data_ptr() == ptr
    assert core.models.lm.dtype == torch.float32  # text table still the first parameter


def test_oracle_tokens_fed_in_order_one_per_step(tiny_kame_ckpt: Path) -> None:
    core = make_core(tiny_kame_ckpt, 2)
    core.attach(0)
    core.attach(1)
    fs = frames(10)
    core.tick({0: fs[0], 1: fs[0]})
    core.oracle_reset(0, [10, 11, 12])
    fed = []
    for i in range(1, 4):  # slot 0 does not step at i == 2: its token waits, not skipped
        step = {1: fs[i]} if i == 2 else {0: fs[i], 1: fs[i]}
        out = core.tick(step)
        if 0 in out:
            fed.append(out[0].oracle_id)
    core.oracle_push(0, [13])
    for i in range(4, 8):
        fed.append(core.tick({0: fs[i]})[0].oracle_id)
    assert fed == [core.start_id, 10, 11, 12, 13, 3]
    assert core.start_id == core.models.lm.text_initial_token_id


def test_oracle_changes_output(tiny_kame_ckpt: Path) -> None:
    def run(with_oracle: bool) -> list[int | None]:
        core = make_core(tiny_kame_ckpt, 1)
        torch.manual_seed(0)
        core.attach(0)
        texts = []
        for i, f in enumerate(frames()):
            if with_oracle and i == 2:
                core.oracle_reset(0, core.models.encode_text("The capital of France is Paris."))
            texts.append(core.tick({0: f})[0].text_id)
        return texts

    assert run(False) == run(False)
    assert run(True) != run(False)


# --------------------------------------------------------------------------- isolation


def _slot1_trace(core: EngineCore, disturb: bool) -> list[tuple[int | None, bytes]]:
    torch.manual_seed(7)
    core.attach(0)
    core.attach(1)
    out = []
    fs0, fs1 = frames(seed=1), frames(seed=2)
    for i in range(N_STEPS):
        if disturb and i == 3:
            core.oracle_reset(0, [10, 11, 12, 13])
        if disturb and i == 6:
            core.attach(0)  # a new session takes slot 0 mid-stream
        if disturb and i == 9:
            core.oracle_clear(0)
        step = {0: fs0[i], 1: fs1[i]} if not (disturb and i in (7, 8)) else {1: fs1[i]}
        o = core.tick(step)[1]
        out.append((o.text_id, o.pcm.tobytes()))
    return out


def test_slot_isolation_greedy(tiny_kame_ckpt: Path) -> None:
    """Oracle, reset and attach in slot 0 leave slot 1 bit-identical."""
    calm = _slot1_trace(make_core(tiny_kame_ckpt, 2, greedy=True), disturb=False)
    busy = _slot1_trace(make_core(tiny_kame_ckpt, 2, greedy=True), disturb=True)
    assert [t for t, _ in calm] == [t for t, _ in busy]
    assert [p for _, p in calm] == [p for _, p in busy]


def test_slot_isolation_sampling(tiny_kame_ckpt: Path) -> None:
    calm = _slot1_trace(make_core(tiny_kame_ckpt, 2), disturb=False)
    busy = _slot1_trace(make_core(tiny_kame_ckpt, 2), disturb=True)
    assert calm == busy


def test_attach_mid_stream_starts_cleanly(tiny_kame_ckpt: Path) -> None:
    """A late slot starts at its own step 0 (silence during the acoustic delay) while the
    other keeps one output per tick; the late slot then matches a fresh run of its own."""
    core = make_core(tiny_kame_ckpt, 2, greedy=True)
    core.attach(0)
    fs0, fs1 = frames(seed=3), frames(seed=4)
    for i in range(5):
        assert core.tick({0: fs0[i]})[0].step == i
    core.attach(1)
    late = []
    for i in range(5, N_STEPS):
        out = core.tick({0: fs0[i], 1: fs1[i - 5]})
        assert out[0].step == i
        late.append(out[1])
    assert late[0].step == 0 and late[0].text_id is None and not late[0].pcm.any()
    assert all(o.text_id is not None for o in late[2:])
    solo = make_core(tiny_kame_ckpt, 2, greedy=True)
    solo.attach(1)
    ref = [solo.tick({1: fs1[i]})[1] for i in range(len(late))]
    assert [o.text_id for o in late] == [o.text_id for o in ref]
    assert all(np.array_equal(a.pcm, b.pcm) for a, b in zip(late, ref))


def test_step_error_reported_and_engine_survives(tiny_kame_ckpt: Path) -> None:
    from kame.frontend.engine import EngineStepError

    core = make_core(tiny_kame_ckpt, 2)
    core.attach(0)
    with pytest.raises(ValueError):
        core.tick({0: np.zeros(100, np.float32)})  # wrong frame size: clear error
    original = core._model_step

    def boom() -> None:
        raise RuntimeError("simulated CUDA error")

    core._model_step = boom  # type: ignore[method-assign]
    with pytest.raises(EngineStepError) as info:
        core.tick({0: frames(1)[0]})
    assert info.value.slots == [0]
    core._model_step = original  # type: ignore[method-assign]
    core.attach(0)
    assert core.tick({0: frames(1)[0]})[0].step == 0


# --------------------------------------------------------------------------- vanilla equivalence


def _moshi_reference(
    ckpt: Path, fs: list[np.ndarray], seed: int, greedy: bool, decoded: list[np.ndarray] | None = None
) -> list[list[int]]:
    """moshi's own LMGen + Mimi loop, as moshi's server runs a session (``decoded``: its output audio)."""
    from moshi.models import loaders
    from moshi.models.lm import LMGen
    from moshi.utils.compile import no_compile

    info = loaders.CheckpointInfo.from_hf_repo(
        "local/unused",
        moshi_weights=ckpt / "model.safetensors",
        mimi_weights=ckpt / "mimi.safetensors",
        tokenizer=ckpt / "tokenizer.model",
        config_path=ckpt / "config.json",
        mimi_config_path=ckpt / "mimi_config.json",
    )
    lm = info.get_moshi(device="cpu", dtype=torch.float32)
    mimi = info.get_mimi("cpu")
    gen = LMGen(lm, use_sampling=not greedy, **info.lm_gen_config)
    torch.manual_seed(seed)
    out: list[list[int]] = []
    with no_compile(), torch.no_grad():
        mimi.streaming_forever(1)
        gen.streaming_forever(1)
        for i, f in enumerate(fs):
            codes = mimi.encode(torch.from_numpy(f)[None, None])
            if i == 0:  # moshi's server: reset Mimi after encoding the session's first frame
                mimi.reset_streaming()
            tokens = gen.step(codes)
            if tokens is not None:
                out.append(tokens[0, :, 0].tolist())
                if decoded is not None:
                    decoded.append(mimi.decode(tokens[:, 1:]).numpy().reshape(-1).copy())
    return out


def _ours(core: EngineCore, slot: int, step_slots: list[int], fs: list[np.ndarray], seed: int) -> list[list[int]]:
    torch.manual_seed(seed)
    for s in step_slots:
        core.attach(s)
    got: list[list[int]] = []
    for f in fs:
        o = core.tick({s: f for s in step_slots})[slot]
        if o.text_id is not None:
            assert o.audio_codes is not None
            got.append([o.text_id, *o.audio_codes])
    return got


def test_vanilla_equivalence_sampling_batch1(tiny_moshi_ckpt: Path) -> None:
    fs = frames(20, seed=9)
    ref = _moshi_reference(tiny_moshi_ckpt, fs, seed=11, greedy=False)
    core = make_core(tiny_moshi_ckpt, 1)
    assert core.idle_id == -1
    ours = _ours(core, 0, [0], fs, seed=11)
    assert len(ref) == len(fs) - 1
    assert ours == ref


@pytest.mark.parametrize("batch", [1, 3])
def test_vanilla_equivalence_greedy_any_batch(tiny_moshi_ckpt: Path, batch: int) -> None:
    fs = frames(20, seed=10)
    ref = _moshi_reference(tiny_moshi_ckpt, fs, seed=0, greedy=True)
    core = make_core(tiny_moshi_ckpt, batch, greedy=True)
    for slot in range(batch):
        core2 = core if slot == 0 else make_core(tiny_moshi_ckpt, batch, greedy=True)
        assert _ours(core2, slot, list(range(batch)), fs, seed=0) == ref


def test_first_frame_rule_per_slot_matches_moshis_loop(tiny_moshi_ckpt: Path) -> None:
    """Mimi is reset right after a slot's first frame (moshi's server), per slot: a session that
    joins a busy engine gets moshi's tokens AND audio, and the slot already running is not reset."""
    fs = frames(16, seed=21)
    ref_audio: list[np.ndarray] = []
    ref = _moshi_reference(tiny_moshi_ckpt, fs, seed=0, greedy=True, decoded=ref_audio)
    core = make_core(tiny_moshi_ckpt, 2, greedy=True)
    busy = frames(30, seed=22)
    core.attach(0)
    for f in busy[:5]:
        core.tick({0: f})
    core.attach(1)  # joins while slot 0 runs
    got, audio, busy_out = [], [], []
    for i, f in enumerate(fs):
        out = core.tick({0: busy[5 + i], 1: f})
        busy_out.append(out[0])
        o = out[1]
        if o.text_id is not None:
            assert o.audio_codes is not None
            got.append([o.text_id, *o.audio_codes])
            audio.append(o.pcm)
    assert got == ref
    for a, b in zip(audio, ref_audio):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # slot 0 went on as if alone: same as an engine that only ever ran slot 0
    alone = make_core(tiny_moshi_ckpt, 2, greedy=True)
    alone.attach(0)
    solo = [alone.tick({0: f})[0] for f in busy[: 5 + len(fs)]][5:]
    assert [o.text_id for o in solo] == [o.text_id for o in busy_out]
    assert all(np.allclose(a.pcm, b.pcm, atol=1e-5) for a, b in zip(solo, busy_out))


def test_without_the_first_frame_reset_the_tokens_differ(tiny_moshi_ckpt: Path) -> None:
    """The rule is observable: moshi's loop without the reset gives other tokens on the same input."""
    from moshi.models import loaders
    from moshi.models.lm import LMGen
    from moshi.utils.compile import no_compile

    fs = frames(16, seed=21)
    ref = _moshi_reference(tiny_moshi_ckpt, fs, seed=0, greedy=True)
    ck = tiny_moshi_ckpt
    info = loaders.CheckpointInfo.from_hf_repo(
        "local/unused", moshi_weights=ck / "model.safetensors", mimi_weights=ck / "mimi.safetensors",
        tokenizer=ck / "tokenizer.model", config_path=ck / "config.json", mimi_config_path=ck / "mimi_config.json",
    )
    lm, mimi = info.get_moshi(device="cpu", dtype=torch.float32), info.get_mimi("cpu")
    gen = LMGen(lm, use_sampling=False, **info.lm_gen_config)
    no_reset: list[list[int]] = []
    with no_compile(), torch.no_grad():
        mimi.streaming_forever(1)
        gen.streaming_forever(1)
        for f in fs:
            tokens = gen.step(mimi.encode(torch.from_numpy(f)[None, None]))
            if tokens is not None:
                no_reset.append(tokens[0, :, 0].tolist())
    assert no_reset != ref


@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_graphs_setting_reaches_every_model_call(tiny_kame_ckpt: Path, graphs: bool) -> None:
    """frontend.cuda_graphs: false turns moshi's CUDA graphs off around every engine call (moshi reads
    its flag at each call of a graphed function, so the guard must hold for ticks and resets alike)."""
    from moshi.utils import compile as moshi_compile

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=1, cuda_graphs=graphs)
    core = EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
    seen: list[bool] = []
    real_encode = core.mimi.encode

    def encode(pcm):  # type: ignore[no-untyped-def]
        seen.append(moshi_compile._is_cuda_graph_enabled())
        return real_encode(pcm)

    core.mimi.encode = encode
    core.attach(0)
    with core._compile_guard():
        seen.append(moshi_compile._is_cuda_graph_enabled())
    core.tick({0: frames(1)[0]})
    assert seen == [graphs, graphs]
    assert moshi_compile._is_cuda_graph_enabled()  # nothing leaks out of the engine


# --------------------------------------------------------------------------- freeing a batch's model


def test_closed_engine_frees_its_model_without_a_garbage_collection(tiny_kame_ckpt: Path) -> None:
    """A batch's model must go as soon as its engine is closed and dropped: GPU memory waits on no
    full collection (the text-logits hook and moshi's graphed step held the LMGen in cycles)."""
    import gc
    import weakref

    core = make_core(tiny_kame_ckpt, batch=2)
    core.attach(0)
    core.set_slot_sampling(0, 0.5, 5)  # the per-slot hook runs
    for f in frames(4):
        core.tick({0: f})
    lm_ref, gen_ref, mimi_ref = weakref.ref(core.models.lm), weakref.ref(core.lm_gen), weakref.ref(core.models.mimi)
    gc.disable()
    try:
        core.close()
        del core
        assert gen_ref() is None, "the LMGen outlived its closed engine (a reference cycle)"
        assert lm_ref() is None and mimi_ref() is None, "the models outlived their closed engine"
    finally:
        gc.enable()


def test_engine_hook_holds_its_engine_weakly(tiny_kame_ckpt: Path) -> None:
    """Without close(), the LMGen's hook alone keeps no engine alive."""
    import gc
    import weakref

    core = make_core(tiny_kame_ckpt, batch=1)
    core.attach(0)
    core.tick({0: frames(1)[0]})
    gen = core.lm_gen
    ref = weakref.ref(core)
    gc.disable()
    try:
        del core
        assert ref() is None
        gen.on_text_logits_hook(torch.zeros(1, 1, 1, 8))  # a dead engine's hook is a no-op
    finally:
        gc.enable()
