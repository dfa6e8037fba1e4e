"""A worker process for the sampler's tests, started as this process's grandchild.

The judge never samples a process it started itself (`ptrace_sampler.Sampler._waited_here`: its
waits would take the sampler's ptrace stops), and a run's worker is never one: the sandbox's
wrapper starts it. A launcher child stands in for that wrapper here.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from typing import Any

# the worker dies with its launcher and the launcher with the test (PR_SET_PDEATHSIG): a test run
# killed mid-test must not leave a worker spinning for ever
LAUNCH = ("import ctypes, os, sys\npid = os.fork()\nif pid == 0:\n"
          "    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
          "    os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])\n"
          "_, status = os.waitpid(pid, 0)\nsys.exit(os.waitstatus_to_exitcode(status) % 256)\n")


def _dies_with_us() -> None:
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL


def spawn(code: str, **popen: Any) -> tuple[subprocess.Popen, int]:
    """(the launcher, the pid of the worker running `code`)."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH, code], preexec_fn=_dies_with_us,
                                **popen)
    children = f"/proc/{launcher.pid}/task/{launcher.pid}/children"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            pids = open(children).read().split()
        except OSError:
            pids = []
        if pids:
            return launcher, int(pids[0])
        time.sleep(0.01)
    launcher.kill()
    raise RuntimeError("the launcher started no worker")


def tasks_of(pid: int) -> list[int]:
    """The threads of process `pid` (none once it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def end(launcher: subprocess.Popen, worker: int) -> int:
    """End the worker (the launcher ends with it); the launcher's exit status."""
    if launcher.poll() is None:
        try:
            os.kill(worker, 9)
        except ProcessLookupError:
            pass
    return launcher.wait(timeout=30)


def wait_busy(pid: int, cpu_s: float = 1.0, timeout_s: float = 60.0) -> None:
    """Wait until process `pid` has used `cpu_s` of cpu (past its start and imports, into its
    loop: on a loaded host that is many seconds after it was started)."""
    tick = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return
        fields = stat[stat.rfind(")") + 2:].split()
        if (int(fields[11]) + int(fields[12])) / tick >= cpu_s:  # utime + stime
            return
        time.sleep(0.05)
