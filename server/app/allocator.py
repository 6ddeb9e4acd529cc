"""glibc malloc settings for a server that lives for weeks.

Why: client messages of a few hundred KB (base64 audio appends, oversized or
flooding clients) are freed again at once. glibc's default *dynamic* mmap
threshold rises to the size of the largest freed mmapped block, after which
such messages are carved out of the heap arenas instead, and every thread that
touches them (event loop, engine, ASR) grows its own arena: freed memory stays
fragmented in up to 8 x cores arenas and the RSS creeps up under abuse. A
fixed mmap threshold gives large blocks straight back to the kernel on free,
and a small arena cap bounds the fragmentation. Environment variables the
operator set (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``) win: glibc has
applied them before Python started, and they are not overridden here.

Other C libraries (musl, macOS) have no ``mallopt``: nothing is changed there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("kame.server")

# mallopt parameter numbers from glibc's <malloc.h>.
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


@dataclass(frozen=True)
class AllocatorSettings:
    """What to ask of malloc; 0 leaves glibc's own default."""

    arena_max: int = 2
    mmap_threshold_bytes: int = 128 * 1024


def planned_options(settings: AllocatorSettings, environ: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """The ``mallopt`` calls to make, as ``{name: (param, value)}``: settings that are on and that the
    environment does not already decide."""
    out: dict[str, tuple[int, int]] = {}
    if settings.arena_max > 0 and "MALLOC_ARENA_MAX" not in environ:
        out["arena_max"] = (M_ARENA_MAX, settings.arena_max)
    if settings.mmap_threshold_bytes > 0 and "MALLOC_MMAP_THRESHOLD_" not in environ:
        out["mmap_threshold_bytes"] = (M_MMAP_THRESHOLD, settings.mmap_threshold_bytes)
    return out


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    # gnu_get_libc_version exists only in glibc, whose mallopt parameter numbers are the ones above
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def tune_allocator(settings: AllocatorSettings, environ: Mapping[str, str]) -> dict[str, int]:
    """Apply ``settings`` through glibc's ``mallopt``; returns what was applied (empty elsewhere).

    Call it once, early in the process, before the server's threads start."""
    planned = planned_options(settings, environ)
    if not planned:
        return {}
    libc = _glibc()
    if libc is None:
        log.debug("allocator: not glibc, malloc settings left alone")
        return {}
    applied: dict[str, int] = {}
    for name, (param, value) in planned.items():
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1:
            applied[name] = value
        else:
            log.warning("allocator: mallopt(%s=%d) refused", name, value)
    return applied
