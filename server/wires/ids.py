"""The one id scheme of the wires: ``<kind>_`` + a session prefix + a counter, like OpenAI's ids.

``event_``, ``resp_``, ``item_`` (``/v1/realtime``) and ``dlg_`` (a Live delegation) share one
counter per session, so no two ids of a session are equal whatever their kind; the prefix is the
session id's first 8 hex digits (random where there is no session yet). Clients that parse ids by
prefix keep working.
"""

from __future__ import annotations

import secrets


class Ids:
    """Session-unique ids: a session prefix and one counter (cheap, never repeated)."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or secrets.token_hex(4)
        self._n = 0

    def _next(self, kind: str) -> str:
        self._n += 1
        return f"{kind}_{self.prefix}{self._n:06x}"

    def event(self) -> str:
        return self._next("event")

    def response(self) -> str:
        return self._next("resp")

    def item(self) -> str:
        return self._next("item")

    def delegation(self) -> str:
        return self._next("dlg")
