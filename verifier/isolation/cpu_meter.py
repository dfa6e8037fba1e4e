"""The cpu time a run burns, read by the judge (`verifier.judge.clock` charges what a run burns while
the judge fills a window's inputs). Read from outside the run, never asked of it.

A run's own cgroup counts every task that was ever in it, threads and processes that have
already exited included (cgroup v1 `cpuacct.usage`, ns; cgroup v2 `cpu.stat` usage_usec): a
helper thread that computes while the judge fills and exits before "w" is counted too. A sum
over a run's live threads (`schedstat`) would lose what an exited thread burnt, so no runner
meters that way (the tests keep one, to show what it misses).

Which group: cgroup v1 (a `cpuacct` hierarchy): a cpuacct group of its own, joined beside the
run's pids cgroup (another hierarchy). cgroup v2 (one hierarchy; a process is in exactly one
cgroup): the run's own cgroup, made here in the root the sandbox makes its run cgroups in, and
taken by the launcher as the run's cgroup (`verifier.isolation.sandbox.run_cgroup`: its pids limit, its
final kill); `cpu.stat` exists in every v2 group, cpu controller enabled or not. Where neither
can be made (a v2 host that delegates no writable subtree), runs are not metered and the
verifier says so once on stderr.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from verifier.isolation.cgroups import is_v2_cgroup, new_cgroup

_V1_ROOT = Path("/sys/fs/cgroup/cpuacct")
_V2_ROOT = Path("/sys/fs/cgroup")  # where `verifier.isolation.sandbox` makes its v2 run cgroups
_seq = itertools.count()
_said: set[str] = set()


def unmetered(why: str) -> None:
    """Say once per process (on stderr) that runs go unmetered, and why."""
    if why not in _said:
        _said.add(why)
        print(f"kernelsynth verifier: runs are not cpu-metered ({why}): cpu time a run burns "
              "while the judge fills its inputs, or after it answers a window, is not charged", file=sys.stderr)


def v2_usage_s(stat: Path) -> float | None:
    """`usage_usec` of a cgroup v2 `cpu.stat`, in seconds; None when unreadable."""
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        return None
    return None


def runnable(tasks: Iterable[str]) -> int:
    """How many of `tasks` (`/proc` paths of threads) are running or waiting for a cpu (state
    R). A thread that spins on a loaded host may get no cpu for ms while it waits its turn:
    its cpu time then says it is idle, its state does not (`verifier.judge.clock._quiet`)."""
    count = 0
    for task in tasks:
        try:
            with open(f"{task}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        count += stat[stat.rfind(b")") + 2:][:1] == b"R"  # the name may hold ") "
    return count


def run_meter(cgroup: Path | None) -> Callable[[], float] | None:
    """The meter of a run's existing cgroup where it is a cgroup v2 group (the persistent GPU
    worker's, `verifier.run.gpu_pool`), else None (a v1 pids group accounts no cpu time)."""
    group = CpuCgroup.of_v2(cgroup) if cgroup is not None else None
    if group is None:
        unmetered("the persistent worker's cgroup is " + ("none" if cgroup is None else "v1"))
        return None
    return group.cpu_s


def run_runnable(cgroup: Path | None) -> Callable[[], int] | None:
    """How many threads of a run's existing cgroup v2 group are runnable (`run_meter`'s)."""
    group = CpuCgroup.of_v2(cgroup) if cgroup is not None else None
    return group.runnable if group is not None else None


class CpuCgroup:
    """A cgroup of its own for one run (cpu accounting only: it limits nothing); its
    `path` is joined by the run's first process (`verifier.isolation.sandbox.SandboxLimits.cpu_cgroup`)."""

    def __init__(self, path: Path, usage: Path, scale: float) -> None:
        self.path, self._usage, self._scale = path, usage, scale

    @classmethod
    def make(cls, v1_root: Path | None = None, v2_root: Path | None = None
             ) -> CpuCgroup | None:
        """A fresh group for one run: cgroup v1 cpuacct, else the run's own cgroup v2 group
        (see the module docstring); None (said once on stderr) where neither can be made."""
        v1_root, v2_root = v1_root or _V1_ROOT, v2_root or _V2_ROOT
        if (v1_root / "cpuacct.usage").exists():
            path = v1_root / f"ks-cpu-{os.getpid()}-{next(_seq)}"
            try:
                path.mkdir()
            except OSError:
                return None
            return cls(path, path / "cpuacct.usage", 1e-9)
        if not is_v2_cgroup(v2_root):
            unmetered("no cgroup v1 cpuacct hierarchy and no cgroup v2 at " + str(v2_root))
            return None
        path = new_cgroup(v2_root)
        group = cls.of_v2(path) if path is not None else None
        if group is None:
            if path is not None:
                with contextlib.suppress(OSError):  # made a moment ago, empty: it goes at once
                    path.rmdir()
            unmetered(f"cgroup v2 without a writable delegated subtree at {v2_root}")
        return group

    @classmethod
    def of_v2(cls, path: Path) -> CpuCgroup | None:
        """The meter of an existing cgroup v2 group (a run's own), or None where `path` is no
        v2 group with a readable `cpu.stat`."""
        if not is_v2_cgroup(path) or v2_usage_s(path / "cpu.stat") is None:
            return None
        return cls(path, path / "cpu.stat", 1e-6)

    def cpu_s(self) -> float:
        """Seconds on a cpu of every task that was ever in the group."""
        if self._usage.name == "cpu.stat":
            return v2_usage_s(self._usage) or 0.0
        try:
            return int(self._usage.read_text().split()[0]) * self._scale
        except (OSError, ValueError, IndexError):
            return 0.0

    def runnable(self) -> int:
        """How many of the group's threads are running or waiting for a cpu."""
        listing = self.path / ("cgroup.threads" if self._usage.name == "cpu.stat" else "tasks")
        try:
            tids = listing.read_text().split()
        except OSError:
            return 0
        return runnable(f"/proc/{tid}" for tid in tids)

    def remove(self, wait_s: float | None = None) -> None:
        """Remove the group once its tasks are gone (the run's sandbox killed them; the kernel
        may take a moment to reap them). A v2 group is the run's own cgroup, left to the
        judge by the launcher: waited for as long as the launcher waits for its own."""
        v2 = self._usage.name == "cpu.stat"
        deadline = time.monotonic() + (wait_s if wait_s is not None else 15.0 if v2 else 2.0)
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:  # left empty-to-be: harmless, and named
                    return
                time.sleep(0.05)
