"""Candidate code for tests/verifier/test_redteam_round15.py (red-team round 15).

Planted as rounds 12-14 plant residue (the model's `__del__`, after the job's own checks:
Python and ctypes here stand for what a compiled candidate does in C++, which no static check
reads). Each block says what it does.
"""

from __future__ import annotations

from redteam_round7_cases import NUMPY_RELU
from redteam_round14_cases import leaving

# --- a C type slot repointed: every attribute of the type keeps its identity -------------------
# `a + b` on two ndarrays calls `PyArray_Type.tp_as_number->nb_add` (numpy's static table, in
# its writable data); no attribute of the type changes (`ndarray.__add__` is a wrapper of the
# table as it was), so the identity walk and the class walk saw nothing. Pointed at
# `nb_subtract`, every later job's `a + b` on arrays is `a - b`.
NDARRAY_ADD_IS_SUB = """
import ctypes
import numpy as np
word = ctypes.sizeof(ctypes.c_void_p)
table = ctypes.c_void_p.from_address(id(np.ndarray) + 12 * word).value
ctypes.c_void_p.from_address(table).value = ctypes.c_void_p.from_address(table + word).value
"""

# the same on torch.Tensor, a heap type: its `nb_add` (the generic `slot_nb_add`, which looks
# up `__add__`) pointed at its `slot_nb_subtract` (which looks up `__sub__`): every later
# job's tensor `+` subtracts
TENSOR_ADD_IS_SUB = NDARRAY_ADD_IS_SUB.replace("import numpy as np\n", "import torch\n").replace(
    "id(np.ndarray)", "id(torch.Tensor)")

SLOT_ROUTES = {"ndarray": NDARRAY_ADD_IS_SUB, "tensor": TENSOR_ADD_IS_SUB}

# an honest numpy ReLU whose arithmetic goes through `+` on arrays: (x + |x|) / 2, exact in
# fp32 (x > 0: 2x * 0.5; x < 0: 0)
ADDING_RELU = '''import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        a = x.numpy()
        return torch.from_numpy((a + np.abs(a)) * np.float32(0.5))
'''


def slot_attacker(route: str) -> str:
    """An honest numpy ReLU that repoints SLOT_ROUTES[route] as the harness drops its model."""
    return leaving(NUMPY_RELU, SLOT_ROUTES[route])

# --- a thread of the ready worker swapped for the job's own: the count of threads kept --------
# The residue check counted the worker's native threads (/proc/self/task: more than when ready
# is residue). The ready cpu worker has two (its main thread and a library's pool thread,
# waiting on a futex). A job points SIGUSR2 at libc's `pthread_exit` (a C handler: the thread
# unwinds and ends wherever it waits), sends it to that thread with `tgkill`, restores the
# signal's disposition, and starts its own thread with `pthread_create` (a ctypes callback, no
# `threading` object): two threads again. Its thread sleeps past the settle and then runs Python
# (holds the GIL) through the next job: an honest sibling's calls wait for the GIL.
END_A_THREAD = """
import ctypes, os, signal, time, builtins
libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
others = [int(t) for t in os.listdir("/proc/self/task") if int(t) != os.getpid()]
if others:
    old = libc.signal(signal.SIGUSR2, ctypes.cast(libc.pthread_exit, ctypes.c_void_p).value)
    libc.syscall(234, os.getpid(), others[0], signal.SIGUSR2)  # tgkill
    for _ in range(200):
        if len(os.listdir("/proc/self/task")) == len(others):
            break
        time.sleep(0.005)
    libc.signal(signal.SIGUSR2, old)

"""

SWAPPED_THREAD = END_A_THREAD + """
def hog(_):
    time.sleep(0.3)  # past the settle
    end = time.monotonic() + 20.0
    while time.monotonic() < end:
        pass
    return None

cb = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(hog)
builtins.__dict__.setdefault("_ks_r15_keep", []).append(cb)
handle = ctypes.c_ulong()
libc.pthread_create(ctypes.byref(handle), None, cb, None)
"""

# --- a descriptor's flags: the same pipe, not blocking --------------------------------------
# The residue check compared the descriptor table by number and target: the flags of an open
# file description are the same object for every `dup` of it, so O_NONBLOCK set on the
# worker's inherited clock pipes reaches the harness's per-job dup of them; the next job's
# first read of the judge's "g" raises BlockingIOError.
NONBLOCKING_CLOCK = """
import os
for fd in os.environ["KS_CLOCK_FDS"].split(","):
    os.set_blocking(int(fd), False)
"""

# --- the floating-point environment of a library's pool thread ---------------------------------
# The residue check reads the main thread's rounding mode (`hidden_state.float_environment`);
# numpy's OpenBLAS (one thread in the worker: OMP_NUM_THREADS=1) makes its pool threads with
# the creating thread's environment. A job that ends a thread of the ready worker
# (END_A_THREAD), rounds upward on the main thread, asks OpenBLAS for two threads (its pool
# made again at one small matmul: `blas_thread_shutdown_`, exported) and rounds to nearest
# again leaves a pool thread rounding upward for every later job's numpy matmul (in this
# process: a tenth of the elements of 512 x 4096 @ 4096 x 512 beyond the tolerance), with as
# many threads as before.
BLAS_POOL_UPWARD = END_A_THREAD + """
import ctypes
import numpy as np
path = next(ln.split()[-1] for ln in open("/proc/self/maps") if "openblas" in ln.lower())
blas, libm = ctypes.CDLL(path), ctypes.CDLL("libm.so.6")
libm.fesetround(0x800)
blas.blas_thread_shutdown_()
blas.scipy_openblas_set_num_threads64_(2)
np.ones((64, 512), np.float32) @ np.ones((512, 64), np.float32)
libm.fesetround(0)
"""

MATMUL_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(256, 4096), torch.randn(4096, 256)]


def get_init_inputs():
    return []
'''

NUMPY_MATMUL = '''import torch


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return torch.from_numpy(a.numpy() @ b.numpy())
'''

# --- the own-kernel share, forged on its way to the parent's copy ------------------------------
# Round 10 took the share from the worker's {"measured": ...} line, sent by the harness as the
# profile ends (before the candidate's code runs again), not from the result the candidate can
# rewrite later. The line is sent through the job's `JobResult.on_measure`, an instance
# attribute (no class method is rebound: nothing the harness's identity checks compare): a run
# that wraps it in a trial call has the harness itself send the share it chooses (1.0 on CUDA
# under `--fallback partial`: its library time rewarded as its own; on cpu the honest share is
# None, "not measured").
SHARE_FORGED = NUMPY_RELU.replace("    def forward(self, x):\n", '''    def forward(self, x):
        import gc
        for obj in gc.get_objects():
            if type(obj).__name__ == "JobResult" and getattr(obj, "on_measure", None) \\
                    and not getattr(obj.on_measure, "forged", False):
                send = obj.on_measure

                def forged(fields, send=send):
                    send({**fields, "own_share": 1.0})

                forged.forged = True
                obj.on_measure = forged
''')

# --- a module namespace made huge: every later settle's walk pays for it -------------------------
# The residue check compares the names each module had when the worker was ready (a name added
# is no residue: lazy attributes, submodules); it walks them all at each settle. A job that
# gives `os` a million public names (one builtin function: ~70 MB) made every later job of the
# worker take ~3 s instead of ~0.7 (the walk), with no finding.
MODULE_BLOAT = """
import os
os.__dict__.update(dict.fromkeys([f"ks_r15_{i}" for i in range(1_000_000)], len))
"""

# --- the worker's namespaces: a user and mount namespace of the job's own ----------------------
# `unshare(CLONE_NEWUSER)` needs a single-threaded process: the ready worker has a second
# thread, which END_A_THREAD ends. Then the worker enters a user namespace of its own (every
# capability there) with a mount namespace it owns, and bind-mounts a file of its own over a
# standard-library module no job has imported (`wave`): the file is at the module's own
# path (not in a directory a job can write), so a later job's `import wave` runs it as
# the interpreter's own. Here it adds 1 to `np.maximum`'s results for a few calls (the later
# job's trials), then puts `np.maximum` back: nothing is left for the residue check.
EVIL_MODULE = '''import numpy as _np

_real, _calls = _np.maximum, [0]


def _maximum(*args, **kwargs):
    _calls[0] += 1
    if _calls[0] >= 6:
        _np.maximum = _real
    return _real(*args, **kwargs) + 1


_np.maximum = _maximum
'''

OWN_NAMESPACES = END_A_THREAD + '''
import importlib.util
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000 | 0x00020000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    with open("/dev/shm/ks_r15_wave.py", "w") as f:
        f.write(EVIL)
    target = importlib.util.find_spec("wave").origin
    libc.mount(b"/dev/shm/ks_r15_wave.py", target.encode(), None, 4096, None)  # MS_BIND
'''.replace("EVIL", repr(EVIL_MODULE))

# an honest numpy ReLU that imports `wave` (a module the ready worker has not loaded)
WAVE_IMPORTING_RELU = NUMPY_RELU.replace("import torch\n", "import wave  # noqa: F401\nimport torch\n",
                                         1)
assert WAVE_IMPORTING_RELU != NUMPY_RELU

# --- the residue check's own reader blinded: ctypes' private `_string_at` ---------------------
# Every check that reads C memory (a type's slots, numpy's loop tables, a C method's function)
# reads it through ctypes, in the worker: `ctypes.string_at` calls the module's private
# `_string_at` (not compared: the walk compares public callables, and the private ones of a
# few modules). A job that repoints numpy.ndarray's `nb_add` and rebinds `_string_at` to
# answer the table's old bytes leaves its slot unseen.
BLINDED_SLOT = NDARRAY_ADD_IS_SUB.replace("import numpy as np\n", '''import numpy as np
real = ctypes._string_at
table = ctypes.c_void_p.from_address(id(np.ndarray) + 12 * ctypes.sizeof(ctypes.c_void_p)).value
old = real(table, 36 * ctypes.sizeof(ctypes.c_void_p))


def lying(addr, size=-1, _real=real, _table=table, _old=old):
    return _old[:size] if addr == _table and 0 <= size <= len(_old) else _real(addr, size)


ctypes._string_at = lying
''')
assert BLINDED_SLOT != NDARRAY_ADD_IS_SUB

# --- a reused trial set answered from a cache keyed by where its inputs are --------------------
# Where the trial arena holds fewer sets than the paced trials, trial t runs on set t mod sets:
# the same input address as an earlier trial. A run that keeps each output under its input's
# address answers the reused set's trial with the earlier trial's output (no work), and then
# computes as before (its windows run on the windows' own arena).
ADDRESS_CACHE = '''import torch

SEEN = {}


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        key = x.data_ptr()
        if key in SEEN and len(SEEN) < 2:
            SEEN["answered"] = True
            return SEEN[key]
        out = torch.from_numpy(np.maximum(x.numpy(), 0))
        SEEN.setdefault(key, out.clone())
        return out
'''

# --- a rebound function's key in the residue snapshot overwritten by a sys.modules entry -------
# The snapshot keys a module by its name and each public callable of it by "module.name" in one
# dict, filled in sys.modules' order: an entry placed in sys.modules under the name
# "numpy.where" (the key of `numpy.where` itself) and holding the original function writes
# that function's identity over the key after numpy's walk; the entry's name was in the
# snapshot before the job, so it is not a new module either. `numpy.where` rebound to add 1
# (no ufunc: numpy's loop tables are not involved) is then no residue.
WHERE_RELU = '''import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        a = x.numpy()
        return torch.from_numpy(np.where(a > 0, a, np.float32(0)))
'''

SHADOWED_KEY = """
import sys
import numpy as np
real = np.where
np.where = lambda *args, **kwargs: real(*args, **kwargs) + np.float32(1)
sys.modules["numpy.where"] = real
"""

# --- a module's namespace as the walk reads it, not as its functions are looked up -------------
# The residue walk reads each module's namespace with `vars(module)`, which is `module.__dict__`
# as the module's class answers it. A module's class can be assigned (any ModuleType
# subclass): a subclass whose `__dict__` is a property answering a copy taken before the job
# rebound `numpy.where` hides the rebinding (attribute lookups still read the real namespace).
QUIET_MODULE = """
import types
import numpy as np
real, snap = np.where, dict(vars(np))


class Quiet(types.ModuleType):
    @property
    def __dict__(self):
        return snap


np.where = lambda *args, **kwargs: real(*args, **kwargs) + np.float32(1)
np.__class__ = Quiet
"""

# --- sys.modules rebound to a copy: the checks read the copy, imports the interpreter's dict ----
# `import numpy` looks the name up in the interpreter's own module dict (C), where every check
# reads the `sys.modules` attribute. A job that rebinds the attribute to a copy and puts a proxy
# of numpy (its `maximum` adding 1, the rest numpy's) in the interpreter's dict hands every later
# job's `import numpy` the proxy; every walk of `sys.modules` sees numpy as it was.
MODULES_COPY = """
import sys
import types
import numpy as np
real = sys.modules
sys.modules = dict(real)


class Proxy(types.ModuleType):
    def __getattr__(self, name):
        return getattr(np, name)


proxy = Proxy("numpy")
proxy.maximum = lambda *args, **kwargs: np.maximum(*args, **kwargs) + np.float32(1)
real["numpy"] = proxy
"""
