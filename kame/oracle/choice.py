"""A session's oracle settings with the config's defaults filled in: what the oracle loop applies.

The loop reads only this (never the session's settings type): the session package is above the
oracle, so a client's choices reach the loop as the :class:`Overrides` it structurally satisfies
(:class:`kame.session.settings.SessionSettings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kame.oracle.config import OracleConfig
from kame.oracle.switch import BargeInPolicy, Policy
from kame.oracle.window import AUTO, Truncation


class Overrides(Protocol):
    """What a client may override of the oracle's defaults (None: the config's value)."""

    @property
    def backend(self) -> str | None: ...
    @property
    def oracle_policy(self) -> Policy | None: ...
    @property
    def barge_in(self) -> BargeInPolicy | None: ...
    @property
    def instructions(self) -> str | None: ...
    @property
    def oracle_delay_s(self) -> float | None: ...
    @property
    def truncation(self) -> Truncation: ...


@dataclass(frozen=True)
class OracleChoice:
    """A session's oracle settings with the defaults filled in from the config."""

    backend: str | None
    policy: Policy
    barge_in: BargeInPolicy
    instructions: str | None
    oracle_delay_s: float
    truncation: Truncation = AUTO

    @classmethod
    def resolve(cls, settings: Overrides, config: OracleConfig) -> OracleChoice:
        return cls(
            backend=settings.backend,
            policy=settings.oracle_policy or config.policy,
            barge_in=settings.barge_in or config.barge_in,
            instructions=settings.instructions if settings.instructions is not None else config.instructions,
            oracle_delay_s=config.oracle_delay_s if settings.oracle_delay_s is None else settings.oracle_delay_s,
            truncation=settings.truncation,
        )
