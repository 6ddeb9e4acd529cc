"""The oracle loop's test harness: a recording engine slot, a registry on a real loopback server, a loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import sentencepiece as spm

from kame.backend.registry import BackendRegistry
from kame.config import KameConfig
from kame.oracle.config import OracleConfig
from kame.oracle.loop import OracleLoop, SessionOracleSettings
from tests.support.llm_server import LlmServer

SECRET = "sk-test-SECRET-value-123456"


class RecordingSink:
    """The loop's view of an engine slot, recording what it is asked to feed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def oracle_reset(self, first_ids: list[int]) -> None:
        self.calls.append(("reset", list(first_ids)))

    def oracle_push(self, ids: list[int]) -> None:
        self.calls.append(("push", list(ids)))

    def oracle_clear(self) -> None:
        self.calls.append(("clear", []))

    def sequences(self) -> list[list[int]]:
        seqs: list[list[int]] = []
        for kind, ids in self.calls:
            if kind == "reset":
                seqs.append(list(ids))
            elif kind == "push":
                seqs[-1].extend(ids)
        return seqs


def make_registry(server: LlmServer, names: tuple[str, ...] = ("main",), **extra: Any) -> BackendRegistry:
    backends = {n: {"base_url": server.base_url, "model": f"model-{n}", "api_key_env": "KAME_TEST_KEY",
                    "breaker": {"enabled": False}, **extra} for n in names}
    cfg = KameConfig.model_validate({"backends": backends, "default_backend": names[0]})
    return BackendRegistry.from_config(cfg, {"KAME_TEST_KEY": SECRET})


def make_loop(reg: BackendRegistry, sp: spm.SentencePieceProcessor, events: list[tuple[str, dict]], sink: RecordingSink,
              **cfg: Any) -> OracleLoop:
    config = OracleConfig(**cfg)
    return OracleLoop(config=config, registry=reg, sink=sink, encode=sp.encode, piece_of=sp.id_to_piece,
                      emit=lambda e: events.append((e.name, e.fields())),
                      settings=SessionOracleSettings(policy=config.policy, barge_in=config.barge_in))


async def wait_for(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)
