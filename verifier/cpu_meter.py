"""The cpu time a run burns, read by the judge (`verifier.clock` charges what a run burns while
the judge fills a window's inputs). Read from outside the run, never asked of it.

A run's own cgroup counts every task that was ever in it, threads and processes that have
already exited included (cgroup v1 `cpuacct.usage`, ns; cgroup v2 `cpu.stat` usage_usec): a
helper thread that computes while the judge fills and exits before "w" is counted too. Where no
cgroup can be made, `threads_meter` sums the live threads of known processes (`schedstat`, ns);
what an exited thread burnt is then lost, so it is the fallback, not the rule.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

_V1_ROOT = Path("/sys/fs/cgroup/cpuacct")
_seq = itertools.count()


def threads_cpu_s(pids: Iterable[int]) -> float:
    """Seconds on a cpu of the live threads of `pids` (a thread that is gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def threads_meter(pids: Iterable[int]) -> Callable[[], float]:
    """A meter of the live threads of `pids`."""
    fixed = list(pids)
    return lambda: threads_cpu_s(fixed)


class CpuCgroup:
    """A cgroup of its own for one run (cpu accounting only: it limits nothing); its
    `path` is joined by the run's first process (`verifier.sandbox.SandboxLimits.cpu_cgroup`)."""

    def __init__(self, path: Path, usage: Path, scale: float) -> None:
        self.path, self._usage, self._scale = path, usage, scale

    @classmethod
    def make(cls) -> CpuCgroup | None:
        """A fresh cgroup v1 cpuacct group, or None where this host cannot make one (cgroup v2
        hosts: the run's pids cgroup cannot be left for another, see the module docstring)."""
        if not (_V1_ROOT / "cpuacct.usage").exists():
            return None
        path = _V1_ROOT / f"ks-cpu-{os.getpid()}-{next(_seq)}"
        try:
            path.mkdir()
        except OSError:
            return None
        return cls(path, path / "cpuacct.usage", 1e-9)

    def cpu_s(self) -> float:
        """Seconds on a cpu of every task that was ever in the group."""
        try:
            return int(self._usage.read_text().split()[0]) * self._scale
        except (OSError, ValueError, IndexError):
            return 0.0

    def remove(self, wait_s: float = 2.0) -> None:
        """Remove the group once its tasks are gone (the run's sandbox killed them; the kernel
        may take a moment to reap them)."""
        deadline = time.monotonic() + wait_s
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
