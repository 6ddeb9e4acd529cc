"""Headless Chromium (Debian's /usr/bin/chromium under Playwright) for the browser page's tests: launch
flags, a console watcher, and the page's ``window.kame`` state read from Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.sync_api import ConsoleMessage, Page, ViewportSize

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium's own connections are refused by a closed network.
BASE_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}


class Console:
    """Console errors and uncaught exceptions of every page it watches."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def watch(self, page: Page, name: str) -> Page:
        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                self.errors.append(f"{name}: {msg.text}")
            elif msg.type == "warning":
                self.warnings.append(f"{name}: {msg.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"{name}: uncaught {exc}"))
        return page


def kame(page: Page, expr: str) -> Any:
    """Evaluate ``expr`` with ``k`` bound to the page's ``window.kame``."""
    return page.evaluate(f"(() => {{ const k = window.kame; return {expr}; }})()")


def wait_until(page: Page, js: str, timeout_s: float, what: str, dump: Callable[[], Any] | None = None) -> None:
    try:
        page.wait_for_function(js, timeout=timeout_s * 1000, polling=100)
    except Exception as exc:  # noqa: BLE001 - say what did not happen, with the page's view
        state = dump() if dump else None
        raise AssertionError(f"{what}: not within {timeout_s:g} s ({exc.__class__.__name__}); {state}") from None


def events(page: Page, *types: str) -> list[dict[str, Any]]:
    return page.evaluate("(types) => window.kame.events.filter((e) => types.includes(e.type))", list(types))


def summary(page: Page) -> dict[str, Any]:
    return kame(page, "({phase: k.phase, counters: k.counters, playback: k.playback, latency: k.latency, "
                      "notice: document.getElementById('notice').hidden ? null : document.getElementById('notice-text').textContent, "
                      "last: k.events.slice(-12).map((e) => e.type)})")
