"""Standard Webhooks signing (as OpenAI signs its webhooks) and the incoming-call events kame posts.

The ``webhook-signature`` is ``v1,`` + base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}")) where the key
is the base64 after ``whsec_`` in the secret: what the ``openai`` SDK's ``client.webhooks.unwrap`` checks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

REALTIME_INCOMING = "realtime.call.incoming"
LIVE_INCOMING = "live.transport.incoming"


class WebhookSecretError(ValueError):
    pass


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (:class:`WebhookSecretError` when it is not one)."""
    if not secret.startswith("whsec_"):
        raise WebhookSecretError("a webhook secret has the form whsec_<base64>")
    try:
        return base64.b64decode(secret[len("whsec_"):], validate=True)
    except ValueError:
        raise WebhookSecretError("the webhook secret's part after whsec_ is not base64") from None


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def message_id() -> str:
    return "wh_" + uuid.uuid4().hex


def signed_headers(secret: str | None, body: bytes, msg_id: str, now: float | None = None) -> dict[str, str]:
    """The Standard Webhooks headers of one delivery attempt (unsigned without a secret)."""
    timestamp = int(now if now is not None else time.time())
    headers = {"content-type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
               "user-agent": "kame-webhooks"}
    if secret:
        headers["webhook-signature"] = sign(secret, msg_id, timestamp, body)
    return headers


def incoming_event(kind: str, call_id: str, sip_headers: list[dict[str, str]], now: float | None = None) -> bytes:
    """The body of ``realtime.call.incoming`` (``data.call_id``) or ``live.transport.incoming``
    (``data.session_id``, ``data.type: "sip"``), as OpenAI sends them."""
    data: dict[str, Any] = {"sip_headers": sip_headers, "sip_media_security": "rtp"}
    if kind == LIVE_INCOMING:
        data = {"session_id": call_id, "type": "sip", **data}
    else:
        data = {"call_id": call_id, **data}
    event = {"object": "event", "id": "evt_" + uuid.uuid4().hex[:24], "type": kind,
             "created_at": int(now if now is not None else time.time()), "data": data}
    return json.dumps(event, separators=(",", ":")).encode()
