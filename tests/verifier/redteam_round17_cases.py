"""Candidate code for tests/verifier/test_redteam_round17.py (red-team round 17).

Planted as rounds 9-16 plant residue (cyclic garbage whose finalizer runs at the worker's
settle: `test_redteam_round9b._at_settle`; Python and ctypes here stand for what a compiled
candidate does in C++, which no static check reads). Each block says what it does.
"""

from __future__ import annotations

from redteam_later_cases import ANCHOR, LATER
from redteam_round7_cases import NUMPY_RELU

# --- code that runs as an object dies, hidden from the settle's scan ---------------------------
# The settle (`verifier.run.disarm.pin_mortal`) holds every object the collector lists whose
# type `hasattr(kind, "__del__")`, and the referent of every listed weak reference whose
# `__callback__` is not None, so that none dies in a later job. Each way below hangs `later`
# on `msg["ks"]` (in the worker: the settle's message in its loop, `ANCHOR`, which dies as the
# loop reads the next job's) so that the scan misses it; "plain" is the control, as round 10
# left it (held).
WAYS = {
    "plain": """
class Mortal:
    def __del__(self):
        later()


msg["ks"] = Mortal()
""",
    # a metaclass whose `__getattribute__` denies `__del__`: `hasattr` says False, the type's
    # C slot (tp_finalize, set from the class body) still runs it
    "metaclass": """
class Quiet(type):
    def __getattribute__(cls, name):
        if name == "__del__":
            raise AttributeError(name)
        return type.__getattribute__(cls, name)


class Mortal(metaclass=Quiet):
    def __del__(self):
        later()


msg["ks"] = Mortal()
""",
    # a weak reference of a subclass whose class attribute `__callback__` is None (it shadows
    # the base's member descriptor): the scan reads None, the C callback slot is `later`; the
    # reference is kept under a new private name of `weakref` (new names are not compared)
    "callback": """
class Quiet(weakref.ref):
    __callback__ = None


class Target:
    pass


msg["ks"] = Target()
sys.modules["weakref"]._ks_kept = Quiet(msg["ks"], later)
""",
    # an object of a class with `__del__` taken out of the collector's lists
    # (`PyObject_GC_UnTrack`): `gc.get_objects()` does not list it
    "untracked": """
import ctypes


class Mortal:
    def __del__(self):
        later()


msg["ks"] = Mortal()
ctypes.pythonapi.PyObject_GC_UnTrack(ctypes.py_object(msg["ks"]))
""",
    # a capsule (not a collected type: never listed) whose C destructor is a ctypes callback
    # into `later`; the callback object kept under a new private name of `weakref`
    "capsule": """
import ctypes

Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
sys.modules["weakref"]._ks_destructor = destructor = Destructor(lambda _capsule: later())
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, Destructor]
msg["ks"] = new(1, None, destructor)
""",
}

# what `later` does in the next job: a thread that holds the GIL in 50 ms slices for 10 s
# (past that job's end), then ends; nothing of the harness changed (its id, newer than
# the ready worker's, replaces the worker after that job: too late for that job's timing)
HOG = """
import weakref  # (not sys: `_at_settle`'s own, which it reads first)


def later(*_a):
    import threading, time

    def hog():
        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            t = time.monotonic() + 0.05
            while time.monotonic() < t:
                pass
            time.sleep(0.001)

    threading.Thread(target=hog, daemon=True).start()

"""


def hidden_hog(way: str) -> str:
    """The code the attacker runs as its worker settles it: WAYS[way], `later` the hog."""
    return HOG + ANCHOR + WAYS[way]


def hidden_death(way: str) -> str:
    """The same, `later` rebinding torch.relu (`redteam_later_cases.LATER`): the next job is
    called a cheat where it runs, whatever the host's noise."""
    return LATER + ANCHOR + WAYS[way]


# the same in one process: a settle as the worker makes them (`settle.leftover_code`, the
# collector frozen first as at the worker's ready) while the anchor is a local of the loop that
# calls it, then the anchor dropped as the next message comes, and collected; prints how many
# times `later` ran. argv: the way, and "fixed" to scan with `verifier.run.mortal` (what the
# collector lists and the stack's locals) in place of `disarm.pin_mortal`'s own reading
SETTLED = """
import gc, inspect, sys, weakref
from verifier.run import disarm, settle
from verifier.run.mortal import mortal_of, stack_roots

if sys.argv[2] == "fixed":
    def pin_mortal(*_mark):  # every object scanned (whatever the harness's freeze mark says)
        gc.unfreeze()
        held = mortal_of(gc.get_objects() + stack_roots())
        disarm.PINNED.extend(held)
        return len(held)
    settle.pin_mortal = pin_mortal
gc.collect()
gc.freeze()
before = settle.armed_finalizers()
ran = []


def later(*_a):
    ran.append(1)


def loop():
    msg = {"settle": True}
    code = WAYS[sys.argv[1]]
    ns = {"msg": msg, "later": later, "sys": sys, "weakref": weakref}
    exec(code, ns)
    del ns["msg"]  # (its functions' globals: only the loop holds the message)
    marked = "mark" in inspect.signature(settle.leftover_code).parameters  # (main's, since)
    settle.leftover_code(before, *([None] if marked else []))
    msg = {"job": 1}  # the next job's message
    gc.collect()


loop()
gc.collect()
print(len(ran))
""".replace("WAYS", repr(WAYS))

# --- the interpreter's bytecode cache moved to the job's own directory --------------------------
# `sys.pycache_prefix` (3.8): where every later import looks for a module's cached bytecode. A
# .pyc there whose header matches its source's size and mtime is loaded without reading the
# source: here `graphlib` (not loaded in the worker), its code the job's own (torch.relu
# rebound). Written under the worker's private tmpfs, outside the job's own folder.
PYCACHE_PREFIX = """
import importlib.util, marshal, os, sys, tempfile
src = importlib.util.find_spec("graphlib").origin
root = os.path.join(os.environ.get("KS_WORKER_TMP") or tempfile.gettempdir(), ".ks_pyc")
sys.pycache_prefix = root
pyc = importlib.util.cache_from_source(src)
os.makedirs(os.path.dirname(pyc), exist_ok=True)
st = os.stat(src)
code = compile(open(src).read() + "\\nimport torch\\ntorch.relu = lambda x: x\\n", src, "exec")
with open(pyc, "wb") as f:
    f.write(importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
            + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
            + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code))
"""

# an honest numpy ReLU that imports a module of the standard library the worker has not loaded
IMPORTING_RELU = NUMPY_RELU.replace("        import numpy as np\n",
                                    "        import graphlib  # noqa: F401\n"
                                    "        import numpy as np\n")

# --- a C++ vtable entry repointed (`.data.rel.ro`: in RELRO, outside the GOT) --------------------
# `c10::TensorImpl`'s vtable (libc10.so, `.data.rel.ro`): its deleting destructor's entry (every
# dense tensor's, called as its last reference goes) pointed at a ctypes callback that waits
# 0.5 ms and calls the original; the page made read-only again. The residue check hashes each
# library's GOT inside RELRO only (`verifier.run.relocations`: its documented open).
VTABLE_SLOW = """
import ctypes, sys, time
import torch
c10 = ctypes.CDLL(torch.__file__.rsplit("/", 1)[0] + "/lib/libc10.so")
cell = ctypes.cast(c10._ZTVN3c1010TensorImplE, ctypes.c_void_p).value + 3 * 8
original = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.c_void_p.from_address(cell).value)


def release(this):
    end = time.perf_counter() + 0.0005
    while time.perf_counter() < end:
        pass
    original(this)


hook = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(release)
sys.modules["weakref"]._ks_hook = (hook, original)
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mprotect(cell & ~4095, 4096, 3)
ctypes.c_void_p.from_address(cell).value = ctypes.cast(hook, ctypes.c_void_p).value
libc.mprotect(cell & ~4095, 4096, 1)
"""

# --- the fallback check's op kinds, cached by a job --------------------------------------------
# `verifier.checks.fallback.op_kind` (an `lru_cache` that lives as long as the worker) sorts each
# traced aten op into allocation, view, copy, compute...: an op whose packet it cannot read
# (`getattr(torch.ops.aten, base)`, its `overloads()`) is "compute". The job puts an object
# with no `overloads` under `torch.ops.aten.<alloc>` (an attribute of torch's op namespace: not
# compared), clears the cache and asks `op_kind` for the names a trace gives, and deletes the
# attribute again: no
# residue but the cache, which says "compute" for every later job's allocations.
OP_KINDS = """
import sys
import torch
fallback = sys.modules["verifier.checks.fallback"]
fallback.op_kind.cache_clear()  # (an earlier job's answers are cached too)
for base in ("empty_like", "empty", "empty_strided"):
    setattr(torch.ops.aten, base, object())
    for name in (f"aten.{base}.default", f"aten::{base}", f"aten.{base}.memory_format"):
        fallback.op_kind(name)
    delattr(torch.ops.aten, base)
"""
# the same objects left in torch's op namespace (nothing deleted, no cache needed)
OP_KINDS_LEFT = OP_KINDS.replace("    delattr(torch.ops.aten, base)\n", "")

# an honest numpy ReLU that allocates its output with torch (an allocation, not compute)
ALLOCATING_RELU = NUMPY_RELU.replace(
    "        import numpy as np\n",
    "        import numpy as np\n        out = torch.empty_like(x)\n"
    "        np.maximum(x.numpy(), 0, out=out.numpy())\n        return out\n")

# --- the fallback check's trace made blind for later jobs ---------------------------------------
# The worker traces each job's forward with a `TorchDispatchMode` subclass of its own
# (`fallback.make_trace_mode`); the base class's `__enter__` pushes it on torch's mode stack
# through `torch.utils._python_dispatch._push_mode`, a private function of a module the walk
# reads only the public callables of. A job that makes both stack functions do nothing leaves
# every later job's trace empty: a later forward that is `torch.relu` is no fallback.
BLIND_TRACE = """
import sys
dispatch = sys.modules["torch.utils._python_dispatch"]
dispatch._push_mode = lambda mode, *a, **k: None
dispatch._pop_mode = lambda *a, **k: None
"""

# a library fallback: the forward is torch's own ReLU
TORCH_RELU = NUMPY_RELU.replace("        import numpy as np\n", "        return torch.relu(x)\n")
