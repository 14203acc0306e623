"""Host (CPU) memory: the process's peak resident set size, and giving freed heap pages back.

On CPU every tensor lives in the C allocator's heap. glibc keeps freed blocks below its (dynamic, up to
32 MiB) mmap threshold in the heap, so a phase's freed tensors (the rollout copy, the update's
activations) stay resident until something reuses or trims them. :func:`trim_host_allocator` returns
those pages after a phase that freed a lot; it changes no value and costs milliseconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from functools import cache
from typing import Any

__all__ = ["peak_rss_bytes", "trim_host_allocator"]


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far, in bytes.

    On Linux this is ``VmHWM`` of ``/proc/self/status``, the high-water mark of this process's own memory:
    ``getrusage``'s ``ru_maxrss`` survives ``exec``, so a CLI started from a large process (a notebook, a test
    runner) would report its parent's peak. Elsewhere ``ru_maxrss`` (bytes on macOS, KiB on the other Unixes)."""
    high_water = _linux_high_water_kib()
    if high_water is not None:
        return high_water * 1024
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


def _linux_high_water_kib() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    return lib if hasattr(lib, "malloc_trim") else None  # glibc only


def trim_host_allocator() -> bool:
    """Return the heap's free pages to the OS (glibc ``malloc_trim(0)``); ``False`` where there is none."""
    lib = _libc()
    if lib is None:
        return False
    lib.malloc_trim(ctypes.c_size_t(0))
    return True
