"""What one job of a persistent worker leaves to run later (or holds), found before the next
job comes.

Candidate code can outlive its run without a thread: a finalizer of its cyclic garbage runs
whenever the collector next runs (in a sibling's job, its timed windows included, unless the
garbage is collected first), and one that leaves another such object behind runs in every later
job; a `weakref.finalize`, a weak reference's callback or a `__del__` runs when some object
dies, perhaps in a later job (at the settle those are detached or their objects held:
`verifier.run.disarm`); a `gc.callbacks` entry runs at every collection. Such code could
sleep in a sibling's windows or change the harness while a sibling runs (its hygiene check
would then call the sibling a cheat). So
between jobs, once the parent has checked the last job's trials, the worker collects its
garbage (its finalizers run then, charged to that job) and its checks run again
(`verifier.run.gpu_worker`). `atexit` handlers run only as the worker exits, after its last
result: no sibling's run is left for them to reach. Memory a job leaves held beyond
`HELD_SLACK_BYTES` ends its worker too (`memory_ends_it`).
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import types
import weakref
from typing import Any

from verifier.run.disarm import detach_all, pin_mortal

# collections in a row that may still find garbage (a finalizer's own garbage, then that of
# its finalizers) before the garbage counts as renewing itself
RENEW_ROUNDS = 4

# torch's own `weakref.finalize` callbacks (a `torch.library.Library` each of its imports
# defines; dynamo's guards on compiled code): an honest job that imports or compiles leaves them.
# Each is found by identity as first seen (the worker's ready: `armed_finalizers`), with the
# types torch hands it: a name is the candidate's to give (`__module__` is writable: its own
# function named "torch.fx.x" ran in the next job), and other torch functions run what they
# are given (`torch.fx.graph_module._exec_with_source`); tests/verifier/test_redteam_round10.py
TORCH_FINALIZERS = (("torch.library", "_del_library"),
                    ("torch._dynamo.guards", "CheckFunctionManager.invalidate"))
TORCH_TYPES = (("torch._C", "_DispatchModule"), ("torch._library.utils", "RegistrationHandle"),
               ("torch._dynamo.guards", "CheckFunctionManager"))
PLAIN = (str, bytes, int, float, bool, type(None))
CONTAINERS = (tuple, list, set, frozenset, dict)
_FOUND: dict[tuple[str, str], Any] = {}  # the names above as first found


def collect_left_garbage() -> tuple[int, bool]:
    """Collect until nothing is found, at most RENEW_ROUNDS times: (objects found, whether
    the garbage was still renewing itself at the end)."""
    found = 0
    for _ in range(RENEW_ROUNDS):
        n = gc.collect()
        found += n
        if n == 0:
            return found, False
    return found, True


def _first_found(names: tuple[tuple[str, str], ...]) -> list[Any]:
    """The objects at `names` (module, dotted name) in loaded modules, each as first found."""
    for module, name in names:
        obj: Any = sys.modules.get(module)
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            _FOUND.setdefault((module, name), obj)
    return [_FOUND[n] for n in names if n in _FOUND]


def _torch_data(x: Any) -> bool:
    """Whether `x` holds only builtin values (exact types, in builtin containers) and objects
    of the types torch hands its finalizers (`TORCH_TYPES`)."""
    kinds = _first_found(TORCH_TYPES)
    stack = [x]
    for _ in range(100_000):
        if not stack:
            return True
        x = stack.pop()
        if type(x) in CONTAINERS:
            stack.extend([*x.keys(), *x.values()] if type(x) is dict else x)
        elif type(x) not in PLAIN and not any(type(x) is k for k in kinds):
            return False
    return False


def torch_own(info: Any) -> bool:
    """Whether a `weakref.finalize` entry is torch's own: one of its functions, by identity,
    called with torch's data (`_torch_data`)."""
    func, args = info.func, [info.args, info.kwargs or {}]
    while isinstance(func, functools.partial):
        args += [func.args, func.keywords]
        func = func.func
    if isinstance(func, types.MethodType):
        args.append(func.__self__)
        func = func.__func__
    return any(func is f for f in _first_found(TORCH_FINALIZERS)) and all(
        map(_torch_data, args))


def _function_of(func: Any) -> Any:
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__func__", func)  # a bound method's function


def _named(info: Any) -> str:
    """A finalizer's function as its module and name say (the candidate's to give)."""
    func = _function_of(info.func)
    module = str(getattr(func, "__module__", "") or "")
    return f"{module}.{getattr(func, '__qualname__', type(func).__name__)}"


def armed_finalizers() -> dict[Any, str]:
    """Live `weakref.finalize` registrations other than torch's own: {the finalizer: its
    function's name} (held, so a later one cannot take a dead one's identity)."""
    _first_found(TORCH_FINALIZERS + TORCH_TYPES)  # at the worker's ready, before any job
    registry = weakref.finalize._registry  # type: ignore[attr-defined]
    return {fin: _named(info) for fin, info in list(registry.items()) if not torch_own(info)}


def gc_callbacks() -> tuple[int, ...]:
    """Identity of every function the collector calls at each collection."""
    return tuple(id(c) for c in gc.callbacks)


def leftover_code(armed_before: dict[Any, str], mark: list[Any] | None,
                  skip: tuple[Any, ...] = ()) -> list[str]:
    """What the last job left to run in a later one, its garbage collected (its finalizers
    have run): garbage that renews itself, `weakref.finalize` callbacks it armed other than
    torch's (the harness's caches emptied first: `clear_harness_caches`). Then every finalizer
    is detached, torch's too, and what the job left alive that would run code as it dies is
    held for the worker's life (`verifier.run.disarm`; `mark`: `disarm.note_frozen`'s at the
    harness's last freeze, None to scan every object; `skip`: the harness's immutable objects,
    not walked)."""
    _, renewing = collect_left_garbage()
    clear_harness_caches()
    left = []
    if renewing:
        left.append(f"cyclic garbage whose finalizers leave more ({RENEW_ROUNDS} collections "
                    "in a row found some)")
    _first_found(TORCH_FINALIZERS + TORCH_TYPES)
    armed = [_named(info) for fin, info in detach_all()
             if fin not in armed_before and not torch_own(info)]
    pin_mortal(mark, skip)
    if armed:
        left.append("weakref.finalize callbacks armed (" + ", ".join(sorted(set(armed))[:3])
                    + ")")
    return left


def clear_harness_caches() -> int:
    """Empty every `functools` cache among the harness's module globals but `KEPT_CACHES`; how
    many. What a job computed through them with the process patched for its own run stays for
    later jobs once the patch is undone: a job that made `ctypes.CDLL` answer no `mallopt` for
    one call of `verifier.run.allocator._mallopt` left every later settle's `pin` undoing
    nothing, and its M_PERTURB filled every later job's blocks
    (tests/verifier/test_redteam_round18.py)."""
    from verifier.run.tamper import harness_modules

    caches = [v for name in harness_modules() for k, v in list(vars(sys.modules[name]).items())
              if type(v) is functools._lru_cache_wrapper and f"{name}.{k}" not in KEPT_CACHES]
    for cache in caches:
        cache.cache_clear()
    return len(caches)


# ELF headers by file and stamp (11 ms a settle to read again): a layout forged there changes the
# libraries' hashes from the ready snapshot's unless the job also forged, by ctypes, a copy of
# the tables it wrote (open, as ctypes writes are: `verifier.run.audit`)
KEPT_CACHES = ("verifier.run.relocations._layout",)


def charge_settled(payload: dict[str, Any], reply: dict[str, Any] | None, why: str) -> bool:
    """Add what the worker found as it settled (its reply, None when there was none: `why`)
    to the payload of the job that left it; True when the worker must go."""
    found = payload.setdefault("findings", [])
    if reply is None or not reply.get("settled"):
        found.append({"rule": "worker_replaced", "severity": "warning", "line": None,
                      "message": f"the worker did not settle after the run ({why}): it was "
                      "replaced"})
        return True
    found.extend(f for f in reply.get("findings") or () if isinstance(f, dict))
    if reply.get("outcome") != "ok":
        payload.update(outcome=str(reply.get("outcome")), error=str(reply.get("error") or ""))
        if reply.get("sticky_cuda_error"):
            payload["sticky_cuda_error"] = reply["sticky_cuda_error"]
        return True
    return bool(reply.get("worker_leaves"))


def strays_end_it(result: dict[str, Any]) -> bool:
    """Whether processes the candidate started outlived its run (then the result says so)."""
    strays = stray_processes()
    if strays:
        result.setdefault("findings", []).append({
            "rule": "stray_process", "severity": "error", "line": None,
            "message": f"processes {strays[:5]} started by the candidate outlived its run"})
        result.update(outcome="cheat", error="processes started by the candidate outlived "
                      f"its run ({len(strays)}); the worker ends with them")
    return bool(strays)


def free_bytes(path: str) -> int:
    """Bytes free to an unprivileged writer on the filesystem of `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def stray_processes() -> list[int]:
    """Other processes of this worker's pid namespace (it is pid 1 there when sandboxed:
    `verifier.isolation.isolate`), zombies reaped first; [] when it is not pid 1."""
    if os.getpid() != 1:
        return []
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != 1]


# memory a job may leave held in the worker beyond what it held when ready (host: resident;
# device: allocated) before the worker is replaced: a model's __del__ or a module global that
# kept 2.5 GB alive made the next job of the same worker, an honest sibling, die of its memory
# bound (tests/verifier/test_redteam_round8.py); on a GPU, device memory it keeps is memory the
# next job's trials and the reference-only timer beside it lack
# (2 GiB: a GPU job's first matmul or convolution maps cuBLAS's or cuDNN's libraries, hundreds
# of MB of host memory that stay; the worker's warm-up pays those first: `verifier.run.
# gpu_worker`)
HELD_SLACK_BYTES = 2 << 30


def held_memory(keep: Any = None) -> tuple[int, int]:
    """This process's resident host bytes and allocated device bytes, less those of the tensors
    in `keep` (the last job's raw outputs, held on purpose)."""
    import torch

    with open("/proc/self/statm") as f:
        host = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    device = torch.cuda.memory_allocated() if torch.cuda.is_initialized() else 0
    stack = [keep]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            n = x.untyped_storage().nbytes()
            host, device = (host - n, device) if x.device.type == "cpu" else (host, device - n)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return host, device


def memory_ends_it(result: dict[str, Any], ready: tuple[int, int], keep: Any) -> bool:
    """Whether the job left memory held beyond `HELD_SLACK_BYTES` (then its worker goes: not a
    cheat, an info finding; the next job gets a fresh process)."""
    now = held_memory(keep)
    over = [f"{name} {(b - a) >> 20} MB" for name, a, b in zip(("host", "device"), ready, now,
                                                               strict=True)
            if b - a > HELD_SLACK_BYTES]
    if over:
        result.setdefault("findings", []).append({
            "rule": "worker_replaced", "severity": "info", "line": None,
            "message": "the run left memory held in its worker (" + ", ".join(over)
                       + " more than when it was ready): its worker was replaced"})
    return bool(over)
