"""The TwiML ``POST /twilio/voice`` answers with. No I/O.

``<Connect><Stream url="wss://HOST/twilio/media">`` hands the call to the
websocket, bidirectionally; each ``<Parameter>`` reaches it in the ``start``
message's ``customParameters`` (Twilio's Stream URL takes no query string).
When the stream ends (the session is over, or the server refused it) Twilio
goes on with the next verb: there is none, so the call ends. With no free
slot the webhook answers ``<Reject reason="busy">``: the caller hears a busy
signal, Twilio's equivalent of SIP's 486 Busy Here (the call is not answered).
"""

from __future__ import annotations

from collections.abc import Mapping
from xml.sax.saxutils import quoteattr

#: Parameters copied from Twilio's webhook into the stream's ``customParameters`` (the app's log only).
PASSED_THROUGH = ("From", "To", "CallSid", "Direction")
#: Twilio's limit: a parameter's name and value together (characters).
MAX_PARAMETER_CHARS = 500

XML_HEAD = '<?xml version="1.0" encoding="UTF-8"?>'


def connect_stream(stream_url: str, parameters: Mapping[str, str] | None = None) -> str:
    """TwiML that connects the call to ``stream_url`` with ``parameters``."""
    params = "".join(
        f"<Parameter name={quoteattr(name)} value={quoteattr(value[: max(0, MAX_PARAMETER_CHARS - len(name))])}/>"
        for name, value in (parameters or {}).items()
    )
    return f"{XML_HEAD}<Response><Connect><Stream url={quoteattr(stream_url)}>{params}</Stream></Connect></Response>"


def reject_busy() -> str:
    """TwiML that refuses the call with a busy signal."""
    return f'{XML_HEAD}<Response><Reject reason="busy"/></Response>'
