"""What the tests of the judge's instruction-pointer sampler share (test_ip_sampler.py,
test_library_work.py, red-team rounds 5 to 7): the run's own object (a spin loop of known
cost), a judge with nothing to check, the worker that serves the sampling clock's windows over
its FIFOs, one sampled run of such a worker, and the calibration of a padded fallback's spin.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sampled_child import end, spawn

from verifier.judge import ip_sampler as ips

ROOT = Path(__file__).resolve().parents[2]
NEEDS_PTRACE = pytest.mark.skipif(bool(ips.unavailable()), reason=ips.unavailable() or "ok")
SPIN_C = "double spin(long n){double s=0;for(long i=0;i<n;i++)s+=i*0.5/(i+1.0);return s;}\n"
# one thread of BLAS: the sampled worker is one thread, as its cgroup's task list says
CHILD_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
             "PYTHONPATH": str(ROOT)}
# torch before the windows, as in the real worker: serve_windows imports it at its first
# call's output check, and on a loaded host (load 10, 2 cores) that import inside the first
# timed window outlasted the clock's 60 s wait ("did not finish a timing window in time")
WORKER = """
import ctypes, sys
import torch
from verifier.judge.clock_serve import open_worker_pipes, serve_windows
{setup}
serve_windows(open_worker_pipes(), call, [[0]], lambda i, out: None, lambda: None)
"""


def build_spin(folder: Path, name: str) -> Path:
    """The run's own object: SPIN_C built as `folder`/`name`."""
    (folder / "spin.c").write_text(SPIN_C)
    so = folder / name
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(so), str(folder / "spin.c")],
                   check=True)
    return so


class NoCheckJudge:
    """A judge with nothing to check: these tests are about where the calls' time goes."""

    copy_s, sets, out_bytes = 0.0, 4, 0

    def fill(self, n: int) -> None:
        return None

    def check(self, n: int, deep: bool = False) -> str:
        return ""


def median(xs: list[float]) -> float:
    """The middle value of `xs` (the upper one of an even count)."""
    return sorted(xs)[len(xs) // 2]


def pad_to(work: str, share: float) -> str:
    """Worker code that sets `pad`: the count of spins of the own object (`lib`) that take
    `share` of the cpu time of `work` (the code of a callable). Each cost is the median cpu
    time of 21 calls (the mean wall time of the first 20, warm-up and a loaded host's stalls
    included, made the spin as long as the library's work: a 50% share)."""
    return f"""

def median_s(f):
    took = []
    for _ in range(21):
        t0 = time.thread_time()
        f()
        took.append(time.thread_time() - t0)
    return sorted(took)[10]


lib_s = median_s({work})
pad = max(1000, int(100000 * {share} * lib_s / median_s(lambda: lib.spin(100000))))
"""


def sampled_run(work: Path, body: str, spin: Path, own_n: int = 0,
                clock: ips.SamplingClock | None = None,
                started: Callable[[int], None] = lambda worker: None,
                ) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """The sampling clock's result for a worker running `body` (a setup that logs "<mode>
    <seconds>" per call to {log}, a file the judge never reads), and that log. `clock`: the
    clock to serve (a SamplingClock of NoCheckJudge by default); `started`: told the worker's
    pid as it starts (to meter it)."""
    log = work / "calls.log"
    setup = body.format(log=str(log), spin=str(spin), own_n=own_n)
    clock = clock or ips.SamplingClock(NoCheckJudge(), workdir=work, wait_s=60.0)
    with open(work / "worker.stderr", "w") as err:
        child, worker = spawn(WORKER.format(setup=setup), cwd=work, env=CHILD_ENV, stderr=err)
    started(worker)
    cgroup = work / "cgroup"  # what the runner hands over: a task list, the objects
    cgroup.mkdir()
    (cgroup / "tasks").write_text(f"{worker}\n")  # one thread (OPENBLAS_NUM_THREADS=1)
    clock.sample_tasks(cgroup, {str(spin)})
    try:
        rc = child.wait(timeout=180)
    finally:
        end(child, worker)
    assert rc == 0 and log.exists(), (rc, (work / "worker.stderr").read_text()[-2000:])
    calls = [(ln.split()[0], float(ln.split()[1])) for ln in log.read_text().splitlines()]
    return clock.result(), calls
