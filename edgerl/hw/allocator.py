"""Freed memory kept in the process for the next update: glibc's allocator, set for training.

A CPU update allocates and frees tens of megabytes every time: PQN's minibatch of 128 Pong frame
stacks is 14 MB as floats, and each layer's activations and gradients come on top. glibc's
malloc serves a block above its mmap threshold (128 KiB at first, raised as such blocks are
freed, up to 32 MiB) as a fresh mapping from the kernel, and gives the top of its heap back
once more than its trim threshold (twice the mmap threshold) lies free there. The next update's
tensors then fault their pages in again, 4 KiB at a time. On a 2-core Xeon PQN's update at
batch 128 made 4,400 to 13,000 minor page faults and took 50-56 ms; with the two thresholds
fixed as below, 10-45 faults and 42-44 ms (one run each, docs/performance.md, "Page faults").

:func:`keep_freed_memory` fixes them once per process with ``mallopt``: glibc only (musl and
other C libraries have their own allocators, left alone), and neither where the environment
already sets it (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``: glibc reads those at
start). The cost: up to :data:`TRIM_THRESHOLD` bytes of freed memory stay with the process
instead of going back to the system; the peak does not grow.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks up to this come from the heap (glibc's own dynamic cap)
TRIM_THRESHOLD = 256 << 20  # freed memory at the heap's top kept up to this

_done: list[str] | None = None  # what was set, once per process


def _glibc() -> ctypes.CDLL | None:
    """The running glibc (None: another C library, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> list[str]:
    """Fix glibc's mmap and trim thresholds (see the module docstring) unless the environment
    sets them; returns what was set, in words (empty: nothing, or not glibc). Once per
    process: later calls return the first call's answer."""
    global _done
    if _done is not None:
        return _done
    _done = []
    libc = _glibc()
    if libc is None:
        return _done
    for option, value, env in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
    ):
        if env in os.environ:
            continue  # the user's (glibc read it at start)
        if libc.mallopt(option, value) == 1:
            _done.append(f"{env.lower().strip('_').removeprefix('malloc_')} {value >> 20} MiB")
    if _done:
        log.debug("glibc malloc: %s (freed memory kept for the next update)", ", ".join(_done))
    return _done
