"""A Live WebRTC session's ``client.data_channel``: what the untrusted page may send and receive. No I/O.

OpenAI's Live API lets the trusted server that creates a WebRTC session
limit its page (``openai/types/live/data_channel_config.py``):
``allowed_client_events`` (``"all"``, or a list of client event types) and
``allowed_server_events`` (``"all"``, or selectors ``{type}``, with
``{type: "response.event", response_event}`` for a nested Responses event).
Omitted means everything, an empty list nothing. A page's event outside its
list is answered with an ``error`` and changes nothing; a server event
outside the list is not sent to the page. A sideband (the trusted server)
is never filtered. The permissions are fixed at creation (``client`` is
startup-only) and echoed in ``session.started`` and in an
``info`` (``data_channel_permissions``).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openai.types.live.client_event import ClientEvent

from kame.server.wires.live.events import Info, LiveError

#: Every client event type of the Live contract (the SDK's ``ClientEvent`` union).
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(
    typing.get_args(model.model_fields["type"].annotation)[0]
    for model in typing.get_args(typing.get_args(ClientEvent)[0])
)
RESPONSE_EVENT = "response.event"
MAX_SELECTORS = 256
PARAM = "session.client.data_channel"

Selector = tuple[str, str | None]  #: (server event type, the nested Responses event type or None)


@dataclass(frozen=True)
class ChannelPermissions:
    """What the page's data channel may carry (None: everything)."""

    client: frozenset[str] | None = None
    server: frozenset[Selector] | None = None

    @property
    def unrestricted(self) -> bool:
        return self.client is None and self.server is None

    def client_allows(self, etype: str) -> bool:
        return self.client is None or etype in self.client

    def server_allows(self, etype: str, response_event: str | None = None) -> bool:
        if self.server is None:
            return True
        if etype == RESPONSE_EVENT:
            return (etype, response_event) in self.server
        return (etype, None) in self.server

    def allows_message(self, data: str | bytes) -> bool:
        """Whether the page gets this encoded server event (what is not a JSON event is never withheld)."""
        if self.server is None:
            return True
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            return True
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return True
        nested = event.get("event")
        inner = nested.get("type") if isinstance(nested, dict) else None
        return self.server_allows(event["type"], inner if isinstance(inner, str) else None)

    def as_config(self) -> dict[str, Any]:
        """The ``client`` of the session resource (``ClientConfig``)."""
        server: Any = "all"
        if self.server is not None:
            server = [{"type": t} if r is None else {"type": t, "response_event": r} for t, r in sorted(
                self.server, key=lambda s: (s[0], s[1] or ""))]
        client: Any = "all" if self.client is None else sorted(self.client)
        return {"data_channel": {"allowed_client_events": client, "allowed_server_events": server}}

    def notice(self) -> Info:
        """The ``info`` telling the page what its channel may carry."""
        def count(value: frozenset[Any] | None, what: str) -> str:
            return f"every {what}" if value is None else f"{len(value)} {what} type(s)"

        return Info("data_channel_permissions",
                    f"this data channel may send {count(self.client, 'client event')} and receive "
                    f"{count(self.server, 'server event')}; the trusted sideband is not limited")


def parse_permissions(client: Any) -> ChannelPermissions:
    """``session.client`` -> the permissions, or :class:`LiveError` (its message names the field)."""
    if client is None:
        return ChannelPermissions()
    if not isinstance(client, Mapping):
        raise LiveError("invalid_value", "session.client must be an object", param="session.client")
    unknown = [str(k)[:32] for k in client if k != "data_channel"]
    if unknown:
        raise LiveError("unknown_parameter", f"session.client.{unknown[0]} is not a field of session.client",
                        param=f"session.client.{unknown[0]}")
    channel = client.get("data_channel")
    if not isinstance(channel, Mapping):
        raise LiveError("missing_required_parameter", f"{PARAM} is required in session.client and must be an object",
                        param=PARAM)
    unknown = [str(k)[:32] for k in channel if k not in ("allowed_client_events", "allowed_server_events")]
    if unknown:
        raise LiveError("unknown_parameter", f"{PARAM}.{unknown[0]} is not a field of {PARAM}",
                        param=f"{PARAM}.{unknown[0]}")
    return ChannelPermissions(_client_events(channel.get("allowed_client_events")),
                              _server_events(channel.get("allowed_server_events")))


def _allow_list(value: Any, param: str, what: str) -> list[Any] | None:
    """An allow-list field's items, or None for "all" (also when absent); refused unless a short list."""
    if value is None or value == "all":
        return None
    if not isinstance(value, list) or len(value) > MAX_SELECTORS:
        raise LiveError("invalid_value", f"{param} must be \"all\" or a list of {what}", param=param)
    return value


def _client_events(value: Any) -> frozenset[str] | None:
    param = f"{PARAM}.allowed_client_events"
    items = _allow_list(value, param, "client event types")
    if items is None:
        return None
    for item in items:
        if not isinstance(item, str) or item not in CLIENT_EVENT_TYPES:
            raise LiveError("invalid_value", f"{param}: {str(item)[:48]!r} is not a Live client event type",
                            param=param)
    return frozenset(items)


def _server_events(value: Any) -> frozenset[Selector] | None:
    param = f"{PARAM}.allowed_server_events"
    items = _allow_list(value, param, "{type} selectors")
    if items is None:
        return None
    out: set[Selector] = set()
    for item in items:
        etype = item.get("type") if isinstance(item, Mapping) else None
        if not isinstance(etype, str) or not 0 < len(etype) <= 64:
            raise LiveError("invalid_value", f"{param}: each selector needs a \"type\" (a server event type)",
                            param=param)
        inner = item.get("response_event")
        if etype == RESPONSE_EVENT and (not isinstance(inner, str) or not 0 < len(inner) <= 64):
            raise LiveError("invalid_value", f"{param}: a {RESPONSE_EVENT} selector needs \"response_event\"",
                            param=param)
        if etype != RESPONSE_EVENT and inner is not None:
            raise LiveError("invalid_value", f"{param}: \"response_event\" is only for type {RESPONSE_EVENT}",
                            param=param)
        out.add((etype, inner if etype == RESPONSE_EVENT else None))
    return frozenset(out)


def refused_client_event(permissions: ChannelPermissions, etype: str, event_id: str | None) -> LiveError | None:
    """The error for a page's event its permissions do not allow (None: allowed)."""
    if permissions.client_allows(etype):
        return None
    return LiveError("event_not_allowed",
                     f"{etype[:48]} is not allowed on this data channel (session.client.data_channel."
                     "allowed_client_events); the trusted server may send it over its sideband",
                     param="type", client_event_id=event_id)
