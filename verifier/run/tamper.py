"""The harness's own functions a candidate must not replace: a snapshot before the candidate
loads, and the check after it ran (a replaced function, or a Python thread it left running, is
a cheat)."""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import threading
import types
from itertools import compress
from typing import Any

from verifier.run import hidden_state, import_residue, thread_settings
from verifier.run.audit import refuse_audit_hooks as refuse_audit_hooks  # the worker's
from verifier.run.c_identity import CODED as _CODED  # (the module walk's inlined `identity`)
from verifier.run.c_identity import (
    c_function_pointer,
    common_type_slots,
    identity,
    namespace,
    type_slots,
)

# Functions the harness relies on; a candidate that replaces any of them is tampering.
GUARDED = (
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "time"),
    ("time", "monotonic"), ("time", "sleep"), ("torch", "allclose"), ("torch", "equal"),
    ("torch.cuda", "synchronize"), ("torch.cuda", "Event"),
    ("torch.testing", "assert_close"), ("torch.Tensor", "__eq__"), ("torch.Tensor", "clone"),
    ("torch.Tensor", "abs"), ("torch.Tensor", "double"), ("torch.Tensor", "to"),
    ("torch.nn.Module", "__call__"), ("threading", "Thread"),
)



def resolve(path: str) -> Any:
    """The object at a dotted path (`torch.cuda.synchronize`) among loaded modules, or None."""
    obj: Any = sys.modules.get(path.split(".")[0])
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
    return obj


def harness_modules() -> tuple[str, ...]:
    """The loaded harness modules: every `verifier.*` one and `__main__` when it runs one (the
    worker's loop runs as `python -m verifier.run.gpu_worker`: a job that rebound its private
    `_run_one` ran another candidate in every later job, tests/verifier/test_redteam_round9b)."""
    main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") or ""
    return tuple(sorted(n for n in list(sys.modules) if n.startswith("verifier."))) + (
        ("__main__",) if main.startswith("verifier.") else ())


def guard_snapshot() -> dict[str, Any]:
    """The guarded functions as they are now (and the C functions behind the builtins)."""
    snap: dict[str, Any] = {}
    for owner, attr in GUARDED:
        obj = resolve(owner)
        if obj is not None and hasattr(obj, attr):
            fn = getattr(obj, attr)
            snap[f"{owner}.{attr}"] = fn
            meth = c_function_pointer(fn)
            if meth is not None:
                snap[f"{owner}.{attr} (C function)"] = meth
    return snap


def check_tamper(res: Any, guard: dict[str, Any], threads_before: int) -> None:
    """End the run as a cheat if the candidate replaced a guarded function (against `guard`,
    the snapshot before it loaded) or left Python threads running."""
    now = guard_snapshot()
    changed = [name for name, obj in guard.items()
               if (now.get(name) != obj if isinstance(obj, int) else now.get(name) is not obj)]
    if changed:
        for name in changed:
            res.finding("patched_function", f"{name} was replaced by the candidate")
        res.finish("cheat", f"the candidate replaced {', '.join(changed)}")
    if threading.active_count() > threads_before:
        res.finding("extra_thread", "the candidate started Python threads")
        res.finish("cheat", "the candidate started threads that outlive forward")


# threads of the process the interpreter does not list (a ctypes `pthread_create` of a Python
# callback, a detached C++ thread): more than when ready, one may run in a later job
OS_THREADS = "native threads"
# the newest of them (thread ids only grow in the worker's pid namespace): a job that ended a
# thread of the ready worker (a signal whose handler is libc's `pthread_exit`) and started its
# own kept the count, and its thread ran in later jobs (tests/verifier/test_redteam_round15.py)
NEWEST_THREAD = "native threads (the newest)"
_GROWS = (OS_THREADS, NEWEST_THREAD)  # residue only where more, or newer, than before
# names a module of the ready worker may gain (lazy attributes, submodules imported); a job
# that gave `os` a million names (new names are not compared) made every later settle's walk
# 3 s (tests/verifier/test_redteam_round15.py)
NAMES, NAMES_SLACK = hidden_state.NAMES, 1000
MODULE = " (module)"  # (a bare name: sys.modules["numpy.where"] wrote over that function's key)


def process_state() -> dict[str, int]:
    """What code left by one job could run or answer through in a later job of the same
    process, by identity: the hooks the interpreter calls on its own (profile, trace, import,
    collection, unraisable and excepthooks), the import machinery, and every loaded module and
    its callables (`numpy.maximum` rebound made an honest sibling's numpy ReLU "incorrect":
    tests/verifier/test_redteam_round9.py; private ones too: numpy's `fromnumeric._wrapfunc`,
    round 18), and its threads. Audit hooks cannot be listed: the persistent worker refuses
    new ones, and rewrites of a function's code or defaults (`verifier.run.audit`)."""
    import builtins
    import gc

    state = {"sys.profile": id(sys.getprofile()), "sys.trace": id(sys.gettrace()),
             "threading.profile": id(threading.getprofile()),
             "threading.trace": id(threading.gettrace()),
             "builtins.__import__": id(builtins.__import__), "sys.excepthook": id(sys.excepthook),
             "sys.unraisablehook": id(sys.unraisablehook),
             "threading.excepthook": id(threading.excepthook),
             "gc.callbacks": hash(tuple(map(id, gc.callbacks))),
             # a threshold of 1 collected at each allocation of every later job (its windows
             # too), DEBUG_SAVEALL kept their garbage (tests/verifier/test_redteam_round9b)
             "gc.threshold": hash(gc.get_threshold()), "gc.debug": gc.get_debug(),
             "sys.meta_path": hash(tuple(map(id, sys.meta_path))),
             "sys.path_hooks": hash(tuple(map(id, sys.path_hooks))),
             OS_THREADS: len(tasks := os.listdir("/proc/self/task")),
             NEWEST_THREAD: max(map(int, tasks)),
             # kernels registered from Python (`torch.library.Library(...).impl`): one for
             # aten::relu on cpu made every later job's reference wrong ("incorrect")
             "torch.library registrations": hash(frozenset(_py_kernels())),
             "logging handlers": hash(logging_hooks()), "sys.monitoring": monitoring(),
             "os.environ": hash(frozenset(os.environ.items())),  # what libraries read at use
             "C type slots (builtins, numpy, torch)": common_type_slots(),
             **{k: hash(str(v)) for k, v in torch_switches().items()},
             **class_attributes(), **process_settings(), **protocol_state(),
             **torch_private(), **interpreter_private(), **hidden_state.snapshot(),
             **thread_settings.snapshot()}
    # keys of no exact str in sys.modules or a module's namespace: a job's own str class there
    # runs its `__eq__` at every later lookup of a name of equal hash (`import numpy` in the
    # next job ran it: tests/verifier/test_redteam_later_code.py)
    odd = [id(k) for k in list(sys.modules) if type(k) is not str]
    for name, module in list(sys.modules.items()):
        if type(name) is not str:
            continue
        state[name + MODULE] = hash((id(module), id(type(module))))  # (`MODULE`)
        try:
            names = list(namespace(module).items())
        except TypeError:  # not a module (an object placed in sys.modules)
            continue
        odd.extend(id(k) for k, _ in names if type(k) is not str)
        state[name + NAMES], dot = len(names), name + "."  # (`identity` inlined: 45k names)
        state.update([(dot + k, identity(v) if type(v) in _CODED else id(v)) for k, v in names
                      if type(k) is str and callable(v)])
    state["keys of no str"] = hash(frozenset(odd))
    return state


# the modules whose classes every job's tensors and models go through: an operator or method
# rebound on one of them (only the module's public callables were compared), such as
# `torch.Tensor.__mul__` or `nn.Module.__getattr__`, ran in every later job of the worker (an
# honest sibling's `x * 2` gave 2x + 1: "incorrect"; tests/verifier/test_redteam_round10.py);
# and the classes the harness's own per-job code goes through: its own (`verifier.*`) and
# `contextlib`'s (every `@contextmanager`: `_GeneratorContextManager.__exit__` rebound ran in
# each later job's trial loop and wrote its slot: tests/verifier/test_redteam_round13.py)
CLASS_MODULES = ("torch._tensor", "torch.nn", "torch.autograd.function", "weakref",
                 "contextlib", "verifier", "ctypes")  # ctypes: the C memory checks' reader


def class_attributes() -> dict[str, int]:
    """Identity of the attributes, dunders included, of every class in a module of
    CLASS_MODULES (or a submodule) and of its bases (torch.Tensor's C base, TensorBase, holds
    `copy_` and every method torch defines in C): one figure per class (torch.Tensor says it
    is `torch`'s)."""
    out = {}
    under = tuple(m + "." for m in CLASS_MODULES)
    for name, module in list(sys.modules.items()):
        if name not in CLASS_MODULES and not name.startswith(under):
            continue
        for v in list(namespace(module).values()):
            for cls in v.__mro__[:-1] if isinstance(v, type) else ():  # (not `object`)
                key = f"{getattr(cls, '__module__', '')}.{cls.__qualname__} attributes"
                if key not in out:
                    out[key] = hash((type_slots(cls), frozenset(  # and its C slots
                        (a, identity(b)) for a, b in list(namespace(cls).items()))))
    return out


# what the worker's own exchange runs through: it reads each job with `json.loads` and writes
# each result with `json.dumps` (a job that rebound `JSONDecoder.decode` swapped the next job's
# candidate for another; one that rebound `JSONEncoder.encode` made the next job's result
# "incorrect" under its own nonce), and takes the judge's descriptors with `socket.recv_fds`;
# it makes each job's folder with `tempfile.mkdtemp` and removes it with `shutil.rmtree` (a job
# that set the generator of tempfile's names to its own ran in the next job's mkdtemp)
PROTOCOL_MODULES = ("json", "json.decoder", "json.encoder", "json.scanner", "socket",
                    "tempfile", "shutil")


def protocol_state() -> dict[str, int]:
    """Identity of every global of PROTOCOL_MODULES, private ones too (`json._default_decoder`
    is what `json.loads` calls), and of the attributes of their classes and objects."""
    tmp = sys.modules.get("tempfile")
    if tmp is not None:  # tempfile's lazy state, made as ready: the first job's draw is no change
        next(tmp._get_candidate_names())
        with contextlib.suppress(OSError):  # no writable temporary directory: stays unset
            tmp.gettempdir()
    out = {}
    for name in PROTOCOL_MODULES:
        module = sys.modules.get(name)
        for k, v in list(namespace(module).items()) if module is not None else ():
            out[f"{name}.{k} (protocol)"] = identity(v)
            held = getattr(v, "__dict__", None)
            if isinstance(held, types.MappingProxyType | dict) and not isinstance(
                    v, types.ModuleType | types.FunctionType | types.BuiltinFunctionType):
                out[f"{name}.{k} (protocol) attributes"] = hash(frozenset(
                    (a, identity(b)) for a, b in list(held.items())))
    return out


def torch_private() -> dict[str, int]:
    """Identity of the private globals of `torch` and `torch._C` (not modules): the hygiene
    checks read torch through them (`torch._C._len_torch_function_stack`,
    `torch._GLOBAL_DEVICE_CONTEXT`); a job that rebound the counter to say one less hid the
    torch-function mode it left, which added 1 to every later job's tensors
    (tests/verifier/test_redteam_round10.py)."""
    out = {}
    for name in ("torch", "torch._C"):
        module = sys.modules.get(name)
        for k, v in list(namespace(module).items()) if module is not None else ():
            if k.startswith("_") and not isinstance(v, types.ModuleType):
                out[f"{name}.{k} (private)"] = identity(v)
    return out


# modules whose private callables the interpreter calls on its own: every `class` statement
# (`builtins.__build_class__`), every shown warning (`warnings._showwarnmsg`), every import of
# a module not loaded yet (`importlib._bootstrap._find_and_load`): rebound by one job, each ran
# in later jobs (tests/verifier/test_redteam_round12.py); and ctypes', through which every check
# of C memory reads (its `_string_at` rebound to answer old bytes hid a repointed type slot)
PRIVATE_CALLABLES = ("builtins", "warnings", "importlib._bootstrap",
                     "importlib._bootstrap_external", "ctypes")


def interpreter_private() -> dict[str, int]:
    """Identity of the private callables of PRIVATE_CALLABLES, and by value what the
    interpreter and torch consult at every warning, import and module call: `warnings.filters`
    (a filter's `match` is code), the finders of `sys.path_importer_cache` (a finder a job put
    there answered a later job's import: `verifier.run.import_residue`), torch's global module hooks (one added to the dict
    made every later job's output its own)."""
    import warnings

    out = {}
    for name in PRIVATE_CALLABLES:
        module = sys.modules.get(name)
        for k, v in list(namespace(module).items()) if module is not None else ():
            if k.startswith("_") and callable(v) and not isinstance(v, types.ModuleType):
                out[f"{name}.{k} (private)"] = identity(v)
    out["warnings.filters"] = hash(tuple(tuple(map(id, f)) for f in list(warnings.filters)))
    out.update(import_residue.snapshot(identity))  # its new entries: `import_residue.added`
    hooks = sys.modules.get("torch.nn.modules.module")
    for k, v in list(namespace(hooks).items()) if hooks is not None else ():
        if k.startswith("_global") and isinstance(v, dict):
            out[f"torch.nn.modules.module.{k}"] = hash(tuple((key, id(h))
                                                             for key, h in list(v.items())))
    return out


def process_settings() -> dict[str, int]:
    """The process's own settings a job can change for every later job of its worker, as
    measured (tests/verifier/test_redteam_round10.py): a umask of 777 (the next job's directory
    unusable: the worker died with an honest sibling's job), the priority (`os.nice`: later
    windows slower under load), resource limits (64 descriptors, a cpu-time limit), blocked
    signals (the hang report's SIGUSR1), the recursion limit, the thread switch interval
    (0.5 s), a thread's stack size, the int digit limit, the standard streams (their `write`
    and `flush` run in later jobs: the worker flushes after each), display hooks, and the
    `sys.modules` every check reads (imports read the interpreter's own dict: round 15)."""
    import resource
    import signal

    with open("/proc/self/status") as f:  # os.umask can only be read by setting it
        umask = next((ln for ln in f if ln.startswith("Umask:")), "")
    limits = [getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_")]
    return {"umask": hash(umask), "priority": os.getpriority(os.PRIO_PROCESS, 0),
            "rlimits": hash(tuple(resource.getrlimit(r) for r in sorted(set(limits)))),
            "signal mask": hash(frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, []))),
            # named as calls: "threading.stack_size" is the function's own key
            "sys.getrecursionlimit()": sys.getrecursionlimit(),
            "sys.getswitchinterval()": hash(sys.getswitchinterval()),
            "threading.stack_size()": threading.stack_size(),
            "sys.get_int_max_str_digits()": sys.get_int_max_str_digits(),
            "sys.getdlopenflags()": sys.getdlopenflags(),
            # a directory put first on it (the worker's tmpfs) served every later import
            "sys.path (value)": hash(tuple(map(str, sys.path))),
            **{f"sys.{n} (object)": id(getattr(sys, n, None)) for n in (
                "stdin", "stdout", "stderr", "displayhook", "breakpointhook", "modules")}}


# torch's switches of which kernels run and how (beside `gpu_worker.global_flags`): oneDNN off
# gave later jobs' convolutions and matmuls slower paths; attention, BLAS, fp16 sums on a GPU
SWITCHES = ("mkldnn.enabled", "mkldnn.deterministic", "cudnn.deterministic",
            "cuda.matmul.allow_bf16_reduced_precision_reduction", "cuda.flash_sdp_enabled()",
            "cuda.mem_efficient_sdp_enabled()", "cuda.math_sdp_enabled()",
            "cuda.cudnn_sdp_enabled()", "cuda.preferred_linalg_library()",
            "cuda.preferred_blas_library()", "opt_einsum.enabled", "opt_einsum.strategy",
            "mha.get_fastpath_enabled()", "cuda.matmul.allow_fp16_accumulation",
            "cuda.fp16_bf16_reduction_math_sdp_allowed()")  # (the last two: round 17)


def torch_switches() -> dict[str, Any]:
    """The values of `SWITCHES` this torch has (torch.backends.<name>)."""
    backends = getattr(sys.modules.get("torch"), "backends", None)
    got: dict[str, Any] = {}
    for name in SWITCHES:
        obj: Any = backends
        try:
            for part in name.removesuffix("()").split("."):
                obj = getattr(obj, part)
            got[f"torch.backends.{name}"] = obj() if name.endswith("()") else obj
        except (AttributeError, RuntimeError, AssertionError):  # not in this torch or build
            continue
    return got


def _py_kernels() -> set[str]:
    """The (op, dispatch key) kernels registered through torch.library from Python, the ops it
    defined, and torch's custom-op tables by identity (an entry of `OPDEF_TO_LIB` is destroyed
    by a later `custom_op` of its name: one a job left ran its handles in the next job's)."""
    lib, ops = sys.modules.get("torch.library"), sys.modules.get("torch._library.custom_ops")
    tables = [getattr(ops, n, None) for n in ("OPDEF_TO_LIB", "OPDEFS")]
    return set(getattr(lib, "_impls", ())) | {f"def {d}" for d in getattr(lib, "_defs", ())} | {
        f"{name} {id(v)}" for t in tables if t is not None for name, v in list(t.items())}


def logging_hooks() -> tuple[Any, ...]:
    """Identity of what `logging` calls as any logger logs: every logger's handlers and filters
    (and theirs, and the handlers' formatters), the logger and record classes (a handler a job
    put on torch's logger ran in the next job that logged: test_redteam_later_code)."""
    logging = sys.modules.get("logging")
    if logging is None:
        return ()
    loggers = [("", logging.getLogger())] + sorted(
        (n, lg) for n, lg in list(logging.Logger.manager.loggerDict.items())
        if isinstance(lg, logging.Logger) and (lg.handlers or lg.filters))
    return (id(logging.getLoggerClass()), id(logging.getLogRecordFactory())) + tuple(
        (name, tuple(map(id, lg.filters)), tuple(
            (id(h), id(getattr(h, "formatter", None)), tuple(map(id, getattr(h, "filters", ()))))
            for h in lg.handlers)) for name, lg in loggers)


def monitoring() -> int:
    """The tools of `sys.monitoring` (3.12) and the events each asked for (a freed tool's
    events stay set in 3.12): its callbacks run in every later job's Python code."""
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return 0
    return hash(tuple((mon.get_tool(t), mon.get_events(t)) for t in range(6)))


# rebound by the harness itself for each job (`verifier.checks.extspec.install_shim`)
PER_JOB = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline")


def left_in_process(before: dict[str, int]) -> list[str]:
    """What of `before` (`process_state`) a job changed or removed, the entries it added to
    `sys.path_importer_cache` that no import makes (`import_residue.added`), and the modules it
    added that the import system did not load from a file: a real module a job imported stays
    for later jobs as a lazily loaded library does; one placed in sys.modules under a name a
    later job imports (`colorsys` below, `triton` on a GPU) would be the placer's code in it."""
    now = process_state()
    # the keys whose value differs first, in C (each rule below needs a difference: ~50k keys)
    differ = compress(before, map(operator.ne, map(now.get, before), before.values()))
    changed = [k for k in differ if k not in PER_JOB and import_residue.compared(k, now)
               and (k not in _GROWS or now[k] > before[k])
               and (not k.endswith(NAMES) or now.get(k, 0) - before[k] > NAMES_SLACK)]
    changed += import_residue.added(before)
    return changed + [f"{name} (not imported from a file)" for name, m in list(
        sys.modules.items()) if name + MODULE not in before and not _imported(m)]


def _imported(module: Any) -> bool:
    """Whether `module` is what the import system loads: a spec whose origin is a file that
    exists outside the worker's writable directories, a built-in or frozen module, or such a
    namespace package (a module made in code and placed in sys.modules has no spec; one a job
    wrote to its worker's tmpfs and loaded from there was the next job's `import tabnanny`:
    tests/verifier/test_redteam_round10.py)."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if spec is None or not isinstance(module, type(sys)):
        return False
    if origin is None:
        places = list(getattr(spec, "submodule_search_locations", None) or ())
        return bool(places) and not any(map(hidden_state.writable, places))
    return origin in ("built-in", "frozen") or (os.path.isfile(origin)
                                                 and not hidden_state.writable(origin))


def residue_ends_it(result: dict[str, Any], residue: dict[str, int]) -> bool:
    """Whether the job left a hook or a changed module that later jobs would run or import
    (then its worker goes: an info finding; a harness function rebound is a cheat, `after_job`)."""
    left = left_in_process(residue)
    if left:
        result.setdefault("findings", []).append({
            "rule": "worker_replaced", "severity": "info", "line": None,
            "message": "the run left " + ", ".join(left[:8]) + " changed in its worker: "
                       "its worker was replaced"})
    return bool(left)
