"""A tick reads its outputs back from the device once: the LM's tokens, the decoded audio and a shared STT's
tokens and end-of-turn probabilities gathered into one copy (kame/frontend/host_copy.py).

On the CPU a ``.cpu()`` copies nothing, so every tick's reads go through :class:`HostCopy`, which counts
them; ``torch.Tensor.cpu`` and ``torch.tensor`` are watched during the ticks so that no second copy and no
per-slot tensor a tick (PersonaPlex's sine tokens) slips past the helper.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kame.frontend.config import FrontendConfig, SamplingConfig
from kame.frontend.host_copy import HostCopy


@pytest.fixture(scope="module")
def stt_ckpt(kame_cache_dir: Path) -> Path:
    from kame.frontend.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(kame_cache_dir, seed=0, stt=True)


@contextmanager
def watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts ``Tensor.cpu`` calls and ``torch.tensor(..., device=...)`` constructions while inside."""
    counts = {"cpu": 0, "tensor_on_device": 0}
    real_cpu, real_tensor = torch.Tensor.cpu, torch.tensor

    def cpu(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        counts["cpu"] += 1
        return real_cpu(self, *a, **k)

    def tensor(*a: Any, **k: Any) -> torch.Tensor:
        if k.get("device") is not None:
            counts["tensor_on_device"] += 1
        return real_tensor(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "cpu", cpu)
        m.setattr(torch, "tensor", tensor)
        yield counts


def frames(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(1920)).astype(np.float32) for _ in range(n)]


def test_host_copy_round_trips_every_part_in_one_copy() -> None:
    copy = HostCopy(torch.device("cpu"))
    tokens = torch.tensor([[3, -2], [31999, 7]], dtype=torch.long)
    pcm = torch.randn(2, 1920)
    ends = torch.tensor([0.25, 0.75])
    got = copy.fetch([tokens, pcm, ends])
    assert copy.copies == 1
    assert got[0].dtype == torch.long and torch.equal(got[0], tokens)
    assert torch.equal(got[1], pcm) and torch.equal(got[2], ends)
    pcm.add_(1.0)  # what a session keeps does not alias the device tensor
    assert not torch.equal(got[1], pcm)


def test_a_tick_copies_once_with_the_shared_stt(
    stt_ckpt: Path, tiny_kame_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kame.asr.kyutai_core import SttCore
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=3, sampling=SamplingConfig(use_sampling=False))
    stt = SttCore.from_spec(str(stt_ckpt), torch.device("cpu"), 3, own_mimi=False)
    core = EngineCore(load_frontend(cfg, torch.device("cpu"), mimi_codebooks=32), cfg, stt=stt)
    for s in (0, 1):
        core.attach(s)
        core.stt_attach(s)
    core.set_slot_sampling(1, 0.5, 5)
    audio = frames(12, 1)
    with watched(monkeypatch) as counts:
        for i, frame in enumerate(audio):
            if i == 6:
                core.attach(2)  # a slot joining mid-run: inside the acoustic delay while the others are not
            slots = [0, 1, 2] if i >= 6 else [0, 1]
            before = core.host_copy.copies
            out = core.tick(dict.fromkeys(slots, frame))
            assert core.host_copy.copies == before + 1, f"tick {i}"
            assert out[0].stt is not None and out[1].stt is not None
        assert counts == {"cpu": 0, "tensor_on_device": 0}, counts
    # the host's own reckoning of moshi's acoustic delay matches what moshi generated
    assert out[0].audio_codes is not None and out[0].text_id is not None
    assert out[2].audio_codes is None or core.slots[2].steps > core._max_delay
    assert np.abs(out[0].pcm).sum() > 0
    core.close()


def test_personaplex_ticks_copy_once_and_make_no_tensor_a_slot(
    tiny_personaplex_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kame.frontend.engine import EngineCore
    from kame.frontend.models import load_frontend

    cfg = FrontendConfig(checkpoint=str(tiny_personaplex_ckpt), batch_size=2)
    core = EngineCore(load_frontend(cfg, torch.device("cpu")), cfg)
    core.attach(0)
    core.attach(1)
    n = 0
    with watched(monkeypatch) as counts:
        for frame in frames(40, 2):
            before = core.host_copy.copies
            core.tick({0: frame, 1: frame})
            assert core.host_copy.copies == before + 1
            n += 1
        assert counts == {"cpu": 0, "tensor_on_device": 0}, counts
    assert not core.prompting(0), "the test ran past the prompts into the conversation"
    core.close()
