"""The conversation's items on ``/v1/realtime``: client events that edit it, and the store that answers them. No I/O.

OpenAI's clients keep their own copy of the conversation and edit the
server's: ``conversation.item.create`` (a message for the model's context),
``.retrieve``, ``.delete``, ``.truncate`` (what the user heard of an
assistant message), ``response.create`` / ``.cancel``. The wire turns them
into :mod:`kame.session.commands` for the pipeline; :class:`ItemStore`
keeps the items the session announced, so that ``retrieve`` returns them
and ``delete`` knows what it removes (docs/protocol.md 3.7).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kame.server.wires.realtime.events import ClientError, Event
from kame.session.commands import ContextItem, Role

#: Items kept for retrieve and delete (the oldest are forgotten first).
MAX_ITEMS = 512
#: Longest text of a message item a client adds (characters).
MAX_ITEM_TEXT_CHARS = 20_000
#: ``metadata`` of a response.create: at most 16 pairs, keys of 64 and values of 512 characters (OpenAI's limits).
MAX_METADATA_PAIRS = 16
ROLES: tuple[Role, ...] = ("user", "assistant", "system")
_TEXT_PARTS = ("input_text", "output_text", "text")
_AUDIO_PARTS = ("input_audio", "output_audio", "audio")


@dataclass(frozen=True)
class MessageCreate:
    """``conversation.item.create`` of a message; ``item`` is the item as the server shows it."""

    item: dict[str, Any]
    context: ContextItem
    previous_item_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True)
class ItemRetrieve:
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True)
class ItemDelete:
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True)
class ItemTruncate:
    item_id: str
    content_index: int
    audio_end_ms: int
    event_id: str | None = None


@dataclass(frozen=True)
class ResponseRequest:
    """``response.create``: ``instructions`` for this response, ``context`` in place of the conversation
    (its ``input``), ``metadata`` echoed in the response."""

    event_id: str | None = None
    metadata: dict[str, str] | None = None
    instructions: str | None = None
    context: tuple[ContextItem, ...] | None = None


@dataclass(frozen=True)
class ResponseCancel:
    event_id: str | None = None
    response_id: str | None = None


def _item_id(obj: Mapping[str, Any], key: str, event_id: str | None, *, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ClientError("missing_required_parameter", f"{key} must be a string", param=key, event_id=event_id)
    return value[:128]


def message_text(item: Mapping[str, Any]) -> str:
    """The text a message item carries (text parts, and the transcripts of audio parts)."""
    content = item.get("content")
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        value = part.get("text") if kind in _TEXT_PARTS else part.get("transcript") if kind in _AUDIO_PARTS else None
        if isinstance(value, str) and value.strip():
            texts.append(value.strip())
    return " ".join(texts)


def parse_message(item: Mapping[str, Any], item_id: str, param: str = "item", event_id: str | None = None) -> ContextItem:
    """A message item (user, system or assistant) -> the text that joins the back-end's context."""
    role = item.get("role")
    if role not in ROLES:
        raise ClientError("invalid_value", f"{param}.role must be user, assistant or system", param=f"{param}.role",
                          event_id=event_id)
    content = item.get("content", [])
    if not isinstance(content, list):
        raise ClientError("invalid_value", f"{param}.content must be a list of content parts", param=f"{param}.content",
                          event_id=event_id)
    text = message_text(item)
    if len(text) > MAX_ITEM_TEXT_CHARS:
        raise ClientError("invalid_value", f"{param}: at most {MAX_ITEM_TEXT_CHARS} characters of text",
                          param=f"{param}.content", event_id=event_id)
    return ContextItem(item_id, role, text)


def message_create(obj: Mapping[str, Any], item_id: str, event_id: str | None) -> MessageCreate:
    """``conversation.item.create`` with ``item.type`` ``message`` (``item_id`` when the client gave none)."""
    item = obj.get("item")
    assert isinstance(item, Mapping)
    given = item.get("id")
    if isinstance(given, str) and given:
        item_id = given[:128]
    context = parse_message(item, item_id, event_id=event_id)
    shown: dict[str, Any] = {
        "id": item_id, "object": "realtime.item", "type": "message", "role": context.role, "status": "completed",
        "content": [dict(p) for p in item.get("content", []) if isinstance(p, Mapping)],
    }
    previous = obj.get("previous_item_id")
    return MessageCreate(shown, context, previous if isinstance(previous, str) else None, event_id)


def item_event(obj: Mapping[str, Any], kind: Literal["retrieve", "delete", "truncate"],
               event_id: str | None) -> ItemRetrieve | ItemDelete | ItemTruncate:
    item_id = _item_id(obj, "item_id", event_id)
    assert item_id is not None
    if kind == "retrieve":
        return ItemRetrieve(item_id, event_id)
    if kind == "delete":
        return ItemDelete(item_id, event_id)
    end = obj.get("audio_end_ms")
    if isinstance(end, bool) or not isinstance(end, (int, float)) or end < 0:
        raise ClientError("invalid_value", "audio_end_ms must be a number of milliseconds >= 0", param="audio_end_ms",
                          event_id=event_id)
    index = obj.get("content_index", 0)
    return ItemTruncate(item_id, int(index) if isinstance(index, int) else 0, int(end), event_id)


def response_request(obj: Mapping[str, Any], event_id: str | None) -> ResponseRequest:
    response = obj.get("response")
    if response is None:
        return ResponseRequest(event_id)
    if not isinstance(response, Mapping):
        raise ClientError("invalid_value", "response must be an object", param="response", event_id=event_id)
    metadata = response.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, Mapping) or len(metadata) > MAX_METADATA_PAIRS or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()):
            raise ClientError("invalid_value", "response.metadata: at most 16 string pairs (keys of 64 characters, "
                              "values of 512)", param="response.metadata", event_id=event_id)
        metadata = dict(metadata)
    instructions = response.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ClientError("invalid_value", "response.instructions must be a string", param="response.instructions",
                          event_id=event_id)
    context: tuple[ContextItem, ...] | None = None
    given = response.get("input")
    if given is not None:
        if not isinstance(given, list):
            raise ClientError("invalid_value", "response.input must be a list of items", param="response.input",
                              event_id=event_id)
        items: list[ContextItem] = []
        for i, item in enumerate(given):
            if isinstance(item, Mapping) and item.get("type", "message") == "message":
                items.append(parse_message(item, f"input:{i}", f"response.input[{i}]", event_id))
        context = tuple(items)
    return ResponseRequest(event_id, metadata, instructions if instructions and instructions.strip() else None, context)


class ItemStore:
    """The items the session announced (``conversation.item.added`` / ``.done``), by id, bounded."""

    def __init__(self, limit: int = MAX_ITEMS) -> None:
        self.limit = limit
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def saw(self, event: Event) -> None:
        """Keep the item of an event that adds or finishes one."""
        if event.get("type") not in ("conversation.item.added", "conversation.item.done"):
            return
        item = event.get("item")
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            self._items[item["id"]] = item
            self._items.move_to_end(item["id"])
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, item_id: str) -> dict[str, Any] | None:
        return self._items.get(item_id)

    def pop(self, item_id: str) -> dict[str, Any] | None:
        return self._items.pop(item_id, None)

    def clear(self) -> None:
        self._items.clear()
