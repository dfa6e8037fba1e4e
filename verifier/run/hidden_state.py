"""Process state a job can change for every later job of its worker that no Python or torch
getter shows, or that the identity walk of `verifier.run.tamper.process_state` (each module's
public callables) misses: read by its effects, or by value.

- The main thread's floating-point environment (the SSE control register, MXCSR, and the x87
  control word): its rounding mode and flush-to-zero / denormals-are-zero bits. One libm call
  (`fesetround(FE_UPWARD)`, `<cfenv>` in a compiled candidate) or the public
  `torch.set_flush_denormal(True)` stays set after the job: every later job's arithmetic on
  this thread rounds up, and an honest sibling's sequential fp32 scan of 16k elements drifted
  by n ulps instead of ~sqrt(n), wrong by the judge's own check (a failure that stands:
  tests/verifier/test_redteam_round13.py). Python's float arithmetic runs on the same
  register, so a few operations on runtime values (not constants the compiler folds) show
  the mode: upward, downward and toward-zero rounding each give another sum than
  round-to-nearest, flush-to-zero a zero for a subnormal result, denormals-are-zero a zero
  for a subnormal operand.
- The codecs registry: `codecs.register(fn)` puts `fn` in the interpreter's search path,
  called at every later lookup of an encoding not looked up yet, any job's; there is no
  getter, but the path is a list that holds `encodings.search_function`, found as its
  referrer. (Not compared: `encodings._cache`, the stock search function's results, a dict
  every honest lookup of a new name adds to.)
- numpy's floating-point error state (`np.seterr`, `np.seterrcall`): a context variable of the
  thread's context, which the worker's jobs share. `seterr(all="call")` with a function that
  slept 5 ms ran it at every later floating-point error of any job's numpy call: an honest
  sibling whose numpy kernel underflows was timed at 5435 us a call instead of 20 (no failure
  anywhere: nothing was run again; tests/verifier/test_redteam_round13.py).
- numpy's ufunc loop tables: each ufunc's C inner loops (`PyUFuncObject.functions` and
  `data`, one per type signature) are plain memory behind an object whose identity stays:
  `np.maximum`'s float32 loop pointed at `np.minimum`'s computed the minimum for every later
  job (an honest numpy ReLU judged wrong). Read by value (`numpy_loops`).
- a loaded package's `__path__`, the list its submodules are found on (not callable: the walk
  skips it; changed in place, its identity stays). A job that put /dev/shm first on
  `json.__path__` ran its file at a later job's `import json.tool`, which added 1 to that
  job's outputs (the judge's failure, charged to the honest job). Each package's path is
  compared by value, and a path into a directory a job can write (`writable`) is residue
  whichever package holds it, one loaded since too.
- where imports look for cached bytecode (`sys.pycache_prefix`, a str: the walk skips it). A
  job that set it to its worker's tmpfs, with a .pyc for `graphlib` whose header matched the
  source's size and mtime, ran its own code at a later job's `import graphlib` (torch.relu
  rebound: the honest sibling a cheat, run again; tests/verifier/test_redteam_round17.py).
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from verifier.run.c_identity import namespace

# runtime values: the compiler folds constant expressions (in round-to-nearest, at import)
# (a tuple: a job that wrote a list's items, 0 and 2^-52 for the two that tell the rounding,
# left rounding upward with the probe's answer unchanged: round 18)
_VALUES = (1.0, 2.0 ** -60, 2.0 ** -53 + 2.0 ** -60, 2.0 ** -1022, 2.0 ** -1074)


def float_environment(values: tuple[float, ...] = _VALUES) -> tuple[float, ...]:
    """What this thread's arithmetic makes of a few sums and products whose results differ by
    rounding mode, flush-to-zero and denormals-are-zero (the same tuple for the same mode)."""
    one, tiny, over_half, smallest_normal, smallest = values
    return (one + tiny,  # round-to-nearest: 1.0; upward: the next double
            -one - tiny,  # downward: the next double below -1
            one + over_half,  # nearest: 1 + 2^-52; toward zero and downward: 1.0
            smallest_normal * 0.5 * one,  # flush-to-zero: 0.0
            smallest * 2.0 * one)  # denormals-are-zero: 0.0


def codec_search() -> tuple[int, ...]:
    """Identity of the functions on the codecs search path: the interpreter's list that held
    `encodings.search_function` when first asked (found as its referrer once: a scan of every
    object; the list stays the interpreter's for the process's life, changed in place)."""
    if not _PATH:
        stock = getattr(sys.modules.get("encodings"), "search_function", None)
        _PATH.extend(r for r in gc.get_referrers(stock) if type(r) is list) if stock else None
    return tuple(id(fn) for path in _PATH for fn in list(path))


_PATH: list[Any] = []  # the interpreter's codecs search path (`codec_search`)


def numpy_errors() -> tuple[Any, ...]:
    """numpy's error modes and the identity of its error callback (numpy's defaults where it
    is not loaded yet: a job that first imports it changes nothing)."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not hasattr(numpy, "geterr"):
        return NUMPY_DEFAULT
    return tuple(sorted(numpy.geterr().items())) + (id(numpy.geterrcall()),)


def numpy_loops() -> int:
    """A figure of every numpy ufunc's inner-loop tables (the functions and their data, per
    type signature; 0 where numpy is not loaded or its ufunc layout is not the one read here:
    PyObject_HEAD, four ints, `functions`, `data`, `ntypes`)."""
    import ctypes

    numpy = sys.modules.get("numpy")
    kind = getattr(numpy, "ufunc", None)
    if kind is None:
        return 0
    word, out = ctypes.sizeof(ctypes.c_void_p), []
    for name, uf in sorted((n, u) for n, u in list(namespace(numpy).items())
                           if type(u) is kind):
        at = id(uf) + 2 * word + 16  # after PyObject_HEAD and nin, nout, nargs, identity
        functions, data = (ctypes.c_void_p.from_address(at + k * word).value for k in (0, 1))
        if ctypes.c_int.from_address(at + 2 * word).value != uf.ntypes:
            return 0  # another layout: nothing read
        out.append((name, functions, data) + tuple(
            ctypes.c_void_p.from_address(table + i * word).value
            for table in (functions, data) if table for i in range(uf.ntypes)))
    return hash(tuple(out))


NUMPY_DEFAULT = (("divide", "warn"), ("invalid", "warn"), ("over", "warn"), ("under", "ignore"),
                 id(None))


def _search_path(module: Any) -> tuple[tuple[str, ...], bool] | None:
    """A package's `__path__` as the import system iterates it (a list, or a namespace
    package's `_NamespacePath`: True) or an object of its own (torch.ops: its type's name,
    False); None for a module that is not a package."""
    path = getattr(module, "__path__", None) if isinstance(module, type(sys)) else None
    if type(path) is list or type(path).__name__ == "_NamespacePath":
        return tuple(map(str, list(path))), True
    return None if path is None else ((type(path).__name__,), False)


def package_paths() -> dict[str, int]:
    """Each loaded package's search path by value, and the packages whose path enters a
    directory a job of the worker can write (all of them, in one key: none, honestly)."""
    out, into, roots = {}, [], writable_roots()
    for name, module in list(sys.modules.items()):
        got = _search_path(module) if type(name) is str else None
        if got is not None:
            out[f"{name}.__path__ (value)"] = hash(got[0])
            into += [name] if got[1] and any(writable(p, roots) for p in got[0]) else []
    out["packages whose path is writable"] = hash(tuple(sorted(into)))
    return out


def writable_roots() -> tuple[str, ...]:
    """The directories a job of this worker can write (its tmpfs, shm), resolved now."""
    return tuple(os.path.realpath(p) for p in (os.environ.get("KS_WORKER_TMP") or "",
                                                "/dev/shm") if p)


def writable(path: str, roots: tuple[str, ...] | None = None) -> bool:
    """Whether `path` lies in a directory a job of this worker can write (`roots`, resolved
    once for a scan of many paths: `writable_roots` when None)."""
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep)
               for d in (writable_roots() if roots is None else roots))


# a count that may grow by at most `verifier.run.tamper.NAMES_SLACK` (a module's names too)
NAMES = " (names)"


def registries() -> dict[str, int]:
    """How many loggers and import-cache entries the process holds: each settle walks both (new
    ones are not compared), so a million of either made every later settle slower."""
    logging = sys.modules.get("logging")
    loggers = getattr(getattr(getattr(logging, "Logger", None), "manager", None), "loggerDict",
                      ())
    return {"logging loggers" + NAMES: len(loggers),
            "sys.path_importer_cache" + NAMES: len(sys.path_importer_cache)}


def copy_tables() -> int:
    """What `copy.deepcopy` and `copy.copy` dispatch on (`copy._deepcopy_dispatch`, a private
    dict; `copyreg.dispatch_table`, not callable: the walk skips both). The worker deep-copies
    the reference's data into a candidate's globals (`namespace.candidate_globals`) and the
    model for the fp64 second opinion (`device_compare.against_fp64`): a job that set
    `_deepcopy_dispatch[int]` to add one gave every later job's copies sizes off by one
    (tests/verifier/test_redteam_round17.py)."""
    tables = [getattr(sys.modules.get(m), t, None) for m, t in (
        ("copy", "_deepcopy_dispatch"), ("copy", "_copy_dispatch"), ("copyreg", "dispatch_table"))]
    return hash(tuple(frozenset((id(k), id(v), id(getattr(v, "__code__", None)))
                                for k, v in list(t.items())) if isinstance(t, dict) else None
                      for t in tables))


def foreign_ops() -> int:
    """The entries of torch's `aten` op namespace (`torch.ops.aten`: an object, not a module:
    the walk skips it) that are not the op packet of their own name. The fallback check reads
    each traced op's kind through it (`verifier.checks.fallback.op_kind`): a job that left an
    object of its own under `empty_like` made an honest sibling's `torch.empty_like` "compute",
    a cheat (tests/verifier/test_redteam_round17.py); it now reads schemas and tags from
    torch._C, whose classes' attributes are compared (`op_metadata`)."""
    ops = sys.modules.get("torch._ops")
    aten = getattr(getattr(ops, "ops", None), "aten", None)
    packet = getattr(ops, "OpOverloadPacket", None)
    if aten is None or packet is None:
        return 0
    return hash(frozenset((k, id(v)) for k, v in list(vars(aten).items())
                          if k[:1] != "_" and k != "name" and not (
                              type(v) is packet and v._qualified_op_name == "aten::" + k)))


def op_metadata() -> int:
    """Identity of the attributes of the classes the fallback check reads an op's kind through
    (`torch.Tag`, the schema's classes, its argument types': pybind classes, settable): a job
    that set `torch.Tag.view_copy = torch.Tag.pointwise` made every later job's `torch.relu` a
    "copy", a cheat that passed the strict policy (tests/verifier/test_redteam_round17.py)."""
    c = sys.modules.get("torch._C")
    if c is None:
        return 0
    kinds = [getattr(c, n, None) for n in ("Tag", "FunctionSchema", "Argument", "_AliasInfo")]
    kinds += list(getattr(c, "Type", type).__subclasses__()) + [getattr(c, "Type", None)]
    return hash(frozenset((getattr(k, "__name__", ""), a, id(v)) for k in kinds if k is not None
                          for a, v in list(vars(k).items())))


# torch's modules the worker's op trace runs through (`fallback.make_trace_mode`: a dispatch mode
# pushed by `_python_dispatch._push_mode`; `op_trace.OpNames`: the profiler; `torch._ops`: each
# op's call): the walk reads only their public callables
TRACE_MODULES = ("torch.utils._python_dispatch", "torch.overrides", "torch._ops",
                 "torch.autograd.profiler", "torch.profiler.profiler")


def trace_machinery() -> int:
    """Identity of every callable of TRACE_MODULES, private ones too, and of the attributes of
    their classes: a job that made `_push_mode` and `_pop_mode` do nothing left every later
    job's trace empty, and a later forward that was `torch.relu` passed the strict policy
    (tests/verifier/test_redteam_round17.py)."""
    out = []
    for name in TRACE_MODULES:
        module = sys.modules.get(name)
        for k, v in list(namespace(module).items()) if module is not None else ():
            if isinstance(v, type) and getattr(v, "__module__", None) == name:
                out.extend((name, k, a, id(b), id(getattr(b, "__code__", None)))
                           for a, b in list(vars(v).items()))
            elif callable(v):
                out.append((name, k, "", id(v), id(getattr(v, "__code__", None))))
    return hash(frozenset(out))


# torch's Python front whose private names the walk skips: `torch._VF` (an object answering
# torch's C functions by `__getattr__`: `torch.einsum`, `torch.norm`, `torch.meshgrid`, nn.LSTM
# and dropout call through it) and the modules that hold it or their own helpers
FRONT_MODULES = ("torch._VF", "torch.functional", "torch.nn.functional", "torch.nn.modules.rnn")


def torch_front() -> int:
    """Identity of every callable and module object of FRONT_MODULES, private ones too: a job
    that put its own `einsum` on `torch._VF` (a name `__getattr__` would answer, so never
    walked) made every later job's `torch.einsum` its own (tests/verifier/
    test_redteam_round17.py)."""
    loaded = [(n, sys.modules[n]) for n in FRONT_MODULES if sys.modules.get(n) is not None]
    return hash(frozenset((name, k, id(v)) for name, module in loaded
                          for k, v in list(namespace(module).items())
                          if callable(v) or isinstance(v, type(sys))))


def kernel_standing() -> tuple[str, int]:
    """The process's OOM score adjustment (raised to 1000 by a job, its worker was the host OOM
    killer's first pick in every later job) and its thread's I/O priority (`ioprio_set`'s idle
    class: a later job's reads, its extension's .so, wait behind any other I/O); round 17."""
    import ctypes
    import platform

    try:
        with open("/proc/self/oom_score_adj") as f:
            oom = f.read().strip()
    except OSError:
        oom = "?"
    number = {"x86_64": 252, "aarch64": 31}.get(platform.machine())  # ioprio_get
    io = ctypes.CDLL(None, use_errno=True).syscall(number, 1, 0) if number else -1
    return oom, io


def snapshot() -> dict[str, int]:
    """The keys `process_state` compares for this module."""
    return {**package_paths(), **registries(),
            "floating-point environment": hash(float_environment()),
            "codecs search path": hash(codec_search()),
            "numpy floating-point error state": hash(numpy_errors()),
            "numpy ufunc loops": numpy_loops(),
            "sys.pycache_prefix": hash(str(getattr(sys, "pycache_prefix", None))),
            "OOM score and I/O priority": hash(kernel_standing()),
            "copy and copyreg dispatch tables": copy_tables(),
            "torch.ops.aten (entries of no op of their name)": foreign_ops(),
            "torch op metadata classes": op_metadata(),
            "torch's op trace machinery": trace_machinery(),
            "torch's Python front (private names too)": torch_front()}
