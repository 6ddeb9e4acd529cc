"""The pure session watchdog shared by both endpoints."""

from __future__ import annotations

from kame.server.config import ServerConfig
from kame.server.runtime.watchdog import watch

CFG = ServerConfig(idle_timeout_s=10, max_duration_s=100, duration_warning_s=20, slow_client_timeout_s=5)


def at(now: float, *, last_audio: float = 0.0, last_send: float = 0.0, pending: bool = False, warned: bool = False):  # type: ignore[no-untyped-def]
    return watch(CFG, now=now, started=0.0, last_audio=last_audio, last_send=last_send, send_pending=pending, warned=warned)


def test_quiet_session_goes_on() -> None:
    v = at(5.0, last_audio=4.9, last_send=4.9)
    assert v.end is None and v.warn_s is None


def test_idle_ends_normally() -> None:
    assert at(20.0, last_audio=9.0, last_send=19.9).end == ("idle", 1000, "idle timeout: no audio for 10 s")


def test_warning_then_maximum_duration() -> None:
    v = at(85.0, last_audio=84.9, last_send=84.9)
    assert v.end is None and v.warn_s == 15.0
    assert at(85.0, last_audio=84.9, last_send=84.9, warned=True).warn_s is None
    assert at(100.0, last_audio=99.9, last_send=99.9, warned=True).end[0] == "max_duration"  # type: ignore[index]


def test_client_that_does_not_read_is_closed_with_policy_code() -> None:
    assert at(30.0, last_audio=29.9, last_send=24.0, pending=True).end == ("slow_client", 1008, "client is not reading")
    assert at(30.0, last_audio=29.9, last_send=24.0, pending=False).end is None  # nothing to send: not slow


def test_an_hour_by_default_and_zero_means_no_cap() -> None:
    assert ServerConfig().max_duration_s == 3600.0
    uncapped = ServerConfig(idle_timeout_s=10, max_duration_s=0, duration_warning_s=20)
    week = 7 * 24 * 3600.0
    v = watch(uncapped, now=week, started=0.0, last_audio=week - 0.1, last_send=week - 0.1, send_pending=False,
              warned=False)
    assert v.end is None and v.warn_s is None  # neither closed nor warned, however long
    assert watch(uncapped, now=week, started=0.0, last_audio=0.0, last_send=week, send_pending=False,
                 warned=False).end[0] == "idle"  # type: ignore[index]  # the other limits still hold


def test_negative_duration_is_refused() -> None:
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError):
        ServerConfig(max_duration_s=-1)
