"""A run's cores as a bound, not a request: the cpus it is granted and no other.

OMP_NUM_THREADS and torch.set_num_threads ask a run to use its one core; `#pragma omp parallel
num_threads(8)` ignores them. `bind_cpus` (called by `sandbox.apply_limits` in the sandboxed
child, before the run's code) pins the process to the granted cpus with sched_setaffinity, so
every thread it ever starts shares them, and installs a seccomp filter (no root needed: it sets
`no_new_privs` first) that answers EPERM to sched_setaffinity, on every ABI the kernel offers
the machine (x86-64, its x32 and i386 entries; aarch64 and arm), so the run cannot widen its
set again. OpenMP reads the affinity: `omp_get_num_procs()` is the grant. Where the kernel has
no seccomp the pin still holds for well-behaved code and the run is told so on its stderr; the
judge's clock charges a window its cpu time over the granted cores either way
(`verifier.judge.clock`). `CpuGrants` hands concurrent runs the cpus fewest runs hold now.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import threading

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS_W, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
# (audit arch, sched_setaffinity numbers) for each ABI a process on this machine may call in
_ABIS = {
    "x86_64": [(0xC000003E, (203, 0x40000000 | 203)), (0x40000003, (241,))],
    "aarch64": [(0xC00000B7, (122,)), (0x40000028, (241,))],
}


class CpuGrants:
    """Cpus for concurrent runs: each grant takes the cpus fewest current grants hold."""

    def __init__(self, cpus: list[int] | None = None):
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self.held = dict.fromkeys(self.cpus, 0)
        self.lock = threading.Lock()

    def take(self, n: int) -> list[int]:
        """`n` cpus (all of them when n covers them), least held first."""
        with self.lock:
            picked = sorted(sorted(self.cpus, key=lambda c: self.held[c])[:max(1, n)])
            for c in picked:
                self.held[c] += 1
            return picked

    def give(self, cpus: list[int]) -> None:
        with self.lock:
            for c in cpus:
                self.held[c] = max(0, self.held.get(c, 0) - 1)


def _filter(abis: list[tuple[int, tuple[int, ...]]]) -> bytes:
    """A classic BPF program: EPERM for sched_setaffinity on each listed ABI, allow the rest."""
    prog: list[tuple[int, int, int, int]] = []
    for arch, nrs in abis:
        body = [(_LD_ABS_W, 0, 0, 0)]  # the syscall number
        body += [(_JEQ_K, len(nrs) - i, 0, nr) for i, nr in enumerate(nrs)]  # to the EPERM
        body += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
        prog += [(_LD_ABS_W, 0, 0, 4), (_JEQ_K, 0, len(body), arch), *body]  # else: next ABI
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def bind_cpus(cpus: list[int]) -> str:
    """Pin the calling (single-threaded) process to `cpus` for good; what could not be done."""
    if not cpus:
        return ""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        return f"the run is not pinned to cpus {cpus}: {exc}"
    abis = _ABIS.get(platform.machine())
    if abis is None:
        return f"the run may widen its cpus ({platform.machine()}: no seccomp filter known)"
    code = _filter(abis)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("HxxxxxxP", len(code) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    pbuf = ctypes.create_string_buffer(prog, len(prog))
    if (libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0
            or libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(pbuf), 0,
                          0) != 0):
        return f"the run may widen its cpus (seccomp: {os.strerror(ctypes.get_errno())})"
    return ""


# A GPU's launch-bound timings are host work: a call of a small kernel is its launch, and a
# worker thread that waits for a cpu behind a batch's compilers is a slower call. On an H100
# node a 4 MB ReLU timed at 24-29 us in a quiet stretch of a batch and at 47 us while 16
# compilers shared the node's 16 cores (benchmarks/results/redteam_cuda.md, session 16).
TIMING_CORES_PER_LANE, TIMING_CORES_MIN_HOST = 2, 8  # a lane: its worker and its referee


def compile_cores(lanes: int, cpus: list[int] | None = None) -> list[int] | None:
    """The cpus a batch's compilers may use while `lanes` GPU lanes time candidates: all but
    one for the batch's own judge threads and `TIMING_CORES_PER_LANE` a lane, so each
    lane's worker and referee find a cpu no compiler holds; None (no partition) on a host of
    fewer than `TIMING_CORES_MIN_HOST` cpus, or where the cores left would be under half.
    `KS_TIMING_CORES` overrides the number kept (0: none kept, the compilers use every cpu)."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    keep = 1 + TIMING_CORES_PER_LANE * max(0, lanes)
    override = os.environ.get("KS_TIMING_CORES", "").strip()
    if override:
        if not override.lstrip("-").isdigit():
            raise ValueError(f"KS_TIMING_CORES={override!r}: not a whole number of cpus to keep "
                             "for the timing lanes")
        keep = int(override)
    elif len(cpus) < TIMING_CORES_MIN_HOST or keep > len(cpus) // 2:
        return None
    if keep <= 0 or keep >= len(cpus):
        return None
    return cpus[keep:]
