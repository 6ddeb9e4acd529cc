"""When a session must end or be warned: idle, maximum duration, a client that does not read.

Pure (the caller passes the clock and the session's timestamps), shared by
both websocket endpoints; each endpoint words the warning in its protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette import status

from kame.server.config import ServerConfig


@dataclass(frozen=True)
class WatchVerdict:
    """``end``: (metrics label, close code, reason); ``warn_s``: seconds left, warn the client now."""

    end: tuple[str, int, str] | None = None
    warn_s: float | None = None


def watch_period(cfg: ServerConfig) -> float:
    """How often to look: often enough for short test timeouts, cheap for long ones."""
    cap = cfg.max_duration_s / 8 if cfg.max_duration_s > 0 else 0.25
    return max(0.02, min(0.25, cfg.idle_timeout_s / 4, cap))


def watch(cfg: ServerConfig, *, now: float, started: float, last_audio: float, last_send: float,
          send_pending: bool, warned: bool) -> WatchVerdict:
    age = now - started
    if now - last_audio >= cfg.idle_timeout_s:
        return WatchVerdict(end=("idle", status.WS_1000_NORMAL_CLOSURE, f"idle timeout: no audio for {cfg.idle_timeout_s:g} s"))
    capped = cfg.max_duration_s > 0  # 0: no cap
    if capped and age >= cfg.max_duration_s:
        return WatchVerdict(end=("max_duration", status.WS_1000_NORMAL_CLOSURE,
                                 f"maximum session duration reached ({cfg.max_duration_s:g} s)"))
    if send_pending and now - last_send >= cfg.slow_client_timeout_s:
        return WatchVerdict(end=("slow_client", status.WS_1008_POLICY_VIOLATION, "client is not reading"))
    if capped and not warned and cfg.duration_warning_s > 0 and age >= max(0.0, cfg.max_duration_s - cfg.duration_warning_s):
        return WatchVerdict(warn_s=max(0.0, cfg.max_duration_s - age))
    return WatchVerdict()
