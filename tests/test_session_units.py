"""The session's pure pieces (settings, the send queue) and the pipeline's own rules on a tiny engine:
settings applied as a whole or not at all, typed events in order, the slot released on exit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from kame.backend.registry import BackendRegistry
from kame.config import KameConfig
from kame.frontend.config import FrontendConfig
from kame.frontend.engine import EngineCore
from kame.frontend.engine_thread import EngineFull, EngineThread
from kame.frontend.models import load_frontend
from kame.oracle.config import OracleConfig
from kame.server.runtime.send import SendQueue
from kame.server.runtime.wire import Outgoing
from kame.session.events import AssistantFrame, LlmRequestStarted, PipelineEvent
from kame.session.pipeline import piece_lookup
from kame.session.root import SessionRoot
from kame.session.settings import ORACLE_POLICIES, OracleChoice, SessionSettings

# --------------------------------------------------------------------------- settings


def test_policies_are_the_literal_defined_once() -> None:
    from typing import get_args

    from kame.oracle.switch import Policy

    assert ORACLE_POLICIES == get_args(Policy) == get_args(OracleConfig.model_fields["policy"].annotation)


def test_oracle_choice_fills_the_server_defaults_and_null_means_default() -> None:
    config = OracleConfig(policy="keep_if_same_start", barge_in="clear", instructions="Be kind.", oracle_delay_s=0.2)
    assert OracleChoice.resolve(SessionSettings(), config) == OracleChoice(
        backend=None, policy="keep_if_same_start", barge_in="clear", instructions="Be kind.", oracle_delay_s=0.2)
    chosen = SessionSettings(backend="b", oracle_policy="reset", barge_in="keep", instructions="Short.", oracle_delay_s=0.0)
    assert OracleChoice.resolve(chosen, config) == OracleChoice(
        backend="b", policy="reset", barge_in="keep", instructions="Short.", oracle_delay_s=0.0)
    # sampling is read as a pair; the oracle part ignores it
    assert SessionSettings(text_topk=5).sampling() == (None, 5)
    assert SessionSettings(text_topk=5).oracle_part() == SessionSettings().oracle_part()
    assert SessionSettings(instructions="x" * 500).for_log()["instructions"] == "x" * 200


# --------------------------------------------------------------------------- the send queue


def test_send_queue_drops_audio_behind_a_backlog_and_bounds_events() -> None:
    late: list[float] = []

    async def main() -> None:
        q = SendQueue(3, max_events=8, observe_lateness=late.append)
        assert q.audio_ok()
        for i in range(3):
            assert q.put(Outgoing(b"a", audio_index=i))
        assert not q.audio_ok()  # three messages wait: the next frame's audio is dropped
        assert q.put(Outgoing(b"t", droppable=True))  # text still fits (below 3 x 3 waiting)
        for _ in range(5):
            q.put(Outgoing(b"t", droppable=True))
        assert q.dropped_messages == 0 and q.qsize() == 9
        assert q.put(Outgoing(b"t", droppable=True)) and q.dropped_messages == 1  # dropped, not queued
        assert q.put(Outgoing("e")) and q.put(Outgoing("e"))  # lifecycle events are kept (up to max_events) ...
        assert not q.put(Outgoing("e"))  # ... then the client counts as not reading
        out = await q.get()
        assert out.audio_index == 0
        q.sent(out, 100.0)
        out = await q.get()
        q.sent(out, 100.5)  # frame 1 left 0.42 s behind its 80 ms schedule
        assert late[0] == 0.0 and abs(late[1] - 0.42) < 1e-9

    asyncio.run(main())


def test_send_queue_refuses_events_of_a_client_that_does_not_read() -> None:
    q = SendQueue(25, max_events=3)
    assert all(q.put(Outgoing("e")) for _ in range(3))
    assert not q.put(Outgoing("e"))


# --------------------------------------------------------------------------- the pipeline


@pytest.fixture(scope="module")
def engine(tiny_kame_ckpt: Path) -> Iterator[EngineThread]:
    cfg = FrontendConfig(checkpoint=str(tiny_kame_ckpt), batch_size=1)
    eng = EngineThread(EngineCore(load_frontend(cfg, torch.device("cpu")), cfg))
    eng.start()
    yield eng
    eng.stop()


def root_for(engine: EngineThread, registry: BackendRegistry | None = None) -> SessionRoot:
    models = engine.core.models
    return SessionRoot(engine=engine, oracle_config=OracleConfig(), registry=registry, recognizer=None,
                       encode=models.encode_text, piece_of=piece_lookup(models.tokenizer), vocab=models.vocab)


def test_the_pipeline_owns_its_slot_from_entry_to_exit(engine: EngineThread) -> None:
    async def main() -> list[AssistantFrame]:
        root = root_for(engine)
        frames: list[AssistantFrame] = []
        async with root.pipeline(SessionSettings(text_topk=1)) as pipeline:
            assert engine.free_slots == 0
            with pytest.raises(EngineFull):  # the one slot is this session's
                async with root.pipeline():
                    pass
            for _ in range(4):
                pipeline.feed(np.zeros(1920, np.float32))
            while len(frames) < 4:
                event = await asyncio.wait_for(pipeline.next_event(), 5)
                assert isinstance(event, AssistantFrame)
                frames.append(event)
            slot = pipeline.slot_index
            assert slot is not None and engine.core.slots[slot].top_k_text == 1  # the session's sampling
            pipeline.update(SessionSettings())  # back to the engine's
            pipeline.feed(np.zeros(1920, np.float32))
            await asyncio.wait_for(pipeline.next_event(), 5)
            assert engine.core.slots[slot].top_k_text is None
        deadline = asyncio.get_running_loop().time() + 5
        while engine.free_slots != 1:  # released on exit
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        return frames

    frames = asyncio.run(main())
    assert [f.step for f in frames] == [0, 1, 2, 3]
    vocab = engine.core.models.vocab
    assert all((f.piece is not None) == vocab.is_text(f.text_id) for f in frames)


def test_settings_apply_as_a_whole_or_not_at_all(engine: EngineThread) -> None:
    cfg = KameConfig.model_validate({"backends": {
        "fast": {"kind": "scripted", "scripted": {"first_token_delay_s": 0, "chunks_per_s": 1000}},
        "slow": {"kind": "scripted", "scripted": {"first_token_delay_s": 0, "chunks_per_s": 1000}},
    }, "default_backend": "fast"})

    async def main() -> list[PipelineEvent]:
        registry = BackendRegistry.from_config(cfg, {})
        events: list[PipelineEvent] = []
        try:
            async with root_for(engine, registry).pipeline() as pipeline:
                assert pipeline.oracle is not None and pipeline.oracle.settings.backend == "fast"
                pipeline.update(SessionSettings(backend="slow", oracle_policy="freeze_when_speaking"))
                assert (pipeline.oracle.settings.backend, pipeline.oracle.settings.policy) == ("slow", "freeze_when_speaking")
                with pytest.raises(KeyError):
                    pipeline.update(SessionSettings(backend="gone", oracle_policy="reset"))
                assert (pipeline.oracle.settings.backend, pipeline.oracle.settings.policy) == ("slow", "freeze_when_speaking")
                assert pipeline.settings.backend == "slow"  # the refused update changed nothing
                pipeline.oracle.on_user_final("What is the capital of France?")
                while not any(isinstance(e, LlmRequestStarted) for e in events):
                    events.append(await asyncio.wait_for(pipeline.next_event(), 5))
        finally:
            await registry.aclose()
        return events

    events = asyncio.run(main())
    started = [e for e in events if isinstance(e, LlmRequestStarted)]
    assert started[0].backend == "slow" and started[0].fields()["reason"] == "final"


@pytest.mark.realtime  # the real_time case: frames paced by the wall clock
@pytest.mark.parametrize("fast", [False, True], ids=["real_time", "fast"])
def test_an_injected_answer_lands_on_the_frame_of_its_time(engine: EngineThread, fast: bool) -> None:
    """``kame run --oracle TEXT@2.0`` in tandem mode: the answer's start id is fed at step 25 (2.0 s / 80 ms), at
    real time as SakanaAI's server feeds it, and with ``--fast`` too (frames queued ahead do not take it earlier)."""
    from kame.frontend.runner import OracleInjection
    from kame.session.offline import run_tandem_file

    models = engine.core.models
    injection = OracleInjection.parse("The answer is Paris.@2.0")
    assert injection.step == 25
    pcm = np.zeros(int(2.4 * 24000), np.float32)
    result = asyncio.run(run_tandem_file(root_for(engine), pcm, settings=SessionSettings(llm=False),
                                         injections=[injection], encode_answer=models.encode_text, fast=fast))
    fed = [e["step"] for e in result.events if e["type"] == "oracle.token"]
    assert fed and fed[0] == 25
    assert [e["step"] for e in result.events if e["type"] == "oracle.injected"] == [25]
