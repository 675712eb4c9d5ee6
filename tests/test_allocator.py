"""glibc's allocator keeps freed memory for the next update (edgerl/hw/allocator.py): measured by
the page faults a fresh process makes allocating and freeing what an update does, with and
without the setting."""

from __future__ import annotations

import ast
import os

import pytest

from edgerl.hw.allocator import _glibc

from .helpers import fresh_python_lines

pytestmark = [
    pytest.mark.skipif(_glibc() is None, reason="glibc's allocator only"),
    pytest.mark.skipif("LD_PRELOAD" in os.environ, reason="another allocator may be preloaded"),
]

# Two 30 MB blocks taken from malloc, written and freed, six times (a PQN update's float
# minibatch and activations are of that size): the minor page faults of each round. Through
# ctypes, not NumPy, which asks for huge pages for large arrays (fewer, larger faults).
PROBE = """
import ctypes, resource, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
if sys.argv[1] == "keep":
    from edgerl.hw.allocator import keep_freed_memory
    print(keep_freed_memory())
else:
    print([])
size = 30 << 20
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a, b = libc.malloc(size), libc.malloc(size)
    ctypes.memset(a, 1, size)
    ctypes.memset(b, 1, size)
    libc.free(a)
    libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults)
"""


def probe(mode: str, **env: str) -> tuple[list[str], list[int]]:
    """(what was set, faults per round) in a fresh process."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    out = fresh_python_lines(PROBE, mode, env={**clean, **env})
    return ast.literal_eval(out[0]), ast.literal_eval(out[1])


def test_freed_memory_is_kept_and_not_faulted_in_again() -> None:
    plain_set, plain = probe("plain")
    kept_set, kept = probe("keep")
    assert plain_set == [] and kept_set == ["mmap_threshold 32 MiB", "trim_threshold 256 MiB"]
    # glibc's defaults give the freed blocks back and fault them in again every round; kept,
    # the rounds after the first reuse them
    assert sum(plain[1:]) > 1000, plain
    assert sum(kept[1:]) < sum(plain[1:]) / 10, (kept, plain)


def test_a_threshold_the_environment_sets_is_left_alone() -> None:
    kept_set, _ = probe("keep", MALLOC_TRIM_THRESHOLD_="1048576")
    assert kept_set == ["mmap_threshold 32 MiB"]
    kept_set, _ = probe("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=1048576")
    assert kept_set == ["trim_threshold 256 MiB"]
