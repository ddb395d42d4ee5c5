"""glibc malloc settings for a daemon that moves multi-megabyte bodies.

A 2.2 MB tool result crosses the daemon as a 4.4 MB hex body, its decoded bytes, a few nested
protobuf copies and the decoded text: a dozen short-lived buffers of megabytes. glibc serves
anything over 128 KiB with a fresh ``mmap`` and returns it on ``free``, so every one of those
buffers is faulted in page by page (~2.5 us a page on the development VM: 7 ms to parse one
BidiAppend, 11 ms for the exec result inside it). Serving big blocks from the heap and keeping a
bounded amount of freed heap mapped turns those parses into memcpy speed (0.6 and 0.9 ms).

The price is that up to ``TRIM_THRESHOLD`` bytes of freed heap stay resident after a large turn.

One arena for every thread (``ARENA_MAX``). glibc gives each thread that allocates its own arena,
and memory freed into one arena is reused only by allocations from that arena: a history the
store's worker decoded and the trio thread later dropped left 30 MiB of free pages that the trio
thread's next allocations could not use, so it faulted in fresh ones. One arena reuses them. In
four back-to-back pairs (bench 1 with bench 4 or 3) it lowered the growing-conversation TTFT p50
in every pair and the commit and concurrency p99 in each pair that ran them; the daemon's
resident growth after an idle release of a 5,000-message conversation went from about 25 to 12
MiB. The GIL already serialises nearly all allocation, so the shared arena's lock did not show.

Other platforms' allocators are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

# mallopt(3) parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

# Blocks below this come from the heap (glibc's ceiling for the setting on 64-bit is 32 MiB).
MMAP_THRESHOLD = 32 * 1024 * 1024
# Free heap above this much is returned to the OS.
TRIM_THRESHOLD = 64 * 1024 * 1024
# Every thread allocates from the main arena.
ARENA_MAX = 1


@functools.cache  # loaded once; the upkeep between runs asks for it each time it runs
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        # musl and others have no mallopt / malloc_trim: AttributeError.
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator() -> bool:
    """Apply the settings; False where the C library is not glibc (nothing changed)."""
    libc = _glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success. Before any thread but the main one has allocated: an arena
    # a thread already has stays its own.
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_ARENA_MAX, ARENA_MAX),
    )
    return all([bool(libc.mallopt(param, value)) for param, value in settings])


def release_free_memory() -> bool:
    """Hand freed heap back to the OS (``malloc_trim(0)``): for when the daemon goes idle, since
    the settings above keep up to ``TRIM_THRESHOLD`` of it resident after a large turn. False
    where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))
