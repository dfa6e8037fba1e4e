"""glibc's allocator settings, the same for every job of a persistent worker.

`mallopt` changes process-wide settings that nothing can read back (glibc's `mp_` is private):
a job that left M_PERTURB (every block filled at malloc and free), M_TRIM_THRESHOLD and
M_TOP_PAD 0 (the heap's top trimmed back at every free) and M_MMAP_THRESHOLD at its ceiling
slowed every later honest job of its worker, unseen by any residue check (a numpy ReLU 69-76 ->
81-134 us a call: tests/verifier/test_redteam_round16.py). So the worker sets each of them at
its start and again at every settle (`pin`): what a job left is undone before the next one.

Setting a threshold ends glibc's dynamic mmap threshold for the process (it rises to the size
of the largest mmapped block freed, up to 32 MiB, and trims at twice that), so the values
pinned are that rule's ceiling, where a worker that has freed a large buffer ends anyway: blocks
up to 32 MiB come from the heap, the heap keeps up to 64 MiB free at its top. The arena bounds
take glibc's defaults for 64-bit (`M_ARENA_MAX` 0, "by cores", cannot be set back: 8 a core).
Without glibc's `mallopt` (musl) nothing is pinned, and `pin` says so once.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache

M_MXFAST, M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = 1, -1, -2, -3
M_MMAP_MAX, M_PERTURB, M_ARENA_TEST, M_ARENA_MAX = -4, -6, -7, -8
MIB = 1 << 20
# (parameter, value), in the order set: glibc's defaults, its dynamic thresholds' ceilings
PINNED = ((M_MXFAST, 128), (M_MMAP_THRESHOLD, 32 * MIB), (M_TRIM_THRESHOLD, 64 * MIB),
          (M_TOP_PAD, 128 << 10), (M_MMAP_MAX, 65536), (M_PERTURB, 0), (M_ARENA_TEST, 8),
          (M_ARENA_MAX, 8 * (os.cpu_count() or 1)))


@cache
def _mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libc's `mallopt`, or None (said once) where the C library has none."""
    fn = getattr(ctypes.CDLL(None), "mallopt", None)
    if fn is None:
        sys.stderr.write("kernelsynth verifier: the C library has no mallopt: allocator "
                         "settings a job changes are not undone between jobs\n")
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def pin() -> list[int]:
    """Set every setting of `PINNED`; the parameters glibc refused (none on glibc 2.26+)."""
    fn = _mallopt()
    if fn is None:
        return []
    return [param for param, value in PINNED if fn(param, value) != 1]
