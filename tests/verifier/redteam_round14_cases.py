"""Candidate code for tests/verifier/test_redteam_round14.py (red-team round 14).

Residue routes into a later job of a persistent worker (`verifier.run.gpu_worker`) that the
residue check (`verifier.run.tamper.process_state`, `gpu_worker.global_flags`) did not compare,
planted as rounds 12-13 plant them (the model's `__del__`, after the job's own checks: Python
here stands for what a compiled candidate does in C++, which no static check reads):
- the worker's scheduling: `sched_setscheduler(SCHED_IDLE)` (allowed to any process: it only
  lowers) runs every later job's calls only where no other thread of the host wants the cpu,
  and `sched_setaffinity` to one core pins every later job's threads, the OpenMP pool's too;
  `os.getpriority` (the nice value, compared) shows neither;
- the dispatcher's thread-local key sets (`c10::impl::tls_set_dispatch_key_excluded`): autocast
  is the AutocastCPU key left out of the excluded set (`torch.set_autocast_enabled("cpu")`:
  every later job's matmuls and convolutions in bfloat16), and any key excluded there (Python:
  the dispatcher trace's own) stays so for every later job of the thread;
- numpy's buffer size (`np.setbufsize`), kept beside its error state in the thread's context:
  16 elements made an honest casting ufunc ~8x slower (22 -> 178 us on 256 x 256);
- the process's timer slack (`prctl(PR_SET_TIMERSLACK)`): every later job's timed sleeps and
  waits with a timeout end up to that late.
A canary sibling (an honest numpy ReLU whose output is off by one when its process is not as
the test's own: what a later honest job runs under) is the independent check.
Then (each block below says what it does): a C signal handler on a POSIX timer, a descriptor
`dup2`'d over the clock pipe, C function pointers swapped under objects that keep their
identity (a torch method, a numpy ufunc loop), a line nested past the parser's depth on the
result socket, writes into the caches a later verdict reads, and two runs that act on what the
early trial check at "t" tells them (a forged HOST_ONLY after failing, a death after passing).
"""

from __future__ import annotations

from redteam_round7_cases import NUMPY_RELU, on_worker_device


# the canary: an honest ReLU that is wrong when its process is not as the test's own (`state`,
# run in the test's process too: a fresh worker inherits its scheduling, timer slack and
# defaults; `canary(state())`)
def state() -> dict:
    """What the canary compares: scheduling, autocast, the Python dispatch key, numpy's buffer
    size, the timer slack."""
    import ctypes
    import os

    import numpy as np
    import torch

    libc = ctypes.CDLL(None)
    return {"policy": os.sched_getscheduler(0), "cores": len(os.sched_getaffinity(0)),
            "autocast": torch.is_autocast_enabled("cpu"),
            "python key": torch._C._dispatch_tls_is_dispatch_key_excluded(
                torch._C.DispatchKey.Python),
            "bufsize": np.getbufsize(), "slack": libc.prctl(30, 0, 0, 0, 0)}


_CANARY = '''import torch

FRESH = EXPECTED


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        off = float(state() != FRESH)
        return torch.from_numpy(np.maximum(x.numpy(), 0) + np.float32(off))
'''
_CANARY = on_worker_device(_CANARY)  # its cuda form on a cuda worker


def canary(expected: dict) -> str:
    """The canary, off by one where its process's `state()` is not `expected`."""
    import inspect

    return _CANARY.replace("EXPECTED", repr(expected)) + "\n\n" + inspect.getsource(state)


SCHED_IDLE = """
import os
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
"""

ONE_CORE = """
import os
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
"""

AUTOCAST = """
import torch
torch.set_autocast_enabled("cpu", True)
"""

PYTHON_KEY = """
import torch
torch._C._dispatch_tls_set_dispatch_key_excluded(torch._C.DispatchKey.Python, True)
"""

NUMPY_BUFSIZE = """
import numpy as np
np.setbufsize(16)
"""

TIMER_SLACK = """
import ctypes
ctypes.CDLL(None).prctl(29, 50_000_000, 0, 0, 0)
"""

ROUTES = {"sched_idle": SCHED_IDLE, "one_core": ONE_CORE, "autocast": AUTOCAST,
          "python_key": PYTHON_KEY, "numpy_bufsize": NUMPY_BUFSIZE, "timer_slack": TIMER_SLACK}


def leaving(base: str, code: str) -> str:
    """`base` (an honest numpy model) whose model runs `code` when the harness drops it."""
    body = "".join(f"        {line}\n" for line in code.strip().splitlines())
    return base.replace("class ModelNew(torch.nn.Module):\n",
                        "class ModelNew(torch.nn.Module):\n    def __del__(self):\n"
                        + body + "\n")


assert NUMPY_RELU

# --- told early that its trials failed: a second draw as "host construction" ------------------
# The trial check at "t" (the protocol change merged from main) ends the windows at once when
# the trials failed: the run learns it (its forward is called no more after its trials and the
# kernel profile). A run that then rewrites its result's outcome to the worker's HOST_ONLY
# ("host_construction": the parent runs the job again with the host's construction,
# `verifier.stages.run_constructed`) gets a second run, in which it takes its safe path (a
# marker file tells it this is the second; a finding of its own says it forged): "try the
# risky kernel, fall back when caught".
# `MARK` is replaced by a path under /dev/shm per test.
REROLL = '''import torch

CALLS = [0]


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        import os
        CALLS[0] += 1
        wrong = not os.path.exists("MARK")
        return torch.from_numpy(np.maximum(x.numpy(), 0) + np.float32(0.5 if wrong else 0.0))

    def __del__(self):
        import gc
        import os
        if os.path.exists("MARK") or CALLS[0] > 8:  # the second run, or windows were served
            return
        open("MARK", "w").close()
        for obj in gc.get_objects():
            if type(obj).__name__ == "JobResult":
                obj.data["outcome"] = "host_construction"
                obj.data["error"] = "ModelNew(...) cannot be built under the device context"
                obj.data["findings"].append({"rule": "r14_forged", "severity": "info",
                                             "line": None, "message": "forged"})
'''
REROLL = on_worker_device(REROLL)  # its cuda form on a cuda worker


def reroll(mark: str) -> str:
    """REROLL keeping its marker at `mark`."""
    return REROLL.replace('"MARK"', repr(mark))


# --- a line nested past the parser's depth on the worker's result socket ----------------------
# any descriptor of the worker is the candidate's: a line of 50000 `[` and as many `]` is valid
# JSON that `json.loads` cannot parse (RecursionError, not ValueError): it escaped the parent's
# reader (`GpuWorkerProcess._read`) and the runner; `verify_batch` made it "runtime_error:
# verifier error" (0.1), where a fallback caught as a cheat gets 0.0
DEEP_LINE = """
import os
for fd in os.listdir("/proc/self/fd"):
    try:
        if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
            os.write(int(fd), b"[" * 50000 + b"]" * 50000 + b"\\n")
            break
    except OSError:
        pass
"""

# --- the caches a later candidate's verdict reads: written from the worker ---------------------
def writer(base: str, targets: list[str]) -> str:
    """`base` (an honest numpy model) that tries to write each of `targets` in its forward
    (the baseline cache a later candidate's speedup is read from, the tests' build cache, the
    repository, the host's /tmp)."""
    return base.replace("    def forward(self, x):\n", f'''    def forward(self, x):
        import os
        for t in {targets!r}:
            try:
                os.makedirs(os.path.dirname(t), exist_ok=True)
                with open(t, "w") as f:
                    f.write("{{}}")
            except OSError:
                pass
''')

# --- a C-level signal handler on a POSIX timer: neither `signal.getsignal` nor `getitimer` ------
# `sigaction` from compiled code (here libc's `signal` with a ctypes callback) is no Python
# handler, and `timer_create` is no interval timer: every 10 ms of every later job, the
# handler runs (here: it sleeps 8 ms: a later honest sibling is timed slower, nothing fails)
POSIX_TIMER = """
import ctypes, signal, time
import builtins
libc = ctypes.CDLL(None)
cb = ctypes.CFUNCTYPE(None, ctypes.c_int)(lambda s: time.sleep(0.008))
builtins.__dict__.setdefault("_ks_r14_keep", []).append(cb)
libc.signal.restype = ctypes.c_void_p
libc.signal(signal.SIGWINCH, cb)


class Event(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_byte * 48)]


class Spec(ctypes.Structure):
    _fields_ = [("i_s", ctypes.c_long), ("i_ns", ctypes.c_long), ("v_s", ctypes.c_long),
                ("v_ns", ctypes.c_long)]


timer = ctypes.c_void_p()
libc.timer_create(1, ctypes.byref(Event(None, signal.SIGWINCH, 0)), ctypes.byref(timer))
libc.timer_settime(timer, 0, ctypes.byref(Spec(0, 10_000_000, 0, 10_000_000)), None)
"""

# --- a descriptor `dup2`'d over the worker's inherited clock pipe ------------------------------
# the worker's end of the judge's request pipe (`clock_serve.FDS_ENV`) replaced by /dev/null:
# every later job's "p", "t" and "d" go nowhere, and it waits for a "g" that never comes
DUP2_CLOCK = """
import os
req = int(os.environ["KS_CLOCK_FDS"].split(",")[0])
os.dup2(os.open("/dev/null", os.O_WRONLY), req)
"""

# --- told early that its trials passed, a slow run voids its timing ----------------------------
# Correct in its trials, it learns at "t" that they passed (the windows begin). In a worker
# that ran earlier jobs (here: `wave` already loaded when its module loads, as the honest
# job before it, WAVE_RELU, left it: a real module stays) its timed calls are slow (the host's
# load; here a 3 ms sleep a call), and after a few windows it ends the run (`os._exit`: its own failure). With earlier jobs in its
# worker that is the worker's word: the run is made again in a fresh worker, where its calls
# are fast, and that run's runtime stands: a second timing draw, taken when the first was bad.
WAVE_RELU = NUMPY_RELU.replace("        import numpy as np\n",
                               "        import wave  # noqa: F401\n        import numpy as np\n")
VOIDS_SLOW = """import sys

import torch

WARM = "wave" in sys.modules  # an earlier job's: this worker is not fresh
CALLS = [0]


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        import os
        import time
        CALLS[0] += 1
        if WARM:  # every call slow (its trials pass all the same)
            time.sleep(0.003)
            if CALLS[0] > 15:  # a few slow windows: the judge timed them; it leaves
                os._exit(3)
        return torch.from_numpy(np.maximum(x.numpy(), 0))
"""
VOIDS_SLOW = on_worker_device(VOIDS_SLOW)  # its cuda form on a cuda worker

# --- a C function pointer swapped under a method that keeps its identity ------------------------
# `torch.Tensor.copy_` is a method descriptor whose PyMethodDef (in libtorch_python's writable
# data) names its C function: pointed at `add_`'s (the same calling convention), every later
# `slot.copy_(out)` of the harness adds the output to the judge's poison (NaN) instead: every
# later honest job's trials are wrong by the judge's own check. The residue check compared the
# descriptor's identity (and C function pointers only of the guarded builtins).
COPY_IS_ADD = """
import ctypes
import torch


def meth(descr):  # &descr->d_method->ml_meth (PyDescr_COMMON is 40 bytes on 64-bit)
    return ctypes.c_void_p.from_address(id(descr) + 40).value + 8


ctypes.c_void_p.from_address(meth(torch.Tensor.copy_)).value = ctypes.c_void_p.from_address(
    meth(torch.Tensor.add_)).value
"""

# --- numpy's ufunc loop table: `np.maximum`'s float32 loop pointed at `np.minimum`'s -------------
# the ufunc object (and so its identity) unchanged: every later job's np.maximum on float32
# computes the minimum (an honest numpy ReLU's outputs are min(x, 0))
MAXIMUM_IS_MINIMUM = """
import ctypes
import numpy as np

word = ctypes.sizeof(ctypes.c_void_p)


def loop(uf):  # &uf->functions[the float32 signature]
    table = ctypes.c_void_p.from_address(id(uf) + 2 * word + 16).value
    return ctypes.c_void_p.from_address(table + uf.types.index("ff->f") * word)


loop(np.maximum).value = loop(np.minimum).value
"""
