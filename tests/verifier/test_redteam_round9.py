"""Red-team round 9 on the cpu backend: what one job of a persistent worker (`verifier.run.
gpu_worker`; its cpu loop here) leaves in the process for the next jobs, honest siblings'.

The hygiene checks after a job compared the public functions of a few named modules (torch,
time, threading, five harness modules), torch's global flags, signal handlers and timers, and
Python threads. Everything else a job rebinds or installs stayed for every later job of the
worker: a harness function, method or constant the worker looks up at call time (or one
rewritten in place through `__code__`), the interpreter's hooks (profile, import, collection,
import machinery, audit), any other loaded module (numpy), a module placed for a later import,
a native thread, a kernel registered for torch's own op, torch's kernel switches, the
environment, and files in the compile caches. Each is candidate code (or its answer) inside a
sibling's job: it can frame the sibling (a "cheat" verdict), fail it ("incorrect"), or slow
it; under a group-relative reward a policy gains by lowering its siblings. Each test gives
what the attack did before the fix (measured here).

Each attack is left by a model's `__del__` (it runs as the harness drops the model, after the
job's own checks), bypassing the static rules (`import sys`, `sys.modules` are what a candidate
compiled as an extension reaches anyway), as round 8 did. All run as one worker sequence
(`chain`): no timing is asserted, only verdicts, findings and which worker ran a job.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_round7_cases import NUMPY_RELU, WORKER_BACKEND  # noqa: E402
from verifier_cases import relu_task  # noqa: E402

from verifier.run.gpu_pool import GpuWorkerProcess  # noqa: E402
from verifier.run.outcome import RunOutcome, confirmed  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

TASK = relu_task(256, 256)


def _leaving(code: str) -> str:
    """An honest numpy ReLU whose model runs `code` when the harness drops it."""
    body = "".join(f"        {line}\n" for line in code.strip().splitlines())
    return NUMPY_RELU.replace("class ModelNew(torch.nn.Module):\n",
                              "class ModelNew(torch.nn.Module):\n    def __del__(self):\n"
                              + body + "\n")


def _jobs(sources: list[str], confirm: bool = False) -> list[dict[str, Any]]:
    """One job per source in one persistent cpu worker (restarted when a job ends it): their
    payloads, with the pid of the worker that ran each. `confirm`: each run as `GpuRunner`
    makes it (`verifier.run.outcome.confirmed`: an outcome its worker may owe to an earlier job
    is made again in a fresh worker; "confirmed" says why); without it, what the hygiene
    checks alone do."""
    job = {"backend": WORKER_BACKEND, "extensions": {},
           "options": {"trials": 2, "perf_trials": 2, "perf_warmup": 1, "construct": "device"}}
    worker = GpuWorkerProcess({}, backend=WORKER_BACKEND, host_memory_mb=4000)
    got = []
    try:
        for i, src in enumerate(sources):
            def once(i: int = i, src: str = src) -> RunOutcome:
                if not worker.alive():
                    assert worker.start(), worker.describe_exit()
                return worker.run({"job": {**job, "nonce": f"r9-{i}"}, "task_source": TASK,
                                   "candidate_source": src}, 180)

            out = confirmed(once, worker.stop) if confirm else once()
            got.append({**(out.payload or {}), "failure": out.failure,
                        "confirmed": out.confirmed})
    finally:
        worker.stop()
    return got


@pytest.fixture(scope="module")
def chain() -> dict[str, list[dict[str, Any]]]:
    """Every attack of this file and the jobs that ask after it, in one worker's sequence (a
    leaver ends its worker, its probe starts the next one, the next leaver runs beside it):
    seven worker starts, not fifteen."""
    runs = {"framer": [NUMPY_RELU, FRAMER, NUMPY_RELU, NUMPY_RELU], "hooks": [HOOKS, NUMPY_RELU],
            "native": [NATIVE, ASK_NATIVE], "override": [OVERRIDE, NUMPY_RELU],
            "switches": [SWITCHER, ASK_SWITCH], "placer": [PLACER, ASK_MODULE],
            "cacher": [CACHER, ASK_CACHE], "auditor": [AUDITOR, ASK, ASK]}
    got = _jobs([src for srcs in runs.values() for src in srcs])
    out, i = {}, 0
    for name, srcs in runs.items():
        out[name], i = got[i:i + len(srcs)], i + len(srcs)
    return out


def _said(payload: dict[str, Any], rule: str) -> list[str]:
    return [f["message"] for f in payload.get("findings", []) if f["rule"] == rule]


# the worker's own check of a trial's aten ops, looked up in its module at each job: rebound,
# every later job of the worker is called a library fallback, a cheat
FRAMER = _leaving("""
import sys
f = sys.modules["verifier.checks.fallback"]
f.judge_ops = lambda ops, policy, own: ([], "forward computes with torch ops: aten.relu")
# as well: a harness class's method, a private function of the worker's loop
result = sys.modules["verifier.run.job_result"].JobResult
finish = result.finish
result.finish = lambda self, outcome, error="": finish(self, outcome, error)
w = sys.modules["verifier.run.worker"]
w._trials = (lambda trials: lambda *a, **k: trials(*a, **k))(w._trials)
# a constant the checks read (what counts as data movement, not compute)
sys.modules["verifier.checks.fallback"].DATA_MOVEMENT = frozenset()
# and one rewritten in place: the function object (its identity) stays; the worker's audit
# hook refuses it now (`verifier.run.audit`), and `__del__` swallows the error
same = sys.modules["verifier.judge.tensors"].same
same.__code__ = (lambda a, b: not isinstance(a, tuple) and a is b).__code__
""")


def test_a_harness_function_rebound_for_the_next_job_is_the_rebinders_cheat(chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job rebinds `verifier.checks.fallback.judge_ops` (a module the hygiene check did not
    watch) as its model is dropped. Before: it passed ("ok", no finding) and the next job in
    its worker, an honest sibling's numpy ReLU, was called a cheat ("forward computes with
    torch ops"), the same worker; `JobResult.finish` rebound (a method of a harness class)
    made the next job's "ok" a cheat the same way, and so did `judge_ops.__code__` assigned (the
    function's identity unchanged; since round 18 the worker's audit hook refuses that rewrite
    as it is made, so the check after the job has no `tensors.same` to name). Now every loaded `verifier.*` module's
    globals (private functions too: the worker's loop calls `_trials` by its module's name;
    constants such as `fallback.DATA_MOVEMENT`) and its classes' methods are watched, by
    identity and code: the rebinding job is the cheat, its worker goes, the sibling
    passes. Two honest
    jobs in a row share their worker (no finding: the check does not replace honest workers)."""
    honest0, framer, honest1, honest2 = chain["framer"]
    assert honest0["outcome"] == "ok" and not _said(honest0, "worker_replaced"), honest0
    assert framer["outcome"] == "cheat", framer
    said = " ".join(_said(framer, "patched_function"))
    for name in ("verifier.checks.fallback.judge_ops", "verifier.run.job_result.JobResult.finish",
                 "verifier.run.worker._trials", "verifier.checks.fallback.DATA_MOVEMENT"):
        assert name in said, (name, framer["findings"])
    # the rewrite of `same.__code__` was refused as it was made (round 18's audit hook): the
    # function was never changed, so the check after the job has nothing of it to name
    assert "verifier.judge.tensors.same" not in said, framer["findings"]
    assert framer["worker_pid"] == honest0["worker_pid"]
    for p in (honest1, honest2):
        assert p["outcome"] == "ok" and not p["failure"], p
        assert not _said(p, "worker_replaced") and not _said(p, "patched_function"), p
    assert honest1["worker_pid"] == honest2["worker_pid"] != framer["worker_pid"]


# the interpreter's hooks and a third-party module, each of which runs (or answers) for every
# later job of the process: a profiler called at every Python call, an import finder and an
# import function consulted at every import, numpy's maximum
HOOKS = _leaving("""
import builtins, os, sys
import numpy
os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
class Finder:
    def find_spec(self, *a, **k):
        return None
sys.meta_path.insert(0, Finder())
imp = builtins.__import__
builtins.__import__ = lambda *a, **k: imp(*a, **k)
numpy.maximum = lambda a, b: a
# last: refused as it is made since round 18 (`verifier.run.audit`), `__del__` swallows it
sys.setprofile(lambda *a: None)
""")


def test_hooks_and_modules_a_job_leaves_are_not_handed_to_the_next_job(chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job leaves a profile hook, an import finder, a rebound `builtins.__import__`, a
    collection callback, `numpy.maximum` rebound to return its first argument and an
    environment variable a library reads at use (inductor's caches off). Before: none
    was seen (no finding, the same worker), and the next job, an honest numpy ReLU, came out
    "incorrect" (half its elements wrong: numpy's maximum was the leaver's); the hooks ran
    candidate code in it unseen. Now the worker compares them (and every loaded module and its
    public callables, by identity) with what it held when ready: the job passes (what it left
    is not its answer), an info finding names each, its worker is replaced. (A collection
    callback left behind is a cheat: tests/verifier/test_redteam_round8.py.) Since round 18 the
    profile hook is refused as it is set (`verifier.run.audit`): none is left to name."""
    leaver, honest = chain["hooks"]
    assert leaver["outcome"] == "ok", leaver
    said = " ".join(_said(leaver, "worker_replaced"))
    for name in ("sys.meta_path", "builtins.__import__", "numpy.maximum", "os.environ"):
        assert name in said, (name, leaver["findings"])
    assert "sys.profile" not in said, leaver["findings"]
    assert honest["outcome"] == "ok" and not honest["failure"], honest
    assert honest["worker_pid"] != leaver["worker_pid"]


AUDITOR = _leaving("""
import sys
def hook(event, args, sys=sys):
    sys._audits = getattr(sys, "_audits", 0) + 1
sys.addaudithook(hook)
""")
ASK = NUMPY_RELU.replace("        import numpy as np\n", "        import sys\n        raise Runtime"
                         "Error(f'audits={getattr(sys, \"_audits\", 0)}')\n")


def test_an_audit_hook_a_job_adds_never_runs(chain: dict[str, list[dict[str, Any]]]) -> None:
    """An audit hook cannot be removed or listed: one a job adds runs at every audited event
    (imports, opens, compiles) of every later job. Before: the next two jobs of its worker
    counted 2127 and 4286 calls of it. Now the worker installs, before any job, a hook that
    refuses every later one: the later jobs (same worker) count none."""
    auditor, ask1, ask2 = chain["auditor"]
    assert auditor["outcome"] == "ok", auditor
    for p in (ask1, ask2):
        assert p["outcome"] == "runtime_error" and "audits=0" in p.get("error", ""), p
    assert auditor["worker_pid"] == ask1["worker_pid"] == ask2["worker_pid"]


# a thread the interpreter does not list: a Python callback run by libc's pthread_create (no
# `threading` record, so the "Python threads left running" check never counts it); it counts
# its wake-ups where a later job can ask
NATIVE = _leaving("""
import ctypes, sys, time
CB = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
def body(_):
    while True:
        time.sleep(0.02)
        sys._native = getattr(sys, "_native", 0) + 1
sys._native_cb = CB(body)
tid = ctypes.c_ulong()
ctypes.CDLL(None).pthread_create(ctypes.byref(tid), None, sys._native_cb, None)
""")
ASK_NATIVE = NUMPY_RELU.replace("        import numpy as np\n", "        import sys\n        raise "
                                "RuntimeError(f'native={getattr(sys, \"_native\", 0)}')\n")


def test_a_native_thread_a_job_leaves_does_not_run_in_the_next_job(chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job's model starts, as it is dropped, a thread through ctypes' `pthread_create` that
    runs Python code forever: `threading` does not list it. Before: no finding, the same
    worker, and the next two jobs counted its wake-ups (4, then 8): candidate code running in
    siblings' jobs, free to rebind a harness function after its own job's checks (framing
    the sibling whose check then sees it) or to sleep in their windows. Now the worker counts
    its threads (/proc/self/task) against when it was ready: more, its worker is replaced."""
    leaver, ask = chain["native"]
    assert leaver["outcome"] == "ok", leaver
    assert any("native threads" in m for m in _said(leaver, "worker_replaced")), leaver
    assert ask["outcome"] == "runtime_error" and "native=0" in ask.get("error", ""), ask
    assert ask["worker_pid"] != leaver["worker_pid"]


# a kernel for torch's own aten::relu on cpu, registered from Python and kept alive: every later
# job's torch.relu is the leaver's (the identity), the worker's own reference included
OVERRIDE = _leaving("""
import sys, torch
lib = torch.library.Library("aten", "IMPL")
lib.impl("relu", lambda x: x.clone(), "CPU")
sys._kept_library = lib
""")


def test_a_kernel_registered_for_torchs_op_is_not_handed_to_the_next_job(chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job registers (as its model is dropped) a Python kernel for aten::relu on cpu that
    returns its input. Before: no finding, the same worker, and every later job of the task
    there, honest numpy ReLUs, came out "incorrect" (expected -0.53, got 0: the worker's
    reference ran the leaver's relu). Now the worker compares torch.library's Python
    registrations with those it had when ready: changed, its worker is replaced.
    Open: a C++ extension's TORCH_LIBRARY_IMPL(aten, CPU) is not among them (the static rules
    see it in the source; at run time, hashing every op's `torch._C._dispatch_dump` costs
    0.16 s a job here)."""
    leaver, honest = chain["override"]
    assert leaver["outcome"] == "ok", leaver
    assert any("torch.library registrations" in m for m in _said(leaver, "worker_replaced")), \
        leaver
    assert honest["outcome"] == "ok" and not honest["failure"], honest
    assert honest["worker_pid"] != leaver["worker_pid"]


# torch's switches of which kernels run: oneDNN off (every later job's convolutions and matmuls
# on torch's slower paths), the flash attention backend off (a GPU's attention likewise)
SWITCHER = _leaving("""
import torch
torch.backends.mkldnn.enabled = False
torch.backends.cuda.enable_flash_sdp(False)
""")
ASK_SWITCH = NUMPY_RELU.replace("        import numpy as np\n", "        raise RuntimeError(f'"
                                "onednn={torch.backends.mkldnn.enabled}')\n")


def test_kernel_switches_a_job_turns_off_are_not_handed_to_the_next_job(chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job turns oneDNN and flash attention off as its model is dropped. Before: no finding,
    the same worker, and the next job ran with oneDNN off ("onednn=False": its convolutions
    slower, its speedup lowered by its sibling). Now the worker compares those switches
    (`verifier.run.tamper.SWITCHES`) with when it was ready: changed, it is replaced."""
    leaver, ask = chain["switches"]
    assert leaver["outcome"] == "ok", leaver
    said = " ".join(_said(leaver, "worker_replaced"))
    assert "mkldnn.enabled" in said and "flash_sdp_enabled" in said, leaver["findings"]
    assert ask["outcome"] == "runtime_error" and "onednn=True" in ask.get("error", ""), ask
    assert ask["worker_pid"] != leaver["worker_pid"]


# a module placed in sys.modules under the name of one a later job imports (not loaded when the
# worker was ready): that job's `import tabnanny` gets the placer's module
PLACER = _leaving("""
import sys, types
sys.modules["tabnanny"] = types.ModuleType("tabnanny")
""")
ASK_MODULE = NUMPY_RELU.replace("        import numpy as np\n", "        import tabnanny\n        raise "
                                "RuntimeError(f'file={getattr(tabnanny, \"__file__\", None)}')\n")


def test_a_module_placed_for_a_later_import_is_not_handed_to_the_next_job(chain: dict[str, list[dict[str, Any]]]) -> None:
    """A job places a module of its own in sys.modules as `tabnanny` (not imported when the
    worker was ready). Before: no finding, the same worker, and the next job's `import
    tabnanny` got it (file=None). Now a module a job added that the import system did not load
    from a file replaces the worker: the next job imports the real one.
    Open: a module built from the real one's spec (`importlib.util.module_from_spec`) and
    changed before it is placed passes as imported (the fix: drop every module a job added)."""
    placer, ask = chain["placer"]
    assert placer["outcome"] == "ok", placer
    assert any("tabnanny (not imported from a file)" in m
               for m in _said(placer, "worker_replaced")), placer["findings"]
    assert ask["outcome"] == "runtime_error" and "tabnanny.py" in ask.get("error", ""), ask
    assert ask["worker_pid"] != placer["worker_pid"]


# a file left in the worker's compile caches (inductor's, triton's: where a later job's
# torch.compile or triton kernel looks for a compiled entry to load instead of compiling)
CACHER = _leaving("""
import os
for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME"):
    os.makedirs(os.environ[var], exist_ok=True)
    with open(os.path.join(os.environ[var], "left-by-a-job"), "w") as f:
        f.write("x")
""")
ASK_CACHE = NUMPY_RELU.replace("        import numpy as np\n", "        import os\n        raise "
                               "RuntimeError('left=' + ','.join(v for v in ('TORCHINDUCTOR_CACHE_DIR"
                               "', 'TRITON_CACHE_DIR', 'XDG_CACHE_HOME') if os.path.exists("
                               "os.path.join(os.environ[v], 'left-by-a-job'))))\n")


def test_a_file_left_in_the_compile_caches_is_not_seen_by_the_next_job(
        chain: dict[str, list[dict[str, Any]]]) -> None:
    """The worker's compile caches (inductor's, triton's, XDG's) were one directory for all
    its jobs: a job could place or alter an entry there that a sibling's torch.compile or
    triton kernel then loads instead of compiling its own (a sibling compiling the same graph
    or kernel source: GRPO siblings often write near-identical code). Before: the next job saw
    every file the leaver wrote ("left=TORCHINDUCTOR_CACHE_DIR,TRITON_CACHE_DIR,
    XDG_CACHE_HOME"), the same worker. Now each job's caches are in its own directory, removed
    when it ends. (CUDA's JIT cache is fixed at the driver's start: open, the verifier's
    builds carry the GPU's own code, so it JITs nothing.)"""
    leaver, ask = chain["cacher"]
    assert leaver["outcome"] == "ok", leaver
    assert ask["outcome"] == "runtime_error" and "left=\n" not in ask.get("error", ""), ask
    assert ask.get("error", "").rstrip().endswith("left="), ask
