"""libopus through ctypes: decode and encode a call's Opus audio at 24 kHz mono (on the codec thread).

Why not aiortc's codecs: their cost is not Opus but the thread hand-offs
around it (a decoder thread per call woken per packet, a resampler, an
executor hop per output packet), which starve the engine thread of the GIL.
libopus decodes natively at 24 kHz (no resampler) and ctypes releases the
GIL during the call, so one thread codes for every call, in batches
(:mod:`~kame.server.webrtc.codec_worker`), off the event loop.

The library is the one PyAV's wheel bundles (``av.libs/libopus-*.so*``, so
the server needs no extra package), else the system's ``libopus``;
:func:`libopus` is None when neither loads and the transport keeps aiortc's
codecs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
from functools import lru_cache

import numpy as np

log = logging.getLogger("kame.server.webrtc")

OPUS_APPLICATION_VOIP = 2048
OPUS_SET_BITRATE_REQUEST = 4002
#: The longest Opus frame (120 ms) at 48 kHz: the decode buffer never needs more.
MAX_FRAME_48K = 5760
#: RFC 7587: an Opus packet is at most 1275 bytes per frame; 4000 is libopus's own recommendation.
MAX_PACKET_BYTES = 4000


class OpusError(RuntimeError):
    """libopus returned an error code (a corrupt packet, a bad argument)."""


@lru_cache(maxsize=1)
def libopus() -> ctypes.CDLL | None:
    """The loaded library with its signatures declared, or None (logged once)."""
    candidates: list[str] = []
    try:
        # deferred: PyAV loads with the first WebRTC call (a server without calls never imports it)
        import av

        libs = os.path.join(os.path.dirname(os.path.dirname(av.__file__)), "av.libs")
        candidates += sorted(glob.glob(os.path.join(libs, "libopus*.so*")))
    except ImportError:
        pass
    system = ctypes.util.find_library("opus")
    if system:
        candidates.append(system)
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        _declare(lib)
        return lib
    log.warning("libopus not found (PyAV's av.libs, the system): WebRTC audio uses aiortc's slower codecs")
    return None


def _declare(lib: ctypes.CDLL) -> None:
    p, i, i32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int32
    lib.opus_decoder_create.argtypes = [i32, i, ctypes.POINTER(i)]
    lib.opus_decoder_create.restype = p
    lib.opus_decoder_destroy.argtypes = [p]
    lib.opus_decode_float.argtypes = [p, ctypes.c_char_p, i32, ctypes.c_void_p, i, i]
    lib.opus_decode_float.restype = i
    lib.opus_encoder_create.argtypes = [i32, i, i, ctypes.POINTER(i)]
    lib.opus_encoder_create.restype = p
    lib.opus_encoder_destroy.argtypes = [p]
    lib.opus_encode.argtypes = [p, ctypes.c_void_p, i, ctypes.c_void_p, i32]
    lib.opus_encode.restype = i32
    lib.opus_encoder_ctl.restype = i  # variadic (encoder, request, int): callers pass ctypes values, no argtypes


class OpusDecoder:
    """One stream's decoder (Opus is stateful: one per call, packets in order)."""

    def __init__(self, rate: int = 24000, channels: int = 1) -> None:
        lib = libopus()
        if lib is None:
            raise OpusError("libopus is not available")
        self._lib = lib
        err = ctypes.c_int(0)
        self._state = lib.opus_decoder_create(rate, channels, ctypes.byref(err))
        if err.value != 0 or not self._state:
            raise OpusError(f"opus_decoder_create: {err.value}")
        self.rate = rate
        self.channels = channels
        self._buf = np.zeros(MAX_FRAME_48K * rate // 48000 * channels, np.float32)

    def decode(self, packet: bytes) -> np.ndarray:
        """One packet -> float32 samples (interleaved when stereo), a copy the caller may keep."""
        n = self._lib.opus_decode_float(self._state, packet, len(packet), self._buf.ctypes.data,
                                        len(self._buf) // self.channels, 0)
        if n < 0:
            raise OpusError(f"opus_decode_float: {n}")
        return self._buf[: n * self.channels].copy()

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.opus_decoder_destroy(state)


class OpusEncoder:
    """One stream's encoder: 16-bit PCM frames of one Opus frame size (2.5-60 ms) -> packets."""

    def __init__(self, rate: int = 24000, channels: int = 1, bitrate: int = 32000) -> None:
        lib = libopus()
        if lib is None:
            raise OpusError("libopus is not available")
        self._lib = lib
        err = ctypes.c_int(0)
        self._state = lib.opus_encoder_create(rate, channels, OPUS_APPLICATION_VOIP, ctypes.byref(err))
        if err.value != 0 or not self._state:
            raise OpusError(f"opus_encoder_create: {err.value}")
        rc = lib.opus_encoder_ctl(ctypes.c_void_p(self._state), ctypes.c_int(OPUS_SET_BITRATE_REQUEST), ctypes.c_int(bitrate))
        if rc != 0:
            raise OpusError(f"opus_encoder_ctl(bitrate): {rc}")
        self.rate = rate
        self.channels = channels
        self._out = ctypes.create_string_buffer(MAX_PACKET_BYTES)

    def encode(self, pcm16: np.ndarray) -> bytes:
        """One frame of int16 samples (interleaved when stereo) -> one Opus packet."""
        pcm16 = np.ascontiguousarray(pcm16, dtype=np.int16)
        n = self._lib.opus_encode(self._state, pcm16.ctypes.data, len(pcm16) // self.channels, self._out,
                                  MAX_PACKET_BYTES)
        if n < 0:
            raise OpusError(f"opus_encode: {n}")
        return self._out.raw[:n]

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.opus_encoder_destroy(state)
