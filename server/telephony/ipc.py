"""The pipe between ``kame serve`` and its SIP child (:mod:`~kame.server.telephony.child`): framed messages.

One frame is a 7-byte header (kind, call number, length; network order) and a payload: a JSON object
(``CONTROL``: call events one way, commands the other) or 20 ms of 16-bit mono PCM at 8 kHz (``AUDIO``).
Both ends use it over one Unix stream socket (a ``socketpair`` the parent makes), so a frame is never
torn and the child dies with the parent's end (EOF).
"""

from __future__ import annotations

import json
import struct
from typing import Any

HEADER = struct.Struct("!BIH")
CONTROL = 0
AUDIO = 1
#: The rate and frame of the audio on the pipe: what a phone sends (G.711), one RTP packet's worth.
RATE = 8000
FRAME_SAMPLES = 160
FRAME_BYTES = FRAME_SAMPLES * 2
MAX_PAYLOAD = 0xFFFF


def pack(kind: int, cid: int, payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"IPC payload of {len(payload)} bytes")
    return HEADER.pack(kind, cid, len(payload)) + payload


def control(cid: int, **fields: Any) -> bytes:
    return pack(CONTROL, cid, json.dumps(fields, separators=(",", ":")).encode())


def audio(cid: int, pcm16: bytes) -> bytes:
    return pack(AUDIO, cid, pcm16)
