"""When a PersonaPlex slot steps its prompts again (kame.frontend.prompt_refresh): pure bookkeeping, no torch.

The model side (the ring cache holds the prompts again after a refresh) is
tests/calls/test_personaplex_refresh.py.
"""

from __future__ import annotations

import math

import pytest

from kame.config import load_config
from kame.frontend.config import FrontendConfig
from kame.frontend.prompt_refresh import PromptRefresh, frame_dbfs


def run(clock: PromptRefresh, frames: list[tuple[bool, bool]]) -> list[int]:
    """The frame indexes at which ``clock`` starts a refresh."""
    return [i for i, (silent, quiet) in enumerate(frames) if clock.observe(silent, quiet)]


def test_not_before_the_prompts_start_to_leave_the_window() -> None:
    clock = PromptRefresh(context=100, prompt_frames=30, pause_frames=5)
    assert clock.due_after == 70
    starts = run(clock, [(True, True)] * 69)  # a pause all along, but the prompts are all still in the window
    assert starts == []
    assert run(clock, [(True, True)]) == [0]  # frame 70: the first prompt position leaves; both quiet for long


def test_waits_for_a_pause_on_both_sides() -> None:
    clock = PromptRefresh(context=100, prompt_frames=30, pause_frames=5)
    talk = [(False, True)] * 70 + [(True, False)] * 20  # the slot talks, then the caller does
    assert run(clock, talk) == []
    assert clock.due
    gap = [(True, True)] * 4 + [(False, True)] + [(True, True)] * 5  # four quiet frames, one word, five quiet
    assert run(clock, gap) == [9]  # the fifth frame of an unbroken pause, not the fourth


def test_at_most_once_a_context_whatever_the_pauses() -> None:
    clock = PromptRefresh(context=100, prompt_frames=30, pause_frames=3)
    starts = run(clock, [(True, True)] * 1000)  # silence throughout: refreshes as often as they may come
    assert starts == [69, 139, 209, 279, 349, 419, 489, 559, 629, 699, 769, 839, 909, 979]
    # the engine steps P = 30 prompt frames between two conversation frames at each refresh: starts are
    # (context - P) conversation frames + P prompt steps = context LM steps apart
    assert all(b - a + clock.prompt_frames >= clock.context for a, b in zip(starts, starts[1:]))
    assert clock.refreshes == len(starts)


def test_a_prompt_as_long_as_the_window_still_waits_a_frame() -> None:
    clock = PromptRefresh(context=50, prompt_frames=80, pause_frames=1)
    assert clock.due_after == 1
    assert run(clock, [(True, True)] * 3) == [0, 1, 2]


def test_levels() -> None:
    assert frame_dbfs(0.0) == -math.inf
    assert frame_dbfs(1.0) == pytest.approx(0.0)
    assert frame_dbfs(0.01) == pytest.approx(-40.0)


def test_config_defaults_to_moshis_window_and_reads_the_environment() -> None:
    assert FrontendConfig().refresh_prompts == "never"
    assert load_config(environ={}).frontend.refresh_prompts == "never"
    cfg = load_config(environ={"KAME_FRONTEND__REFRESH_PROMPTS": "at_pause", "KAME_FRONTEND__REFRESH_PAUSE_S": "0.5"})
    assert cfg.frontend.refresh_prompts == "at_pause"
    assert cfg.frontend.refresh_pause_s == 0.5
    with pytest.raises(ValueError):
        FrontendConfig(refresh_prompts="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FrontendConfig(refresh_pause_s=0)


def test_the_engine_threads_count_reaches_prometheus() -> None:
    from kame.frontend.engine_thread import TickStats
    from kame.server.telemetry.metrics import ServerMetrics

    metrics = ServerMetrics()
    metrics.on_tick(TickStats(duration_s=0.01, slots=2, waited_s=0.0))
    assert "kame_prompt_refreshes_total 0.0" in metrics.render().decode()
    metrics.on_tick(TickStats(duration_s=0.01, slots=2, waited_s=0.0, prompt_refreshes=2))
    assert "kame_prompt_refreshes_total 2.0" in metrics.render().decode()
