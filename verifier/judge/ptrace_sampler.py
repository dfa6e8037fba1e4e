"""Instruction-pointer samples of a run's threads by ptrace, from the judge's process
(`verifier.judge.ip_sampler` classifies them): one sample of a thread is PTRACE_SEIZE,
PTRACE_INTERRUPT, a wait for the stop, PTRACE_GETREGS and a detach; `Sampler` takes rounds of
them on every task of the run while a window runs."""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

INTERVAL_S = 0.0002  # a round of samples every 0.2 ms while a window runs (untimed windows:
# the stops slow nothing that is measured)
TASKS_S = 0.02  # the run's task list is read again after this long
SYSCALL = -1000  # a sample inside system call k is recorded as rip SYSCALL - k (no address)

_PTRACE_CONT, _PTRACE_GETREGS, _PTRACE_DETACH = 7, 12, 17
_PTRACE_SEIZE, _PTRACE_INTERRUPT = 0x4206, 0x4207
_WALL = 0x40000000
_ORIG_RAX, _RIP = 15, 16  # x86_64 user_regs_struct: r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi
# rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


class _Regs(ctypes.Structure):
    _fields_ = [("r", ctypes.c_ulong * 27)]


def _ptrace(req: int, tid: int, data: int = 0, addr: Any = None) -> int:
    """ptrace(2); 0 or -errno."""
    if _libc.ptrace(req, tid, addr, ctypes.c_void_p(data) if data else None) == -1:
        return -ctypes.get_errno()
    return 0


def unavailable() -> str:
    """Why this process cannot sample another's threads here ("" when it can)."""
    if platform.machine() != "x86_64":
        return f"ip sampling reads x86_64 registers, not {platform.machine()}'s"
    try:
        cap_eff = int(next(ln.split()[1] for ln in Path("/proc/self/status").read_text()
                           .splitlines() if ln.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        cap_eff = 0
    if not cap_eff >> 19 & 1:  # CAP_SYS_PTRACE: the worker runs as its own uid
        return "ip sampling needs CAP_SYS_PTRACE (the worker runs as another user)"
    try:
        if Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() == "3":
            return "ip sampling: Yama ptrace_scope is 3 (no ptrace at all)"
    except OSError:
        pass
    return ""


def _running(tid: int) -> bool:
    try:
        stat = Path(f"/proc/{tid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] == "R"


def sample_once(tid: int) -> tuple[int | None, str]:
    """(rip of thread `tid`, "") or (None, why not): "gone", "denied", "traced"."""
    err = _ptrace(_PTRACE_SEIZE, tid)
    if err:
        if err == -1 or err == -13:  # EPERM/EACCES: refused, or another tracer holds it
            return None, "traced" if _tracer(tid) else "denied"
        return None, "gone"
    try:
        if _ptrace(_PTRACE_INTERRUPT, tid):
            return None, "gone"
        try:  # blocking: a spin here would take the cpu the thread needs to stop
            got, status = os.waitpid(tid, _WALL)
        except ChildProcessError:
            return None, "gone"
        if not os.WIFSTOPPED(status):
            return None, "gone"
        # a signal-delivery stop (not our interrupt's event stop): hand the signal back
        signal = os.WSTOPSIG(status) if status >> 16 == 0 else 0
        regs = _Regs()
        rip = None
        if _libc.ptrace(_PTRACE_GETREGS, tid, None, ctypes.byref(regs)) != -1:
            # stopped inside a system call (orig_rax is its number, else -1): kernel time or a
            # wait that began after the thread was seen running, not user code at rip
            sysno = ctypes.c_long(regs.r[_ORIG_RAX]).value
            rip = int(regs.r[_RIP]) if sysno < 0 else SYSCALL - sysno
        _ptrace(_PTRACE_DETACH, tid, signal)
        return rip, "" if rip is not None else "gone"
    finally:
        _ptrace(_PTRACE_DETACH, tid)  # no-op once detached (ESRCH)


def _tracer(tid: int) -> int:
    return _status_field(tid, "TracerPid")


def _status_field(tid: int, name: str) -> int:
    """A numeric field of /proc/<tid>/status (0 when it cannot be read)."""
    try:
        for ln in Path(f"/proc/{tid}/status").read_text().splitlines():
            if ln.startswith(name + ":"):
                return int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Sampler:
    """A thread that samples the running threads `tasks()` returns, every `interval_s` while
    `armed` is set (always, without one)."""

    def __init__(self, tasks: Callable[[], list[int]], interval_s: float = INTERVAL_S,
                 armed: threading.Event | None = None) -> None:
        self.tasks, self.interval_s, self.armed = tasks, interval_s, armed
        self.samples: list[tuple[int, int]] = []  # (tid, rip, or SYSCALL - its number)
        self.refused: Counter[str] = Counter()
        self.maps: dict[int, str] = {}  # tid -> its /proc maps text, read while it lives
        self._leaders: dict[int, bool] = {}  # tid -> whether it leads a child of this process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ks-ip-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def user_samples(self) -> int:
        """Samples taken in user code (not inside a system call)."""
        return sum(1 for _, rip in self.samples if rip >= 0)

    def _loop(self) -> None:
        me, tids, listed = threading.get_native_id(), [], 0.0
        while not self._stop.is_set():
            if self.armed is not None and not self.armed.wait(0.05):
                continue
            began = time.perf_counter()
            if began - listed > TASKS_S:  # a thread started since is seen within TASKS_S
                tids, listed = self.tasks(), began
            for tid in tids:
                if tid == me or not _running(tid) or self._waited_here(tid):
                    continue
                rip, why = sample_once(tid)
                if rip is None:
                    self.refused[why] += 1
                    continue
                self.samples.append((tid, rip))
                if tid not in self.maps:
                    try:
                        self.maps[tid] = Path(f"/proc/{tid}/maps").read_text()
                    except OSError:
                        self.maps[tid] = ""
            self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - began)))

    def _waited_here(self, tid: int) -> bool:
        """Whether `tid` leads a process this one started: a ptrace stop of it is reported to
        every wait of this process, and subprocess's wait for it (a runner's, a test's) took
        the sampler's stop as the run's end (returncode -5, SIGTRAP), leaving the sampler
        blocked on a stop it never sees. Such a process is never sampled (the sandbox's outer
        wrapper, which only waits; a run's worker is its child)."""
        if tid not in self._leaders:
            self._leaders[tid] = _status_field(tid, "Tgid") == tid and \
                _status_field(tid, "PPid") == os.getpid()
        return self._leaders[tid]

    def stop(self) -> Sampler:
        self._stop.set()
        self._thread.join(timeout=5.0)
        for tid in {t for t, _ in self.samples}:  # objects loaded after the first sample
            try:
                self.maps[tid] = Path(f"/proc/{tid}/maps").read_text()
            except OSError:
                pass
        return self
