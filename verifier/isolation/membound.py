"""Host memory bound of a process tree where RLIMIT_AS cannot be used (the GPU worker: the CUDA
driver reserves terabytes of virtual address space, so an address-space limit either breaks it
or, at 0, bounds nothing).

In order of preference, `host_memory_bound` gives the run
1. cgroup v2: `memory.max` (and `memory.swap.max` 0) on the run's own cgroup, the one its pids
   limit is in, when the memory controller is enabled there;
2. cgroup v1: a cgroup of its own in the writable `memory` hierarchy with
   `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`, no swap beyond it);
3. else RLIMIT_DATA (since Linux 4.7 it counts the heap and every private writable mapping, so
   `malloc`/`mmap` bombs hit it, while the driver's PROT_NONE address reservations do not).
The kernel charges a cgroup for every page its processes touch (tmpfs files included) and kills
the tree past the limit; the candidate cannot raise it (the files are root's, outside its view).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
_seq = itertools.count()


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def host_memory_bound(limit_mb: int, pids_cgroup: Path | None
                      ) -> tuple[Path | None, int, str]:
    """(a memory cgroup for the run to join, or None; RLIMIT_DATA in MB to set, or 0; which
    bound applies, in words). `pids_cgroup` is the run's cgroup from `make_pids_cgroup`."""
    if limit_mb <= 0:
        return None, 0, "no host memory bound (none asked for)"
    limit = str(limit_mb << 20)
    if pids_cgroup is not None:  # cgroup v2: the same directory holds every controller
        ctl = pids_cgroup.parent / "cgroup.subtree_control"
        if not (pids_cgroup / "memory.max").exists() and ctl.exists():
            _write(ctl, "+memory")  # delegated but not enabled yet: enable it (may be refused)
        if (pids_cgroup / "memory.max").exists() and _write(pids_cgroup / "memory.max", limit):
            _write(pids_cgroup / "memory.swap.max", "0")
            return None, 0, f"cgroup v2 memory.max {limit_mb} MB ({pids_cgroup})"
    if (V1_ROOT / "memory.limit_in_bytes").exists():
        path = V1_ROOT / f"ks-mem-{os.getpid()}-{next(_seq)}"
        try:
            path.mkdir()
        except OSError:
            path = None
        if path is not None:
            if _write(path / "memory.limit_in_bytes", limit):
                if (path / "memory.memsw.limit_in_bytes").exists():
                    _write(path / "memory.memsw.limit_in_bytes", limit)
                return path, 0, f"cgroup v1 memory.limit_in_bytes {limit_mb} MB ({path})"
            try:
                path.rmdir()
            except OSError:
                pass
    return None, limit_mb, f"RLIMIT_DATA {limit_mb} MB (no writable memory cgroup)"
