"""Settings of the worker's process and of its main thread (the one every job runs on) that a
job can change for every later job, read by their getters: the part of the residue check
(`verifier.run.tamper.process_state`) that `tamper.process_settings` (umask, nice, limits,
signal mask) and `gpu_worker.global_flags` (torch's process-wide flags) did not hold.

Measured (tests/verifier/test_redteam_round14.py; a canary sibling, an honest ReLU wrong when
its worker is not as a fresh one is, was wrong after each, and nothing was run again):
- scheduling: `sched_setscheduler(SCHED_IDLE)` (any process may lower its own) runs every
  later job only where no other thread of the host wants a cpu; `sched_setaffinity` to one
  core pins every later job's threads (the OpenMP pool's too). The nice value shows neither.
- the dispatcher's thread-local key sets: autocast on cpu is the AutocastCPU key taken out of
  the excluded set (every later job's matmuls and convolutions in bfloat16); a key excluded
  there (Python: the dispatcher trace's) stays so; inference and anomaly modes likewise.
- numpy's buffer size (beside its error state, `hidden_state.numpy_errors`): 16 elements made
  an honest casting ufunc ~8x slower.
- the timer slack (`prctl(PR_SET_TIMERSLACK)`): later timed waits end up to that late.
- the signal wake-up descriptor (`signal.set_wakeup_fd`): a byte into it at every signal a
  Python handler takes (one of the judge's clock pipes, dup'ed, would carry it to the judge).
- torch's config modules (`torch._dynamo.config`, `torch._inductor.config`, ...: values, not
  callables, so the module walk skips them): `fallback_random`, `cpp.simdlen` or dynamo's
  `disable` set by one job hold for every later job's `torch.compile`.
- signal handlers and timers below Python: `sigaction` from compiled code is no handler
  `signal.getsignal` shows, and `timer_create` no interval timer `getitimer` shows; a C-level
  SIGWINCH handler on a 10 ms POSIX timer that slept 8 ms timed a later honest sibling at 359
  us a call against 75 before (nothing failed, nothing was run again). The kernel lists both:
  the caught and ignored signal masks, and the process's POSIX timers.
- the descriptor table: /dev/null `dup2`'d over the worker's end of the judge's request pipe
  left every later job waiting for a "g" that never came (a run timeout, then run again).
- the C environment: `os.putenv` (or a compiled candidate's `setenv`) changes what `getenv`
  answers in C (an OpenMP runtime's OMP_NUM_THREADS at its first use, any library's) and not
  `os.environ`, the copy `process_state` compares.
- the thread's async generator hooks and coroutine origin tracking (code or cost at every
  later coroutine), and the process's dumpable flag (off: its /proc files are root's).
- round 16: the NUMA memory policy and the THP switch (not measured on this one-node host),
  `mlockall(MCL_FUTURE)` (a later job's allocation refused), a seccomp filter, and the
  libraries' GOT and RELRO pages (`verifier.run.relocations`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

from verifier.run import relocations

PR_GET_DUMPABLE, PR_GET_TIMERSLACK, PR_GET_THP_DISABLE = 3, 30, 42
_GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}  # the syscall's number (libc has no wrapper)


def scheduling() -> tuple[Any, ...]:
    """The main thread's scheduling policy, its parameter and its cpus."""
    return (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority,
            tuple(sorted(os.sched_getaffinity(0))))


def prctl(option: int) -> int:
    """A prctl getter's answer (the thread's timer slack in ns, the process's dumpable flag;
    -1 where prctl cannot be called)."""
    import ctypes

    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, 0, 0, 0, 0))
    except (OSError, AttributeError):
        return -1


def memory_policy() -> tuple[int, int]:
    """The thread's NUMA memory policy (`set_mempolicy`: its mode, its node mask's first word;
    (-1, -1) where it cannot be read): a policy bound to a far node slows every later job's
    host memory (red-team round 16)."""
    import ctypes
    import platform

    number = _GET_MEMPOLICY.get(platform.machine())
    mode, mask = ctypes.c_int(-1), (ctypes.c_ulong * 16)()
    if number is None or ctypes.CDLL(None).syscall(number, ctypes.byref(mode), mask, 1024,
                                                   None, 0) != 0:
        return -1, -1
    return mode.value, mask[0]


def locked_memory() -> tuple[int, bool]:
    """(the process's locked memory in kB, whether a new mapping is locked as it is made):
    `mlockall(MCL_FUTURE)` locks every later mapping (past RLIMIT_MEMLOCK one fails: a later
    job's allocation raised EAGAIN and was run again in a fresh worker, red-team round 16);
    no getter shows it but a new page's lock (or its refusal)."""
    import mmap

    def locked_kb() -> int:
        with open("/proc/self/status") as f:
            return next((int(ln.split()[1]) for ln in f if ln.startswith("VmLck:")), -1)

    before = locked_kb()
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE)
    except OSError:
        return before, True
    page[0] = 1
    future = locked_kb() > before
    page.close()
    return before, future


def status_flags() -> tuple[str, ...]:
    """The kernel's flags of the process that no getter of Python's reads: seccomp (a filter
    a job installs stays for every later job: any syscall refused or answered with an error)
    and no_new_privs, and the speculation controls (`PR_SET_SPECULATION_CTRL`)."""
    with open("/proc/self/status") as f:
        return tuple(ln.strip() for ln in f if ln.startswith(
            ("Seccomp", "NoNewPrivs", "Speculation")))


def torch_configs() -> tuple[tuple[str, str, str], ...]:
    """Every loaded torch config module's settings that are not their defaults, by value."""
    kind = getattr(sys.modules.get("torch.utils._config_module"), "ConfigModule", None)
    if kind is None:
        return ()
    return tuple((name, key, repr(getattr(m, key, None)))
                 for name, m in sorted((n, m) for n, m in list(sys.modules.items())
                                       if type(n) is str and isinstance(m, kind))
                 for key in sorted(m._config) if not m._is_default(key))


def coroutine_hooks() -> tuple[int, ...]:
    """Identity of this thread's async generator hooks, and its coroutine origin depth."""
    first, final = sys.get_asyncgen_hooks()
    return id(first), id(final), sys.get_coroutine_origin_tracking_depth()


def torch_thread_state() -> tuple[Any, ...]:
    """The dispatcher's thread-local included and excluded key sets, autocast's dtypes and
    cache, inference and anomaly modes (empty where torch is not loaded)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "_C"):
        return ()
    c = torch._C
    dtypes = []
    for device in ("cpu", "cuda"):
        with contextlib.suppress(RuntimeError, TypeError, AttributeError):
            dtypes.append(str(torch.get_autocast_dtype(device)))
    return (str(c._dispatch_tls_local_include_set()), str(c._dispatch_tls_local_exclude_set()),
            tuple(dtypes), torch.is_autocast_cache_enabled(), torch.is_inference_mode_enabled(),
            torch.is_anomaly_enabled())


def numpy_buffer() -> int:
    """numpy's ufunc buffer size (8192, numpy's default, where it is not loaded yet)."""
    numpy = sys.modules.get("numpy")
    return int(numpy.getbufsize()) if numpy is not None and hasattr(numpy, "getbufsize") else 8192


def wakeup_fd() -> int:
    """The signal wake-up descriptor (read by setting it, then set back; -1: none; the main
    thread only can: elsewhere -2)."""
    try:
        old = signal.set_wakeup_fd(-1)
    except ValueError:
        return -2
    if old != -1:
        signal.set_wakeup_fd(old)
    return old


def kernel_signals() -> tuple[str, ...]:
    """The signals the process catches or ignores (any handler, C or Python) and its POSIX
    timers, as the kernel lists them."""
    try:
        with open("/proc/self/status") as f:
            masks = tuple(ln.strip() for ln in f if ln.startswith(("SigCgt:", "SigIgn:")))
        with open("/proc/self/timers") as f:
            return masks + (f.read(),)
    except OSError:
        return ()


def descriptors() -> tuple[tuple[int, str, int, int], ...]:
    """The process's open descriptors, what each is, its status flags and its signal owner
    (the listing's own one left out): one `dup2`'d over an inherited one (the judge's clock
    pipes, `clock_serve.FDS_ENV`; the result socket) gives every later job's messages to
    whatever the job put there; O_NONBLOCK set on the clock pipes (shared by every `dup` of
    them) failed the next job's first read (BlockingIOError: run again in a fresh worker,
    tests/verifier/test_redteam_round15.py), O_ASYNC with an owner signals it at each write."""
    import fcntl

    out = []
    with os.scandir("/proc/self/fd") as listing:
        for entry in listing:
            with contextlib.suppress(OSError):
                fd = int(entry.name)
                out.append((fd, os.readlink(entry.path), fcntl.fcntl(fd, fcntl.F_GETFL),
                            fcntl.fcntl(fd, fcntl.F_GETOWN)))
    return tuple(sorted(x for x in out if x[1] != f"/proc/{os.getpid()}/fd"))


def namespaces() -> tuple[str, ...]:
    """The process's namespaces and its mount table: a job whose worker had one thread
    (another ended: tests/verifier/test_redteam_round15.py) entered a user namespace of its own
    (`unshare`: every capability there) with a mount namespace, and bind-mounted its file over
    a standard-library module: a later job's import of it ran that file as the interpreter's."""
    out = []
    with contextlib.suppress(OSError):
        out = [f"{n}={os.readlink('/proc/self/ns/' + n)}" for n in sorted(os.listdir(
            "/proc/self/ns"))]
        with open("/proc/self/mountinfo") as f:
            out.append(f.read())
    return tuple(out)


def c_environment() -> frozenset[bytes]:
    """The process's environment as C code reads it (libc's `environ`)."""
    import ctypes

    try:
        env = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):
        return frozenset()
    out, i = [], 0
    while env[i] is not None:
        out.append(env[i])
        i += 1
    return frozenset(out)


def snapshot() -> dict[str, int]:
    """The keys `process_state` compares for this module."""
    return {"scheduling (policy, cpus)": hash(scheduling()),
            "timer slack": prctl(PR_GET_TIMERSLACK), "dumpable": prctl(PR_GET_DUMPABLE),
            "THP disabled": prctl(PR_GET_THP_DISABLE), "memory policy": hash(memory_policy()),
            "locked memory": hash(locked_memory()), "seccomp and speculation": hash(
                status_flags()),
            "torch thread-local dispatch state": hash(torch_thread_state()),
            "torch config modules (value)": hash(torch_configs()),
            "numpy buffer size": numpy_buffer(), "signal wake-up fd": wakeup_fd(),
            "coroutine hooks": hash(coroutine_hooks()),
            "signal handlers and POSIX timers (kernel)": hash(kernel_signals()),
            "file descriptors": hash(descriptors()), "C environment": hash(c_environment()),
            "namespaces and mounts": hash(namespaces()),
            **relocations.snapshot()}  # libraries' GOT and RELRO pages
