"""A run's cores are a bound (`verifier.isolation.cpu_bound`): a sandboxed run is pinned to the cpus it is
granted, cannot widen them (seccomp answers EPERM on every ABI), and OpenMP sees only them
(red-team round 4's omp_more_cores: `num_threads(8)` where one core was given)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verifier.isolation.cpu_bound import CpuGrants, bind_cpus
from verifier.isolation.sandbox import SandboxLimits, run_sandboxed

ROOT = Path(__file__).resolve().parents[2]
ONE = sorted(os.sched_getaffinity(0))[-1]
WIDEN = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
from verifier.isolation.cpu_bound import bind_cpus
note = bind_cpus([{ONE}]) if sys.argv[1] == "bind" else ""
try:
    os.sched_setaffinity(0, set(range(os.cpu_count())))
    widened = "yes"
except OSError as exc:
    widened = exc.strerror
print(json.dumps({{"note": note, "cpus": sorted(os.sched_getaffinity(0)), "widened": widened}}))
"""
OMP = r"""
#include <omp.h>
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec w0, w1, c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    int used = 0;
    #pragma omp parallel num_threads(8)
    {
        #pragma omp single
        used = omp_get_num_threads();
        volatile double s = 0;
        for (long i = 0; i < 60000000L; ++i) s += i * 1e-9;
    }
    clock_gettime(CLOCK_MONOTONIC, &w1);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double wall = (w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) * 1e-9;
    double cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
    printf("{\"procs\": %d, \"threads\": %d, \"cores\": %.3f}\n", omp_get_num_procs(), used,
           cpu / wall);
    return 0;
}
"""
# i386's sched_setaffinity (241) through int 0x80 from a 64-bit process: the compat entry.
I386 = r"""
#include <stdio.h>
int main(void) {
    static unsigned long mask = ~0UL;
    long ret;
    __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(241), "b"(0), "c"(8), "d"(&mask) : "memory");
    printf("%ld\n", ret);
    return 0;
}
"""


def test_a_bound_run_cannot_widen_its_cpus() -> None:
    out = subprocess.run([sys.executable, "-c", WIDEN, "bind"], capture_output=True, text=True,
                         timeout=60)
    got = json.loads(out.stdout)
    assert got == {"note": "", "cpus": [ONE], "widened": "Operation not permitted"}, out.stderr
    free = json.loads(subprocess.run([sys.executable, "-c", WIDEN, "free"], capture_output=True,
                                     text=True, timeout=60).stdout)
    assert free["widened"] == "yes"  # the control: an unbound process widens


def test_nothing_to_bind_is_no_bound() -> None:
    assert bind_cpus([]) == ""


@pytest.mark.skipif(platform.machine() != "x86_64" or not shutil.which("gcc"),
                    reason="the compat entry is x86-64's")
def test_the_i386_entry_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "c.c").write_text(I386)
    subprocess.run(["gcc", "-O1", str(tmp_path / "c.c"), "-o", str(tmp_path / "c")], check=True,
                   timeout=120)
    runner = (f"import os, sys; sys.path.insert(0, {str(ROOT)!r}); "
              f"from verifier.isolation.cpu_bound import bind_cpus; assert bind_cpus([{ONE}]) == ''; "
              f"os.execv({str(tmp_path / 'c')!r}, ['c'])")
    out = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0 and not out.stdout:
        pytest.skip(f"this kernel has no i386 entry (the probe ended with {out.returncode})")
    assert out.stdout.strip() == "-1", out  # -EPERM, before the kernel reads the mask


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc with OpenMP")
def test_openmp_in_a_sandboxed_run_gets_the_one_core_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "omp.c").write_text(OMP)
    subprocess.run(["gcc", "-O1", "-fopenmp", str(tmp_path / "omp.c"), "-o",
                    str(tmp_path / "omp")], check=True, timeout=120)
    res = run_sandboxed([str(tmp_path / "omp")], workdir=tmp_path / "run",
                        limits=SandboxLimits(timeout_s=120, isolate=False, cpus=[ONE]))
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["procs"] == 1 and got["cores"] <= 1.1, got  # 8 threads, one core's time


def test_both_launchers_bind_the_run(tmp_path: Path) -> None:
    from verifier.run.forkserver import ForkServer

    limits = SandboxLimits(timeout_s=60, cpus=[ONE], isolate=False, isolate_network=False)
    spawned = run_sandboxed([sys.executable, "-c", WIDEN, "free"], workdir=tmp_path / "s",
                            limits=limits)
    assert json.loads(spawned.stdout)["cpus"] == [ONE], spawned.stderr
    assert json.loads(spawned.stdout)["widened"] == "Operation not permitted"
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "ks_widen_probe.py").write_text(WIDEN.replace('sys.argv[1] == "bind"',
                                                                      "False"))
    with ForkServer(preload=(), env={"PYTHONPATH": f"{ROOT}:{tmp_path / 'mod'}"}) as server:
        res = server.run_module("ks_widen_probe", workdir=tmp_path / "f", limits=limits)
    assert res.extra.get("forked"), res.stderr
    assert json.loads(res.stdout) == {"note": "", "cpus": [ONE],
                                      "widened": "Operation not permitted"}, res.stderr


def test_grants_spread_over_the_cpus_and_come_back() -> None:
    grants = CpuGrants([0, 1, 2, 3])
    a, b = grants.take(1), grants.take(2)
    assert a == [0] and b == [1, 2]
    assert grants.take(2) == [0, 3]  # cpu 3 is free, then the least held
    grants.give(b)
    assert grants.take(1) == [1]
    assert CpuGrants([5]).take(4) == [5]
