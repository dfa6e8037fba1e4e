"""A GPU batch's compilers keep off the cores its timing lanes need (`verifier.isolation.
cpu_bound.compile_cores`, `verifier.backends.compile_cpus`): the partition chosen for a host,
and the affinity a compiler started through `niced` really has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from verifier.backends import compile_cpus, niced
from verifier.isolation.cpu_bound import compile_cores


def test_a_gpu_host_keeps_a_core_for_the_batch_and_two_a_lane(monkeypatch) -> None:
    monkeypatch.delenv("KS_TIMING_CORES", raising=False)
    assert compile_cores(1, list(range(16))) == list(range(3, 16))
    assert compile_cores(2, list(range(32))) == list(range(5, 32))
    # cpus as the affinity lists them: the kept ones are the lowest, whatever their numbers
    assert compile_cores(1, [8, 9, 10, 11, 12, 13, 14, 15]) == [11, 12, 13, 14, 15]


def test_a_small_host_or_too_many_lanes_is_not_partitioned(monkeypatch) -> None:
    monkeypatch.delenv("KS_TIMING_CORES", raising=False)
    assert compile_cores(1, [0, 1]) is None  # this CI machine: compilers may use both
    assert compile_cores(4, list(range(16))) is None  # 9 kept of 16: compiles would starve


def test_the_number_kept_can_be_set_or_switched_off(monkeypatch) -> None:
    monkeypatch.setenv("KS_TIMING_CORES", "0")
    assert compile_cores(1, list(range(16))) is None
    monkeypatch.setenv("KS_TIMING_CORES", "5")
    assert compile_cores(1, list(range(16))) == list(range(5, 16))


@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset (util-linux)")
def test_a_compiler_started_in_the_block_runs_on_those_cpus_only() -> None:
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    mine = sorted(os.sched_getaffinity(0))
    with compile_cpus(mine[-1:]):
        inside = subprocess.run(niced(probe), capture_output=True, text=True, check=True)
    outside = subprocess.run(niced(probe), capture_output=True, text=True, check=True)
    assert inside.stdout.strip() == str(mine[-1:])
    assert outside.stdout.strip() == str(mine)
