"""Freed memory kept in the process for the next update: glibc's allocator, set for training.

A CPU update allocates and frees tens of megabytes every time: PQN's minibatch of 128 Pong frame
stacks is 14 MB as floats, and each layer's activations and gradients come on top. glibc's
malloc serves a block above its mmap threshold (128 KiB at first, raised as such blocks are
freed, up to 32 MiB) as a fresh mapping from the kernel, and gives the top of its heap back
once more than its trim threshold (twice the mmap threshold) lies free there. The next update's
tensors then fault their pages in again, 4 KiB at a time. On a 2-core Xeon, ``edgerl train
--preset pong-cpu`` made 105,956 minor page faults a second, and 15 with the two thresholds
fixed as below: 798 against 1,026 env steps/s (one run each; docs/performance.md,
"Gathering and reordering frames, and page faults").

:func:`keep_freed_memory` fixes them once per process with ``mallopt``, on every device (a
GPU trainer's host side allocates frames and batches too): glibc only (musl and other C
libraries have their own allocators, left alone; a 32-bit glibc refuses a 32 MiB threshold and
keeps its own), and neither where the user already sets it (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``'s ``glibc.malloc.*_threshold``: glibc reads
those at start). The cost: freed memory stays with the process instead of going back to the
system, up to :data:`TRIM_THRESHOLD` at the top of each of its heaps, and blocks below 32 MiB
now come from the heap, where freed ones can leave holes; on a Jetson that memory is the GPU's
too.
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
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    for option, value, env in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
    ):
        name = env.lower().removeprefix("malloc_").rstrip("_")  # mmap_threshold, trim_...
        if env in os.environ or f"glibc.malloc.{name}" in tunables:
            continue  # the user's (glibc read it at start)
        if libc.mallopt(option, value) == 1:
            _done.append(f"{name} {value >> 20} MiB")
    if _done:
        log.debug("glibc malloc: %s (freed memory kept for the next update)", ", ".join(_done))
    return _done
