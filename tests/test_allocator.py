"""glibc malloc settings of `kame serve`: what is applied, what the environment decides, and the effect."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from kame.server.app.allocator import M_ARENA_MAX, M_MMAP_THRESHOLD, AllocatorSettings, planned_options


def test_defaults_plan_both_options() -> None:
    assert planned_options(AllocatorSettings(), {}) == {
        "arena_max": (M_ARENA_MAX, 2),
        "mmap_threshold_bytes": (M_MMAP_THRESHOLD, 128 * 1024),
    }


def test_the_environment_and_zero_leave_glibc_alone() -> None:
    assert planned_options(AllocatorSettings(), {"MALLOC_ARENA_MAX": "4"}) == {
        "mmap_threshold_bytes": (M_MMAP_THRESHOLD, 128 * 1024)
    }
    assert planned_options(AllocatorSettings(arena_max=3), {"MALLOC_MMAP_THRESHOLD_": "65536"}) == {
        "arena_max": (M_ARENA_MAX, 3)
    }
    assert planned_options(AllocatorSettings(arena_max=0, mmap_threshold_bytes=0), {}) == {}


# After a 2 MB block is freed, glibc's dynamic threshold serves a 400 KB block (a large client message)
# from the heap, where its memory stays after free; with a fixed threshold it is mmapped (hblks grows)
# and goes back to the kernel on free.
_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from kame.server.app.allocator import AllocatorSettings, tune_allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    applied = tune_allocator(AllocatorSettings(), {}) if sys.argv[1] == "tune" else {}
    big = libc.malloc(2 << 20)
    libc.free(big)
    before = libc.mallinfo2().hblks
    block = libc.malloc(400_000)
    print(sorted(applied), libc.mallinfo2().hblks - before)
    libc.free(block)
    """
)


def _probe(mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60, check=True, env=env
    )
    return out.stdout.strip()


def test_a_fixed_mmap_threshold_gives_large_messages_back_to_the_kernel() -> None:
    assert _probe("tune") == "['arena_max', 'mmap_threshold_bytes'] 1"
    assert _probe("none") == "[] 0"  # glibc's default, for comparison: the block came from the heap
