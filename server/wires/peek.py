"""A client event's ``type`` and ``event_id`` read before its wire decodes it (the WebRTC wires decide a
few events of their own, or refuse them, first). No I/O."""

from __future__ import annotations

import json

MAX_EVENT_ID_CHARS = 128


def peek(text: str | bytes | None) -> tuple[str | None, str | None]:
    """(type, event_id) of a JSON event; None for what is not there (or not JSON: the wire says why)."""
    if text is None:
        return None, None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    etype, event_id = obj.get("type"), obj.get("event_id")
    return (etype if isinstance(etype, str) else None,
            event_id[:MAX_EVENT_ID_CHARS] if isinstance(event_id, str) else None)
