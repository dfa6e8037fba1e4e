"""Persistent GPU execution worker: one process per GPU runs candidates one after another.

A fresh process per candidate costs ~8 s on an H100 node (import torch 3 s, CUDA context 0.4 s,
the profiler's first session 4-6 s: measured by benchmarks/gpu_diag.py) and a CUDA
context cannot be forked, so the verifier keeps one warm worker per GPU, pinned with
CUDA_VISIBLE_DEVICES. The checks are `verifier.run.worker.run_job`'s, the same as on the CPU.

Started by `verifier.api` as `python -m verifier.run.gpu_worker RESULT_FD [BACKEND]` (default
cuda; the tests run the same loop with `cpu`, which no GPU host needs) inside the sandbox's
session, pids cgroup and network namespace. Reads one JSON job per stdin line ({"job",
"task_source", "candidate_source"}); writes {"started": nonce}, {"progress": stage} lines and
then one result per job to RESULT_FD, a unix socket only this process holds (the candidate's prints go to
stdout/stderr, never into results). Nothing the worker says is believed: each job's trial
inputs and outputs live in the judge's arena on the device (`verifier.judge.trial_judge`), whose
descriptor, with the timed windows' arena's, the parent passes over that socket (SCM_RIGHTS)
before the job; the result line carries only the outputs' plain values (`trial_report`). Jobs
run in directories of the private tmpfs (KS_WORKER_TMP); a job that leaves less than
KS_JOB_DISK_MB free there ends the worker after its result. Between jobs it checks that the process is still fit to judge the next
candidate: no CUDA error left in the context, no replaced torch/time functions (a wide snapshot
of their attributes), no changed global torch state, no leftover threads. A job that leaves any
of these behind is a `cheat` (tampering) or a `runtime_error` (sticky CUDA error), and the
worker exits after reporting it, so the parent starts a clean one for the next candidate. The
same checks run again once the parent has checked the trials and the job's garbage is collected
(`_settle`, `verifier.run.settle`): what its finalizers do is charged to it, not to the next.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from verifier.run.allocator import pin as pin_allocator
from verifier.run.device_state import device_ident, sticky_cuda_error
from verifier.run.disarm import note_frozen
from verifier.run.pins import Pins, moved, pin
from verifier.run.seal import figures
from verifier.run.settle import (
    armed_finalizers,
    free_bytes,
    gc_callbacks,
    held_memory,
    leftover_code,
    memory_ends_it,
    strays_end_it,
)
from verifier.run.tamper import process_state, refuse_audit_hooks, residue_ends_it

# Modules whose public attributes a candidate must leave alone (compared by identity per job).
_WATCHED = ("torch", "torch.nn.functional", "torch.Tensor", "torch.cuda", "torch.nn.Module",
            "torch.testing", "time", "threading", "verifier.run.worker", "verifier.backends.gpu_timing",
            "verifier.backends.gpu_anticheat", "verifier.checks.extspec")

_WARMUP_TASK = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2
get_inputs = lambda: [torch.randn(256)]
get_init_inputs = lambda: []
"""
_WARMUP_CANDIDATE = _WARMUP_TASK.replace("class Model(", "class ModelNew(")


def watched_state() -> dict[str, int]:
    """Identity of every public function/class of the watched modules (and `__call__`/`__eq__`;
    of the harness's modules every global); data attributes are left out, torch updates some."""
    from verifier.run.tamper import harness_modules, identity, resolve

    state = {}
    # every harness module loaded, not only the named ones, and its classes' methods: a job that
    # rebinds a function the harness looks up at call time (`verifier.checks.fallback.judge_ops`,
    # `JobResult.finish`) frames every later job of the worker (tests/verifier/test_redteam_round9)
    for owner in _WATCHED + harness_modules():  # `__main__` too: the worker's own loop
        obj, harness = sys.modules.get(owner) or resolve(owner), owner.startswith(("verifier.",
                                                                                  "__main__"))
        if obj is None:
            continue
        for name in dir(obj):
            if name.startswith("_") and name not in ("__call__", "__eq__") and not harness:
                continue
            try:
                value = getattr(obj, name)
            except Exception:  # properties that raise: not something a candidate can swap
                continue
            if callable(value) or harness:  # (the harness never rebinds its module globals)
                state[f"{owner}.{name}"] = identity(value)
            if isinstance(value, type) and value.__module__ == owner:  # its own class: methods
                state.update((f"{owner}.{name}.{k}", identity(v)) for k, v in vars(value).items()
                             if callable(v) or isinstance(v, staticmethod | classmethod | property))
    return state


def global_flags() -> dict[str, Any]:
    """Process-wide torch settings that change what a reference computes."""
    import torch

    return {"default_dtype": str(torch.get_default_dtype()),
            "grad_enabled": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cudnn_enabled": torch.backends.cudnn.enabled,
            "num_threads": torch.get_num_threads(),
            # a handler or timer left behind runs candidate code after its run, e.g. between
            # the job's end and the judge's check of its slots
            "signal_handlers": signal_handlers(),
            "timers": tuple(signal.getitimer(t) != (0.0, 0.0) for t in (
                signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)),
            # a torch-function or dispatch mode left on its stack runs in every later job's
            # torch calls, the harness's own included (its copies, its comparisons): a job ran
            # after one that left `out + 1` there failed (tests/verifier/test_redteam_round7.py)
            "function_modes": torch._C._len_torch_function_stack(),
            "dispatch_modes": torch._C._len_torch_dispatch_stack(),
            # called at every collection, a later job's included (`verifier.run.settle`)
            "gc_callbacks": gc_callbacks(),
            **carried_defaults()}


# settings a job may change for itself (a model's torch.set_default_device in __init__, which
# a host build keeps for forward, `verifier.judge.construct`; a kernel's TF32 switch) but must
# not hand to the next job: the worker is replaced after it, the job is not a cheat for it
CARRIED = ("default_device", "matmul_precision", "cuda_matmul_tf32", "cudnn_tf32",
           "cudnn_benchmark", "fp16_reduction")


def carried_defaults() -> dict[str, Any]:
    """The process's torch defaults that change what a later job computes or how fast."""
    import torch

    matmul = torch.backends.cuda.matmul
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)  # set_default_device's
    return dict(zip(CARRIED, ("none" if context is None else str(context.device),
                              torch.get_float32_matmul_precision(), matmul.allow_tf32,
                              torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
                              matmul.allow_fp16_reduced_precision_reduction), strict=True))


def signal_handlers() -> tuple[tuple[int, int], ...]:
    """(signal, identity of its Python-level handler) for every signal that has one."""
    out = []
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):  # signals Python cannot ask about
            continue
        out.append((int(sig), id(handler)))
    return tuple(out)


def after_job(result: dict[str, Any], state: dict[str, int], flags: dict[str, Any],
              threads: int) -> bool:
    """Hygiene after a job; updates `result` and returns True when the worker must exit."""
    import torch

    sticky = sticky_cuda_error() if torch.cuda.is_initialized() else None
    if sticky:
        result["sticky_cuda_error"] = sticky
        if result.get("outcome") == "ok":  # it passed, then broke the context on the way out
            result.update(outcome="runtime_error",
                          error=f"the CUDA context was broken after the run: {sticky}")
        return True
    changed = [k for k, v in watched_state().items() if state.get(k, v) != v]
    now = global_flags()
    carried = [k for k in CARRIED if now[k] != flags[k]]
    if "default_device" in carried:  # torch.set_default_device pushes its mode: its own
        now["function_modes"] -= 1
    changed += [f"torch global state {k}" for k in flags
                if k not in CARRIED and now[k] != flags[k]]
    if threading.active_count() > max(threads, int(result.get("harness_threads") or 0)):
        changed.append("Python threads left running")
    if changed:
        for name in changed[:10]:
            result["findings"].append({"rule": "patched_function", "severity": "error",
                                       "line": None, "message": f"{name} changed during the run"})
        result.update(outcome="cheat", error="the candidate changed the harness's process: "
                      + ", ".join(changed[:5]))
        return True
    if carried:  # the next job gets a process with torch's defaults as they were
        result["findings"].append({"rule": "worker_replaced", "severity": "info", "line": None,
                                   "message": "the run changed torch's process defaults ("
                                   + ", ".join(carried) + "): its worker was replaced"})
        return True
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return False


def _warm_up(backend_name: str, marks: dict[str, float]) -> Any:
    """The backend, warmed: the profiler's first session and torch's first-use rebinding paid
    before the first candidate (so only candidates change what the snapshot holds); `marks`:
    when each step ended (CLOCK_MONOTONIC, host-wide: `benchmarks/worker_start.py`)."""
    import torch

    from verifier.backends import get_backend
    from verifier.run.harness_imports import load_lazy_imports
    from verifier.run.worker import run_job

    backend = get_backend(backend_name)
    marks["torch"] = time.monotonic()
    if backend_name == "cuda":
        torch.cuda.init()
    marks["device"] = time.monotonic()
    # the profiler's first session costs seconds: pay it before the first candidate
    backend.kernel_names(lambda: torch.ones(4, device=backend.device()).add_(1))
    marks["profiler"] = time.monotonic()
    if backend_name != "cpu":  # the math libraries' first use maps them (host memory that
        x = torch.ones(1, 1, 8, 8, device=backend.device())  # stays): before `ready` is taken
        torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3, device=x.device)).sum().item()
        (x[0, 0] @ x[0, 0]).sum().item()
    backend.synchronize()
    marks["libraries"] = time.monotonic()
    # torch rebinds some of its functions on first use (importing torch._dynamo wraps
    # torch.manual_seed): one harness run before the snapshot, so only candidates change it
    run_job({"nonce": "warm-up", "backend": backend_name, "extensions": {},
             "options": {"trials": 1, "perf_trials": 2, "perf_max_trials": 2, "perf_warmup": 1}},
            _WARMUP_TASK, _WARMUP_CANDIDATE)
    load_lazy_imports()  # the harness's modules a job imports at first use: in the snapshot
    marks["harness"] = time.monotonic()
    return backend


JOB_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME")  # read at use


def _run_one(msg: dict[str, Any], sock: socket.socket, base: str,
             progress: Callable[[str], None], step: Callable[[str], None],
             measure: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One job in a fresh folder under `base`, with the judge's arenas it was sent (their
    descriptors closed when it ends)."""
    from verifier.run.worker import run_job

    job = msg["job"]
    # sent before the job, in the order its "fds" names: the judge's arenas of the timed
    # windows (`verifier.judge.arena`) and of the trials (`verifier.judge.trial_io`)
    _, fds, _, _ = socket.recv_fds(sock, 1, 2)
    named = dict(zip(job.get("fds") or (), fds, strict=False))
    arena_fd, trials_fd = named.get("arena", -1), named.get("trials", -1)
    if arena_fd >= 0:
        job["arena_fd"] = arena_fd
    if trials_fd >= 0:
        job["trials_fd"] = trials_fd
    jobdir = tempfile.mkdtemp(prefix="job-", dir=base)  # nothing left for the next job
    os.chdir(jobdir)
    # the compile caches too: one directory for all jobs let a job place an entry a sibling's
    # torch.compile or triton kernel would load (tests/verifier/test_redteam_round9.py)
    kept = {var: os.environ.get(var) for var in JOB_CACHES}
    os.environ.update({var: os.path.join(jobdir, ".cache", var.lower()) for var in JOB_CACHES})
    # the job's `load_inline` shim goes with it: what hangs on it died in the next job's
    # `install_shim` (a `__del__` there framed an honest sibling: test_redteam_round10)
    ext = sys.modules["torch.utils.cpp_extension"]  # loaded by the warm-up
    shims = ext.load_inline, ext.load
    try:
        return run_job(job, msg["task_source"], msg["candidate_source"], progress, step,
                       measure)
    finally:
        ext.load_inline, ext.load = shims
        for var, v in kept.items():  # as when ready (a change elsewhere: `process_state`)
            if v is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = v
        os.chdir(base)
        shutil.rmtree(jobdir, ignore_errors=True)
        for fd in (arena_fd, trials_fd):  # mapped while the job ran; unmapped by then
            if fd >= 0:
                os.close(fd)


class ReadyState(NamedTuple):
    """The worker as it was when ready: what each job's hygiene checks compare with. Immutable,
    held in the loop's locals: a job that refreshed its dicts after leaving residue kept its
    worker, a later honest ReLU incorrect (tests/verifier/test_redteam_round17b.py)."""

    state: tuple[tuple[str, int], ...]  # `watched_state`: the harness's and torch's functions
    flags: tuple[tuple[str, Any], ...]  # `global_flags`: torch's settings, hooks, modes
    threads: int  # Python threads (torch.compile's own raise it: a result's `harness_threads`)
    memory: tuple[int, int]  # `held_memory`: host resident and device allocated bytes
    armed: tuple[tuple[Any, str], ...]  # `armed_finalizers`: the harness's `weakref.finalize`s
    residue: tuple[tuple[str, int], ...]  # `process_state`: hooks, modules, environment


def _hygiene(result: dict[str, Any], ready: ReadyState, settling: bool = True) -> bool:
    """What a job left in the process, compared with `ready`: findings and outcome into
    `result`; True when the worker must go. Right after the job (not `settling`): the harness
    (a patch a finalizer undoes at the settle is caught here) and its processes; at its settle,
    its garbage collected, those again and what later jobs would meet (memory held, residue)."""
    leave = after_job(result, dict(ready.state), dict(ready.flags), ready.threads)
    leave = strays_end_it(result) or leave
    return leave or settling and (memory_ends_it(result, ready.memory, None)
                                  or residue_ends_it(result, dict(ready.residue)))


def _settle(held: list[Any], ready: ReadyState, mark: list[Any], pins: Pins = ((), (), (), ()),
            check: Callable[..., Any] = moved) -> tuple[dict[str, Any], list[Any]]:
    """Between jobs, once the parent has checked the last job's trials: what that job left is
    let go and its garbage collected (its finalizers run now, charged to it), then the checks
    run again (`verifier.run.settle`); the report for that job, as a result's fields (with what
    `ready` and `mark` were: the parent holds them, `verifier.run.seal`), and the next mark.
    `pins` (`check`: `verifier.run.pins.moved`) checked after each step where the job's code
    runs (its `__del__`s here, its finalizers in `leftover_code`) and after the checks."""
    held.clear()
    report: dict[str, Any] = {"settled": True, "outcome": "ok", "findings": []}
    gone, forged = check(pins, report)  # (a harness name moved: a cheat, no check called)
    left = [] if forged else leftover_code(dict(ready.armed), mark, (ready, *ready))
    if not gone:
        gone, forged = check(pins, report)
    leave = True if forged else _hygiene(report, ready)
    if not gone:
        gone, forged = check(pins, report)
    if forged:  # (the parent, missing the figures, ends the worker)
        report["worker_leaves"] = True
        return report, mark
    leave = leave or gone != []
    if report["outcome"] != "ok":
        report["error"] += " (found after the run, once its garbage was collected)"
    if left:
        report["findings"].append({"rule": "worker_replaced", "severity": "warning",
                                   "line": None, "message": "the run left code to run in later "
                                   "jobs: " + "; ".join(left) + ": its worker was replaced"})
    report["worker_leaves"] = leave = leave or bool(left)
    fresh = mark if leave else note_frozen()  # what lives on: no later collection's work (each
    report.update(figures(ready, mark, fresh))  # scans its job's only; the next settle's mark)
    pin_allocator()  # glibc's settings as at ready, whatever the job left (`allocator`)
    return report, fresh


def main(argv: list[str]) -> int:
    """Serve jobs from stdin until EOF; results go to the fd named in argv[0]."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand (hang reports)
    out = os.fdopen(int(argv[0]), "w", buffering=1)
    os.set_inheritable(out.fileno(), False)
    sock = socket.socket(fileno=os.dup(out.fileno()))
    refuse_audit_hooks()  # before any job: a hook added by one would run in all later ones
    pin_allocator()  # and again at every settle: no job's `mallopt` reaches the next
    marks = {"imported": time.monotonic()}  # the start's steps, before any candidate ran
    backend = _warm_up(argv[1] if len(argv) > 1 else "cuda", marks)
    state, flags, threads = watched_state(), global_flags(), threading.active_count()
    residue = process_state()
    ident = device_ident(backend)
    gc.collect()
    gc.freeze()  # the harness's objects: no collection between or in jobs scans them again
    mark = note_frozen(freeze=False)  # held here only: a job rewrote one in `disarm`'s data
    ready = ReadyState(state=tuple(state.items()), flags=tuple(flags.items()), threads=threads,
                       memory=held_memory(), armed=tuple(armed_finalizers().items()),
                       residue=tuple(residue.items()))
    pins, check = pin(), moved  # the checks' own names (`verifier.run.pins`): locals, as `ready`
    marks["snapshot"] = time.monotonic()
    out.write(json.dumps({"ready": True, "pid": os.getpid(), "device": backend.device_name(),
                          "worker_device": ident, "marks": marks, **figures(ready, mark)}) + "\n")

    def progress(stage: str) -> None:
        out.write(json.dumps({"progress": stage}) + "\n")

    def step(name: str) -> None:  # the parent's hang deadlines (`verifier.run.hang_watch`)
        out.write(json.dumps({"step": name}) + "\n")

    def measure(fields: dict[str, Any]) -> None:  # the parent's copy (`outcome.Measured`)
        out.write(json.dumps({"measured": fields}, default=str) + "\n")

    # jobs and caches in the private tmpfs (the worker's own directory is read-only to it)
    base = os.environ.get("KS_WORKER_TMP") or os.getcwd()
    os.makedirs(base, exist_ok=True)
    job_free = int(os.environ.get("KS_JOB_DISK_MB", "0")) << 20
    held: list[Any] = []  # the last job's result, alive until the next job comes
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("settle"):  # the parent judged the last job's trials
            report, mark = _settle(held, ready, mark, pins, check)
            out.write(json.dumps(report, default=str) + "\n")
            if report["worker_leaves"] or check(pins)[0]:
                return 3
            continue
        # the parent takes no line of this job before this one (`verifier.run.outcome`)
        out.write(json.dumps({"started": msg["job"].get("nonce")}) + "\n")
        gc.enable()
        held.clear()
        result = _run_one(msg, sock, base, progress, step, measure)
        # no cyclic garbage collected (finalizers are candidate code) from the job's end until
        # the judge has checked its trials' slots: then the parent asks the worker to settle
        # (`_settle`), and collection resumes when the next job arrives
        gc.disable()
        held[:] = [result, result.pop("raw_outputs", None)]  # seeded trials: not sent, not used
        sys.stdout.flush()
        sys.stderr.flush()
        gone, forged = check(pins, result)  # (then no name is looked up: any may be the job's)
        if gone and not forged:  # a builtin or a library's function: named with all else it
            _hygiene(result, ready)  # left (residue), and the worker goes
        leave = True if gone else _hygiene(result, ready, settling=False)
        if not gone and check(pins, result)[0]:  # (moved inside the checks, or by them)
            leave = True
        # torch.compile's own threads
        ready = ready._replace(threads=max(ready.threads,
                                           int(result.get("harness_threads") or 0)))
        if job_free and free_bytes(base) < job_free:  # the next job gets a fresh tmpfs
            leave = True
        result["worker_pid"], result["worker_device"] = os.getpid(), ident
        result["worker_leaves"] = leave  # the parent stops it: no next job races its exit
        out.write(json.dumps(result, default=str) + "\n")
        out.flush()
        if leave:
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
