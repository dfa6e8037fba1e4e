"""Execution worker: correctness, anti-cheat and performance of one candidate, on any backend.

The same checks run in two lifecycles:

- **sandboxed child** (cpu, musa): `python -m verifier.worker`, forked by `verifier.forkserver`
  or spawned by `verifier.sandbox`. It reads `job.json`, `task.py` and `candidate.py` from its
  working directory and deletes the job and the task before the candidate runs (the candidate
  cannot read the reference or the result nonce from disk), writes `progress.json` after each
  stage and `result.json` at the end, and exits without running the candidate's finalizers.
- **persistent GPU worker** (cuda): `verifier.gpu_worker` keeps one process per GPU (CUDA and
  profiler start-up cost ~6 s per process) and calls `run_job` for each job, with hygiene
  checks between jobs.

Order of work: the reference is loaded and its eager (and torch.compile) baseline timed
*before* any candidate code exists in the process, so a candidate cannot slow its own baseline.
Then: seeded construction of both models (state dict copied when names match), N trials with
fresh inputs (the judge's, in an arena it maps: `verifier.trial_io`; a sandboxed child draws
them from the parent's seeds) under a dispatcher trace (aten compute = fallback), output
type/shape/dtype checks, dtype-aware tolerances with an fp64 second opinion for fp32
mismatches (compared in chunks, `verifier.device_compare`), input mutation and result caching
checks, launched-kernel names (library kernels = fallback, on GPUs), timing
with fresh inputs per call, the output re-checked after timing, and tamper checks (patched
harness functions, leftover threads). The parent decides the status, the reward and the
feedback; this code only measures.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Functions the harness relies on; a candidate that replaces any of them is tampering.
_GUARDED = (
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "time"),
    ("time", "monotonic"), ("time", "sleep"), ("torch", "allclose"), ("torch", "equal"),
    ("torch.cuda", "synchronize"), ("torch.cuda", "Event"),
    ("torch.testing", "assert_close"), ("torch.Tensor", "__eq__"), ("torch.Tensor", "clone"),
    ("torch.Tensor", "abs"), ("torch.Tensor", "double"), ("torch.Tensor", "to"),
    ("torch.nn.Module", "__call__"), ("threading", "Thread"),
)


class Finished(BaseException):  # noqa: N818 - control flow, not an error
    """Raised by `_Result.finish`; a BaseException so no `except Exception` swallows it."""


def _write(name: str, data: dict) -> None:
    tmp = Path(f".{name}.tmp")
    tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    os.replace(tmp, name)


class _Result:
    def __init__(self, nonce: str, on_progress: Callable[[str], None] | None = None):
        self.data: dict[str, Any] = {"nonce": nonce, "stage": "correctness", "outcome": "ok",
                                     "findings": [], "error": ""}
        self.on_progress = on_progress
        self.io: Any = None  # the run's trial inputs and outputs (`verifier.trial_io`)

    def progress(self, stage: str) -> None:
        self.data["stage"] = stage
        if self.on_progress:
            self.on_progress(stage)

    def finish(self, outcome: str, error: str = "") -> None:
        self.data["outcome"] = outcome
        if error:
            self.data["error"] = error[:4000]
        raise Finished

    def finding(self, rule: str, message: str, line: int | None = None,
                severity: str = "error") -> None:
        self.data["findings"].append({"rule": rule, "message": message, "line": line,
                                      "severity": severity})


def _resolve(path: str) -> Any:
    obj: Any = sys.modules.get(path.split(".")[0])
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
    return obj


def _c_function_pointer(fn: Any) -> int | None:
    """The C function behind a builtin (PyCFunctionObject.m_ml->ml_meth): C++ can swap it while
    the Python object, and so its identity, stays the same."""
    if type(fn).__name__ != "builtin_function_or_method":
        return None
    import ctypes

    ptr = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)  # after PyObject_HEAD
    method_def = ctypes.c_void_p.from_address(id(fn) + ptr).value
    if not method_def:
        return None
    return ctypes.c_void_p.from_address(method_def + ctypes.sizeof(ctypes.c_void_p)).value


def _guard_snapshot() -> dict[str, Any]:
    snap: dict[str, Any] = {}
    for owner, attr in _GUARDED:
        obj = _resolve(owner)
        if obj is not None and hasattr(obj, attr):
            fn = getattr(obj, attr)
            snap[f"{owner}.{attr}"] = fn
            meth = _c_function_pointer(fn)
            if meth is not None:
                snap[f"{owner}.{attr} (C function)"] = meth
    return snap


def _candidate_traceback(exc: BaseException) -> tuple[str, int | None]:
    """Last candidate.py frame and the exception, one line."""
    line = None
    for fr in traceback.extract_tb(exc.__traceback__):
        if fr.filename == "candidate.py":
            line = fr.lineno
    msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if line:
        msg = f"candidate.py line {line}: {msg}"
    return msg[:2000], line


from verifier.inputs import draw_inputs  # noqa: E402
from verifier.judge import (  # noqa: E402  (re-exported: tests and the parent use them)
    LOW_PRECISION_MARGIN,
    _compare,
    _flatten,
    _judge,
    against_fp64,
    round_mantissa,
)

__all__ = ["LOW_PRECISION_MARGIN", "_compare", "_judge", "against_fp64", "round_mantissa",
           "run_job"]


def _clone(xs: Any) -> Any:
    import torch

    if isinstance(xs, torch.Tensor):
        return xs.clone()
    if isinstance(xs, list | tuple):
        return type(xs)(_clone(x) for x in xs)
    return xs


def _same(a: Any, b: Any) -> bool:
    import torch

    fa, fb = _flatten(a), _flatten(b)
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def exact_fp32() -> None:
    """Reference math in true fp32: no TF32 in cuBLAS or cuDNN (torch enables it for cuDNN).

    With TF32 on, an fp32 conv reference carries ~1e-3 relative error, so an exact fp32 kernel
    fails the fp32 tolerance against it; TF32 is a precision downgrade, not the task.
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def run_job(job: dict[str, Any], task_src: str, cand_src: str,
            on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Verify one candidate in this process; the measurements as a result dict."""
    res = _Result(job["nonce"], on_progress)
    try:
        _run(res, job, task_src, cand_src)
    except Finished:  # the verdict is in res.data
        return res.data
    except BaseException as exc:  # harness bug or exotic candidate error: still report it
        return {"nonce": job.get("nonce"), "outcome": "runtime_error", "stage": "correctness",
                "findings": [], "error": f"{type(exc).__name__}: {exc}"[:2000],
                "traceback": traceback.format_exc()[-3000:]}
    finally:  # the judge's trial arena is unmapped however the run ended (a persistent
        if res.io is not None:  # worker would otherwise keep its device memory alive)
            res.io.close()
    return res.data


def _run(res: _Result, job: dict[str, Any], task_src: str, cand_src: str) -> None:
    import torch

    from verifier.backends import get_backend
    from verifier.clock import RefusedOutput
    from verifier.device_compare import judge
    from verifier.extspec import install_shim
    from verifier.fallback import judge_ops, op_kind
    from verifier.generalize import check_variants
    from verifier.namespace import candidate_globals
    from verifier.timed_calls import OpNames, baselines, serve_timed_windows
    from verifier.trial_io import for_job

    backend = get_backend(job["backend"])
    opts = job["options"]
    torch.set_num_threads(int(job.get("threads", 1)))
    exact_fp32()
    device = backend.device()
    res.data["device"] = backend.device_name()
    seed = int(opts.get("seed", 0))
    marks = res.data["phase_s"] = {}  # where the job's time went (benchmarks' profile)
    clock = [time.perf_counter()]

    def mark(phase: str) -> None:
        now = time.perf_counter()
        marks[phase] = round(marks.get(phase, 0.0) + now - clock[0], 6)
        clock[0] = now

    ref_ns: dict[str, Any] = {"__name__": "ks_reference"}
    try:
        exec(compile(task_src, "reference.py", "exec"), ref_ns)
        Model, get_inputs = ref_ns["Model"], ref_ns["get_inputs"]
        init_inputs = ref_ns["get_init_inputs"]()
        torch.manual_seed(seed)
        ref = Model(*init_inputs).to(device).eval()
    except Exception as exc:  # a broken task is the task's fault; say so
        res.finish("task_error", f"reference failed to load: {type(exc).__name__}: {exc}")

    input_seed = int(job.get("input_seed", seed))  # fresh per run, chosen by the parent

    def make_inputs(k: int) -> list[Any]:
        return draw_inputs(get_inputs, input_seed + k, device)

    mark("reference_load")
    if job.get("baseline_only"):  # a process that never runs candidate code times the reference
        baselines(res, job, backend, ref, make_inputs)
        mark("baseline")
        res.finish("baseline")

    guard = _guard_snapshot()  # before the extensions load: their static initializers run then
    install_shim(job["extensions"])
    threads_before = threading.active_count()
    # threads the harness itself started (torch.compile's helpers): not the candidate's
    res.data["harness_threads"] = threads_before

    res.progress("correctness")
    cand = types.ModuleType("candidate")
    cand.__file__ = "candidate.py"
    try:
        cand.__dict__.update(candidate_globals(ref_ns, str(opts.get("namespace", "isolated"))))
        exec(compile(cand_src, "candidate.py", "exec"), cand.__dict__)
        model_new_cls = cand.__dict__["ModelNew"]
        torch.manual_seed(seed)
        new = model_new_cls(*init_inputs).to(device).eval()
    except Exception as exc:
        msg, line = _candidate_traceback(exc)
        res.data["error_line"] = line
        res.finish("runtime_error", msg)
    mark("candidate_load")
    ref_sd, new_sd = ref.state_dict(), new.state_dict()
    if ref_sd and list(ref_sd) == list(new_sd) and all(
            ref_sd[k].shape == new_sd[k].shape for k in ref_sd):
        new.load_state_dict(ref_sd)

    tol = (float(opts.get("atol_fp32", 1e-4)), float(opts.get("rtol_fp32", 1e-4)),
           float(opts.get("atol_low", 1e-2)), float(opts.get("rtol_low", 1e-2)))
    io = res.io = for_job(job, device)  # the judge's arena of trial inputs and slots, or seeds
    names = OpNames(label=True)
    trial_names = names.__enter__()  # the trials' own aten ops, recorded as timed calls are
    try:
        first_inputs, first_ref, ops, own_calls = _trials(
            res, ref, new, io, make_inputs, backend, tol, max(1, int(opts.get("trials", 5))))
    finally:  # a run that ends in a trial must not leave the session open
        names.__exit__(None, None, None)
    res.data.setdefault("mismatch_frac", 0.0)
    policy = str(opts.get("fallback", "strict"))
    found, cheat = judge_ops(ops, policy, own_calls)
    res.data["findings"].extend(found)
    res.data["own_calls"] = own_calls
    if cheat:
        res.finish("cheat", cheat)
    _check_tamper(res, guard, threads_before)
    res.data["ops"] = list(dict.fromkeys(op for op, _ in ops))[:50]
    mark("correctness")
    # on the judge's arena, trial 1's own inputs (the judge checks them after the run: a
    # mutation here is seen there); a GB-sized task holds no second copy of them
    again_inputs = (lambda: first_inputs) if io.shared else (lambda: _clone(first_inputs))
    _check_kernels(res, backend, job, lambda: new(*again_inputs()))
    mark("kernel_profile")
    check_variants(res, job, task_src, cand.__dict__, backend, tol, io)
    mark("variants")

    res.progress("performance")
    try:
        with torch.no_grad():
            again = new(*again_inputs()) if first_ref is not None else None
            backend.synchronize()
            window_ops = serve_timed_windows(job, new, backend)
    except RefusedOutput as exc:  # work deferred to the one output the judge checks
        res.finding("timed_output_type", str(exc))
        res.finish("cheat", f"during timing: {exc}")
    except Exception as exc:
        msg, line = _candidate_traceback(exc)
        res.finish("runtime_error", f"during timing: {msg}")
    res.data["timed_ops"] = sorted(window_ops)[:50]
    unseen = sorted(op for op in window_ops - trial_names if op_kind(op) == "compute")
    if unseen:  # behaviour that changes when the trials are over: a fallback it hid from them
        res.finding("timed_fallback", f"the timed calls ran {', '.join(unseen[:3])}, which "
                    "the traced trials did not")
        res.finish("cheat", "the timed calls ran library compute the trials did not: "
                   + ", ".join(unseen[:3]))
    if first_ref is not None:  # (the judge's arena: its windows checked the timed outputs)
        verdict, msg, _, _ = judge(ref, first_inputs, first_ref, again, tol)
        if verdict != "ok":
            res.finding("changed_after_timing", msg)
            res.finish("cheat", f"outputs changed after the timing runs: {msg}")
    del again
    _check_tamper(res, guard, threads_before)
    res.data.update(io.report())  # raw outputs (seeded) or the plain values beside the slots
    mark("performance")
    res.progress("done")
    res.finish("ok")


def _trials(res: _Result, ref: Any, new: Any, io: Any, make_inputs: Callable[[int], list[Any]],
            backend: Any, tol: tuple[float, float, float, float], trials: int
            ) -> tuple[Any, Any, list[tuple[str, int | None]], int]:
    """The correctness trials, each on fresh inputs (the judge's arena views, else drawn from
    the parent's seeds) under the dispatcher trace: (first inputs, first reference output, the
    aten ops with their candidate lines, calls into the candidate's extension)."""
    import torch
    from torch.autograd.profiler import record_function

    from verifier.device_compare import judge
    from verifier.fallback import make_trace_mode
    from verifier.timed_calls import LABEL

    if io.shared:  # as many trials as the judge's arena holds (`verifier.admission`)
        return _judged_trials(res, new, io, backend)
    first_inputs = first_ref = prev_ref = prev_new = None
    ops: list[tuple[str, int | None]] = []  # (aten op, candidate line) of every forward
    own_calls = 0  # calls into the candidate's extension functions during forward
    worst: dict[str, float] = {}
    for t in range(trials):
        inputs = io.inputs(0, t) or make_inputs(1000 + t)
        pristine = _clone(inputs)
        try:
            with torch.no_grad():
                ref_out = ref(*_clone(inputs))
                with make_trace_mode() as tr, record_function(LABEL):  # traced
                    new_out = new(*inputs)  # the judge's views: a mutation is seen there
                    backend.synchronize()
                ops.extend(tr.ops)
                own_calls += tr.own_calls
        except Exception as exc:
            _trial_crashed(res, exc, t)
        if prev_new is not None and _same(new_out, prev_new) and not _same(ref_out, prev_ref):
            res.data["trials"] = t + 1
            res.finding("result_caching", "the same output for different inputs")
            res.finish("cheat", "the output did not change with new inputs (cached result)")
        verdict, msg, stats, by_fp64 = judge(ref, pristine, ref_out, new_out, tol)  # in chunks
        if by_fp64:
            res.data["tolerance"] = "fp64_reference"
        for k, v in stats.items():
            worst[k] = max(worst.get(k, 0.0), v)
        res.data.update(worst)
        res.data["trials"] = t + 1
        if verdict == "cheat":
            res.finding("output_type", msg)
        if verdict != "ok":
            res.finish("cheat" if verdict == "cheat" else "incorrect", f"trial {t + 1}: {msg}")
        if not _same(inputs, pristine):
            res.finding("input_mutation", "forward modified its input tensors in place")
            res.finish("incorrect", "forward modified its input tensors (the reference does not)")
        prev_ref, prev_new = ref_out, new_out
        io.keep(0, t, new_out)  # into the judge's slot, or kept for the parent's comparison
        if t == 0:
            first_inputs, first_ref = pristine, ref_out
    return first_inputs, first_ref, ops, own_calls


def _trial_crashed(res: _Result, exc: Exception, t: int) -> None:
    """End the run: trial `t + 1` raised `exc` (the candidate's line, if any, recorded)."""
    msg, line = _candidate_traceback(exc)
    res.data["error_line"] = line
    res.data["trials"] = t
    res.finish("runtime_error", msg)


def _judged_trials(res: _Result, new: Any, io: Any, backend: Any
                   ) -> tuple[Any, None, list[tuple[str, int | None]], int]:
    """The trials when the judge owns them (its arena's inputs and slots): each forward under
    the dispatcher trace, its output into its slot; no reference, pristine copy or comparison
    here (the judge compares, checks the inputs against its own pristine copies and sees a
    repeated output as a wrong one), so the worker holds one output at a time: a GB-sized task
    fits beside the judge. (first inputs: trial 1's views, ops, extension calls)."""
    import torch
    from torch.autograd.profiler import record_function

    from verifier.fallback import make_trace_mode
    from verifier.timed_calls import LABEL

    ops: list[tuple[str, int | None]] = []
    own_calls = 0
    for t in range(io.trials()):
        try:
            with torch.no_grad(), make_trace_mode() as tr, record_function(LABEL):
                new_out = new(*io.inputs(0, t))
                backend.synchronize()
            ops.extend(tr.ops)
            own_calls += tr.own_calls
        except Exception as exc:
            _trial_crashed(res, exc, t)
        io.keep(0, t, new_out)
        res.data["trials"] = t + 1
        del new_out
    return io.inputs(0, 0), None, ops, own_calls


def _check_kernels(res: _Result, backend: Any, job: dict[str, Any],
                   call: Callable[[], Any]) -> None:
    """Kernels one forward launches (verifier.fallback.judge_kernels): library kernels are a
    fallback under the strict policy; the own-kernel device-time share goes in the result."""
    from verifier.fallback import judge_kernels

    try:
        names, findings, share, cheat = judge_kernels(
            backend, job.get("device_sources", []), call,
            str(job["options"].get("fallback", "strict")))
    except Exception as exc:  # profiling is best effort; say why it failed
        res.data["kernel_names_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return
    res.data["kernel_names"] = names[:50]
    res.data["own_share"] = share
    res.data["findings"].extend(findings)
    if cheat:
        res.finish("cheat", cheat)


def _check_tamper(res: _Result, guard: dict[str, Any], threads_before: int) -> None:
    now = _guard_snapshot()
    changed = [name for name, obj in guard.items()
               if (now.get(name) != obj if isinstance(obj, int) else now.get(name) is not obj)]
    if changed:
        for name in changed:
            res.finding("patched_function", f"{name} was replaced by the candidate")
        res.finish("cheat", f"the candidate replaced {', '.join(changed)}")
    if threading.active_count() > threads_before:
        res.finding("extra_thread", "the candidate started Python threads")
        res.finish("cheat", "the candidate started threads that outlive forward")


def main() -> None:
    """Sandboxed child: one job from the working directory, result.json, then exit."""
    job = json.loads(Path("job.json").read_text(encoding="utf-8"))
    task_src = Path("task.py").read_text(encoding="utf-8")
    cand_src = Path("candidate.py").read_text(encoding="utf-8")
    os.unlink("job.json")
    os.unlink("task.py")
    data = run_job(job, task_src, cand_src,
                   on_progress=lambda stage: _write("progress.json", {"stage": stage}))
    raw = data.pop("raw_outputs", None)
    if raw is not None:  # raw outputs for the parent, which compares them itself
        import torch

        torch.save(raw, "outputs.pt")
    _write("result.json", data)
    sys.stdout.flush()
    os._exit(0)  # skip atexit/finalizers the candidate may have registered


if __name__ == "__main__":
    main()
