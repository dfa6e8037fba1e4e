"""Cgroups a verifier left behind when it was SIGKILLed: found and removed at the next start.

A run's cgroups (the pids cgroup `ks-sbx-<pid>-<n>` of `verifier.isolation.sandbox`, the cgroup v1
memory cgroup `ks-mem-<pid>-<n>` of `verifier.isolation.membound`, the writability probe
`ks-probe-<pid>`) carry the process that made them in their name; that process removes them
when the run ends. If it is killed first they stay, with any process a candidate left in them.
`reap_stale_cgroups` (called by `verify_batch`) kills what is left in each cgroup whose owner
no longer exists and removes it. A live owner's cgroups are never touched; a reused pid only
delays the cleanup, never removes a live run's cgroup.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from verifier.isolation.cgroups import PIDS_ROOTS, kill_cgroup
from verifier.isolation.membound import V1_ROOT

_OURS = re.compile(r"ks-(?:sbx|mem|probe)-(\d+)(?:-\d+)?")


def owner_alive(pid: int) -> bool:
    """Does a process with this pid exist (in this pid namespace)?"""
    if pid <= 0:
        return True  # not a pid we wrote: never treat it as dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def cgroup_roots() -> list[Path]:
    """Every directory the verifier makes cgroups in (pids v1 or v2, memory v1)."""
    return [p for p in dict.fromkeys([*map(Path, PIDS_ROOTS), V1_ROOT]) if p.is_dir()]


def stale_cgroups(roots: Iterable[Path]) -> list[Path]:
    """The verifier's cgroups under `roots` whose owning process is gone."""
    out = []
    for root in roots:
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            m = _OURS.fullmatch(name)
            if m and (root / name).is_dir() and not owner_alive(int(m.group(1))):
                out.append(root / name)
    return out


_stuck: set[Path] = set()  # could not be removed (an unkillable task): not tried again


def reap_stale_cgroups(roots: Iterable[Path] | None = None, wait_s: float = 2.0) -> list[Path]:
    """Kill what is left in each stale cgroup and remove it; the cgroups removed. One that
    will not go is reported once on stderr and left (it costs each later batch nothing)."""
    removed = []
    for path in stale_cgroups(cgroup_roots() if roots is None else roots):
        if path in _stuck:
            continue
        kill_cgroup(path, wait_s=wait_s)
        if path.exists():
            _stuck.add(path)
            print(f"kernelsynth verifier: stale cgroup {path} could not be removed",
                  file=sys.stderr)
        else:
            removed.append(path)
    return removed
