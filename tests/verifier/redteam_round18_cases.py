"""Candidate code for tests/verifier/test_redteam_round18.py (red-team round 18).

Planted as rounds 12-17 plant residue: `redteam_round14_cases.leaving(honest, CODE)`, CODE run
by the honest model's `__del__`, after the job's own checks. Honest sources are written for a
cpu worker and pass through `on_worker_device` for a cuda one.
"""

from __future__ import annotations

from redteam_round7_cases import on_worker_device
from redteam_round16_cases import MALLOPT_SLOW

# an honest numpy ReLU through `np.clip` (numpy's Python layer: the dispatcher's implementation,
# `fromnumeric._wrapfunc`, then `ndarray.clip`)
CLIP_RELU = on_worker_device('''import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        return torch.from_numpy(np.clip(x.numpy(), 0, None))
''')

# --- a function held only by a C object, its code rewritten ----------------------------------------
# numpy's public functions are `_ArrayFunctionDispatcher`s (C) around a Python function: the
# module walk compares the dispatcher by identity and never sees the function inside it. The
# job gives that function its own code (the function object stays: `np.clip.__wrapped__`).
CLIP_CODE = """
import numpy as np


def clip(a, a_min=None, a_max=None, out=None, *, min=None, max=None, **kwargs):
    import numpy
    return numpy.maximum(a, a_min) + numpy.float32(1)


impl = np.clip.__wrapped__
impl.__code__, impl.__defaults__, impl.__kwdefaults__ = (
    clip.__code__, clip.__defaults__, clip.__kwdefaults__)
"""

# --- a library's private helper rebound ---------------------------------------------------------------
# The module walk compared each module's public callables only: numpy's `np.clip` calls its
# private `fromnumeric._wrapfunc` by name at every call.
PRIVATE_HELPER = """
import numpy
from numpy._core import fromnumeric
wrapfunc = fromnumeric._wrapfunc


def _wrapfunc(obj, method, *args, **kwds):
    return wrapfunc(obj, method, *args, **kwds) + numpy.float32(1)


fromnumeric._wrapfunc = _wrapfunc
"""

# --- the harness's cache of libc's mallopt filled with None ----------------------------------------
# `verifier.run.allocator._mallopt` (`functools.cache`) finds libc's `mallopt` once; the settle's
# `pin` undoes what a job set through it. The job empties the cache and refills it while
# `ctypes.CDLL` answers no `mallopt` (put back at once: no residue), then sets round 16's slow
# settings: every later settle's `pin` finds "no mallopt" and undoes nothing.
CACHED_MALLOPT = """
import ctypes
from verifier.run import allocator
real = ctypes.CDLL
allocator._mallopt.cache_clear()
ctypes.CDLL = lambda *a, **k: object()
try:
    allocator._mallopt()
finally:
    ctypes.CDLL = real
""" + MALLOPT_SLOW

# --- the closure of a harness method: the paced trial's context manager ----------------------------
# `WorkerPace.trial` is a `@contextmanager` method: a closure over its generator function, whose
# cell a job can set (the method, its code and defaults stay: each check compared those). The
# job's generator wraps the real one and, after each trial's output is in its slot, writes
# output + 1 there (the trial loop's locals, found up the stack).
TRIAL_CELL = """
import contextlib
from verifier.judge.trial_pace import WorkerPace
cell = WorkerPace.trial.__closure__[0]
original = cell.cell_contents


def trial(self):
    import sys
    with contextlib.contextmanager(original)(self):
        yield
        f = sys._getframe(1)
        while f is not None and "new_out" not in f.f_locals:
            f = f.f_back
        if f is not None:
            loc = f.f_locals
            loc["io"].keep(0, loc["t"], loc["new_out"] + 1)


cell.cell_contents = trial
"""

# --- the residue check's own probe values rewritten -----------------------------------------------
# `hidden_state.float_environment` reads the rounding mode from sums of a module list's values
# (its default argument). The job leaves the main thread rounding upward (round 13's ROUND_UP),
# then writes two of the values, 0 and 2^-52, whose sums are exact in every mode: the probe
# answers as it did when the worker was ready.
ROUND_UP_UNSEEN = """
import ctypes
ctypes.CDLL("libm.so.6").fesetround(0x800)
from verifier.run import hidden_state
hidden_state._VALUES[1] = 0.0
hidden_state._VALUES[2] = 2.0 ** -52
"""

# --- the worker loop's ready snapshot rebound in its frame ---------------------------------------
# `gpu_worker.ReadyState` is immutable, a local of the worker's loop. Round 16's GOT residue
# (numpy's `memmove` as `memset`) left, then the loop frame's `ready` made one whose libraries'
# hashes are today's: through ctypes' `PyFrame_LocalsToFast` (READY_REBOUND), or with no ctypes
# at all by a trace function on the loop frame (3.11 writes a trace function's `f_locals` back
# into the frame: READY_TRACED; `sys.settrace(None)` before the settle reads it).
_FIND_READY = """
import sys
from verifier.run.tamper import process_state
f = sys._getframe()
while f is not None and "ready" not in f.f_locals:
    f = f.f_back
now = process_state()


def refreshed(ready):
    return ready._replace(residue=tuple((k, now.get(k, v) if "GOT" in k else v)
                                        for k, v in ready.residue))
"""
READY_REBOUND = _FIND_READY + """
import ctypes
loc = f.f_locals
loc["ready"] = refreshed(loc["ready"])
ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(f), ctypes.c_int(0))
"""
READY_TRACED = _FIND_READY + """
def tracer(frame, event, arg):
    if frame is f and event == "line":
        frame.f_locals["ready"] = refreshed(frame.f_locals["ready"])
        frame.f_trace = None
        sys.settrace(None)
    return tracer


f.f_trace, f.f_trace_lines = tracer, True
sys.settrace(lambda *a: None)
"""
