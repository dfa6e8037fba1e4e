"""Which samples in torch's libraries moved values and did no arithmetic: copies and fills.

The strict rule of `verifier.judge.ip_sampler` is a share of compute samples. Every honest run
spends time in torch copying: the harness's copy of each output into the judge's slot
(`direct_copy_kernel`: 22-38 of an honest ReLU's ~50 torch samples, a library share of
0.40-0.55). Counted as library compute, copies set the share the rule had to allow (0.85), and
a fallback whose own object spins for a third of the library's time passed under it
(tests/verifier/test_redteam_round5.py). The kernels of the dispatcher trace's `copy` and
`allocation` kinds (`verifier.checks.fallback.DATA_MOVEMENT`, `VALUE_FREE`: copy, cat, fill)
are named here; their samples count for nothing, as those ops do in the trace. Dispatch, the
profiler's hooks and Python argument parsing stay library time: a fallback of many small ops
spends most of its library time there, and dropping it would let a short spin outweigh the
arithmetic left. Honest library shares left: 0.00-0.25 (ip_sampler's docstring).

Only functions of torch's own install count (the file the judge's torch loaded, the same inode
the run mapped): a copy of libtorch anywhere else, with its symbol table rewritten to name its
ReLU `direct_copy_kernel`, is library arithmetic still. A sample no symbol names is arithmetic.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from verifier.judge.elf_symbols import symbols_of

# identifiers of aten's cpu kernels that only move or set values, as they appear mangled (length,
# name) after a name that does not end in a digit, or after aten's cpu-capability namespaces
MOVEMENT = ("direct_copy_kernel", "copy_kernel", "reduced_float_copy_kernel", "copy_impl",
            "copy_same_type_transpose_", "cat_serial_kernel", "fill_kernel",
            "fill_non_native_type")
_MOVEMENT = re.compile("(?:(?<![0-9])|(?<=AVX2)|(?<=AVX512))(?:" + "|".join(
    f"{len(n)}{n}" for n in MOVEMENT) + ")")


@lru_cache(maxsize=1)
def torch_lib() -> str:
    """The folder of the judge's torch libraries (real path), "" without torch."""
    try:
        import torch
    except ImportError:
        return ""
    return os.path.join(os.path.realpath(os.path.dirname(torch.__file__)), "lib") + "/"


def no_work(path: str, inode: int, file_offset: int) -> bool:
    """Whether a sample at `file_offset` of the run's mapping of `path` (file `inode`) is in
    one of torch's copy/fill kernels (see the module doc), not the task's arithmetic."""
    lib = torch_lib()
    if not lib or not path.startswith(lib):
        return False
    try:
        if os.stat(path).st_ino != inode:  # not the file the run mapped
            return False
    except OSError:
        return False
    symbols = symbols_of(path)
    name = symbols.name_at(file_offset) if symbols is not None else ""
    return is_movement(name)


def is_movement(name: str) -> bool:
    """Whether a mangled function name is one of aten's copy/fill kernels (or inside one)."""
    return bool(_MOVEMENT.search(name))
