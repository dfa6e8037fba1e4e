"""The cgroups a run lives in: a pids controller to make them under, a fresh one per run, how
a process joins one, and how one is emptied and removed (`verifier.isolation.sandbox` puts each run in
one; `verifier.isolation.cpu_meter` meters one; `verifier.isolation.stale_cgroups` removes those left behind)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import time
from pathlib import Path

PIDS_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")
_cgroup_seq = itertools.count()


@functools.cache
def pids_cgroup_root() -> Path | None:
    """A cgroup directory with a writable `pids` controller, or None."""
    for root in map(Path, PIDS_ROOTS):
        probe = root / f"ks-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "pids.max").exists():
                return root
        finally:
            try:
                probe.rmdir()
            except OSError:
                pass
    return None


def new_cgroup(root: Path) -> Path | None:
    """A fresh cgroup `ks-sbx-<pid>-<n>` under `root` (`verifier.isolation.stale_cgroups` finds it if
    this process dies first), or None where none can be made."""
    path = root / f"ks-sbx-{os.getpid()}-{next(_cgroup_seq)}"
    try:
        path.mkdir()
    except OSError:
        return None
    return path


def make_pids_cgroup(limit: int) -> Path | None:
    root = pids_cgroup_root()
    path = new_cgroup(root) if root is not None else None
    if path is None:
        return None
    try:
        (path / "pids.max").write_text(str(limit))
    except OSError:
        with contextlib.suppress(OSError):  # empty: it goes at once
            path.rmdir()
        return None
    return path


def is_v2_cgroup(path: Path) -> bool:
    """Is `path` a cgroup v2 group (the unified hierarchy has `cgroup.controllers` in each)?"""
    return (path / "cgroup.controllers").is_file()


def kill_cgroup(path: Path, attempts: int = 50, wait_s: float = 15.0,
                remove: bool = True) -> int:
    """SIGKILL every process in the cgroup until it is empty, then (`remove`) remove it
    (waiting up to `wait_s` for the kernel to let it go); returns kills."""
    killed = 0
    for _ in range(attempts):
        try:
            pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except OSError:
            break
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    if not remove:
        return killed
    deadline = time.monotonic() + wait_s  # killed tasks may take a while to be reaped under load
    while True:
        try:
            path.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    return killed


def join_cgroup(cgroup: Path | None) -> None:
    """Move the calling process into `cgroup` (its pids limit then covers all descendants)."""
    if cgroup is not None:
        with open(cgroup / "cgroup.procs", "w") as fh:
            fh.write(str(os.getpid()))


def join_meter(cgroup: str) -> None:
    """Join the judge's cpu-accounting cgroup (`verifier.isolation.cpu_meter`); where that fails the run
    goes on unmetered (the judge then charges nothing: it limits nothing), and says so."""
    if cgroup:
        try:
            join_cgroup(Path(cgroup))
        except OSError as exc:
            os.write(2, f"kernelsynth: this run's cpu time is not metered: {exc}\n".encode())
