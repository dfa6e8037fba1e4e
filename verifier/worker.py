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
fresh seeded inputs under a dispatcher trace (aten compute = fallback), output type/shape/dtype
checks, dtype-aware tolerances with an fp64 second opinion for fp32 mismatches, input mutation
and result caching checks, launched-kernel names (library kernels = fallback, on GPUs), timing
with fresh inputs per call, the output re-checked after timing, and tamper checks (patched
harness functions, leftover threads). The parent decides the status, the reward and the
feedback; this code only measures.
"""

from __future__ import annotations

import copy
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


def _guard_snapshot() -> dict[str, Any]:
    snap = {}
    for owner, attr in _GUARDED:
        obj = _resolve(owner)
        if obj is not None and hasattr(obj, attr):
            snap[f"{owner}.{attr}"] = getattr(obj, attr)
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


def _flatten(out: Any) -> list[Any]:
    if isinstance(out, tuple | list):
        return list(out)
    return [out]


def _compare(ref: Any, new: Any, atol: float, rtol: float, atol_low: float, rtol_low: float
             ) -> tuple[str, str, dict[str, float]]:
    """(verdict, message, stats): verdict ok | incorrect | cheat | values (numbers differ)."""
    import torch

    refs, news = _flatten(ref), _flatten(new)
    if type(new) is not type(ref) and not (isinstance(ref, tuple | list)
                                           and isinstance(new, tuple | list)):
        if isinstance(new, torch.Tensor) and type(new) is not torch.Tensor:
            return "cheat", f"output is a {type(new).__name__}, not a plain torch.Tensor", {}
        return "incorrect", f"output type {type(new).__name__}, expected {type(ref).__name__}", {}
    if len(refs) != len(news):
        return "incorrect", f"{len(news)} outputs, expected {len(refs)}", {}
    stats = {"max_abs_diff": 0.0, "mean_abs_diff": 0.0, "mismatch_frac": 0.0}
    total = 0
    for i, (r, n) in enumerate(zip(refs, news, strict=True)):
        if not isinstance(r, torch.Tensor):
            if r != n:
                return "incorrect", f"output {i}: {n!r} != {r!r}", stats
            continue
        if type(n) is not torch.Tensor:
            kind = "cheat" if isinstance(n, torch.Tensor) else "incorrect"
            return kind, f"output {i} is a {type(n).__name__}, not a plain torch.Tensor", stats
        if n.shape != r.shape:
            return "incorrect", f"output {i} shape {list(n.shape)}, expected {list(r.shape)}", stats
        if n.dtype != r.dtype:
            return "incorrect", f"output {i} dtype {n.dtype}, expected {r.dtype}", stats
        if n.device != r.device:
            return "incorrect", f"output {i} on {n.device}, expected {r.device}", stats
        if r.numel() == 0:
            continue
        low = r.dtype in (torch.float16, torch.bfloat16)
        a, rt = (atol_low, rtol_low) if low else (atol, rtol)
        if not r.is_floating_point() and not r.is_complex():
            a = rt = 0.0
        rd, nd = r.detach().double(), n.detach().double()
        diff = (nd - rd).abs()
        both_nan = rd.isnan() & nd.isnan()
        same_inf = rd.isinf() & (nd == rd)
        bad = ~(both_nan | same_inf) & ~(diff <= a + rt * rd.abs())
        finite = torch.isfinite(diff)
        if bool(finite.any()):
            stats["max_abs_diff"] = max(stats["max_abs_diff"], float(diff[finite].max()))
            stats["mean_abs_diff"] += float(diff[finite].sum())
        total += r.numel()
        nbad = int(bad.sum())
        if nbad:
            stats["mismatch_frac"] += nbad
            idx = tuple(int(x) for x in bad.nonzero()[0])
            msg = (f"output {i}: {nbad} of {r.numel()} elements differ beyond atol={a:g} "
                   f"rtol={rt:g}; first at index {list(idx)}: got {float(nd[idx]):.6g}, "
                   f"expected {float(rd[idx]):.6g}")
            stats["mean_abs_diff"] /= total
            stats["mismatch_frac"] /= total
            return "values", msg, stats
    if total:
        stats["mean_abs_diff"] /= total
        stats["mismatch_frac"] /= total
    return "ok", "", stats


# An fp32 result that misses the tolerance is still accepted when it is at least this many
# times more accurate (against fp64) than the task's outputs computed from inputs rounded to a
# 10-bit mantissa, the precision of fp16 and TF32. Measured (CPU, fp64 references): a
# sequential fp32 cumsum over 16k elements and a K-chunked matmul are 60x and >1000x more
# accurate than that yardstick; fp16/TF32 inputs or arithmetic are at about 1x and bf16 worse.
LOW_PRECISION_MARGIN = 8.0


def round_mantissa(x: Any, bits: int = 10) -> Any:
    """fp32 `x` rounded to nearest with `bits` mantissa bits (fp16/TF32 precision, fp32 range)."""
    import torch

    drop = 23 - bits
    i = x.contiguous().view(torch.int32)
    q = ((i + (1 << (drop - 1))) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), q, x)


def against_fp64(model: Any, inputs: list[Any], ref: Any, out: Any, atol: float
                 ) -> dict[str, Any] | None:
    """Second opinion on an fp32 mismatch, calibrated per task: is `out` fp32-accurate?

    Long reductions (a matmul with K = 8192, long scans) differ from torch by more than 1e-4 in
    any other summation order, and torch's own error differs between devices (its CPU cumsum
    accumulates in double), so neither the tolerance nor torch's error is the yardstick. The
    task's sensitivity is: fp64 outputs from inputs rounded to a 10-bit mantissa against fp64
    outputs from the inputs. `ok` when the candidate's max and mean errors against fp64 are both
    LOW_PRECISION_MARGIN times smaller than that (or within atol). None when no fp64 reference
    can be made (no fp64 kernel for some op) or the output is not one fp32 tensor.
    """
    import torch

    if not (type(ref) is torch.Tensor and ref.dtype == torch.float32
            and type(out) is torch.Tensor and out.shape == ref.shape):
        return None
    floats = [isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in inputs]
    try:
        model64 = copy.deepcopy(model).double()
        with torch.no_grad():
            exact = model64(*[x.double() if f else x for x, f in zip(inputs, floats, strict=True)])
            coarse = model64(*[round_mantissa(x).double() if f else x
                               for x, f in zip(inputs, floats, strict=True)])
    except Exception:  # some op has no fp64 kernel: the fp32 verdict stands
        return None
    if type(exact) is not torch.Tensor or exact.shape != ref.shape:
        return None
    err_new = (out.double() - exact).abs().nan_to_num(1e30)
    err_low = (coarse.double() - exact).abs().nan_to_num(0.0)
    err_ref = (ref.double() - exact).abs().nan_to_num(1e30)
    k = LOW_PRECISION_MARGIN
    new_max, low_max = float(err_new.max()), float(err_low.max())
    ok = (new_max <= max(low_max / k, atol)
          and float(err_new.mean()) <= max(float(err_low.mean()) / k, atol))
    return {"ok": ok, "max_abs_diff": new_max, "mean_abs_diff": float(err_new.mean()),
            "ref_max_abs_err": float(err_ref.max()), "low_precision_max_abs_err": low_max,
            "mismatch_frac": float((err_new > err_low / k + atol).double().mean())}


def _judge(model: Any, inputs: list[Any], ref_out: Any, new_out: Any,
           tol: tuple[float, float, float, float]
           ) -> tuple[str, str, dict[str, float], bool]:
    """`_compare` at the tolerances; a numbers-only miss then gets the fp64 second opinion.
    (verdict ok | incorrect | cheat | values, message, stats, whether the fp64 reference
    accepted the output)."""
    verdict, msg, stats = _compare(ref_out, new_out, *tol)
    if verdict != "values":
        return verdict, msg, stats, False
    second = against_fp64(model, inputs, ref_out, new_out, tol[0])
    if second and second["ok"]:
        return "ok", "", {k: second[k] for k in ("max_abs_diff", "mean_abs_diff")}, True
    if second:
        msg += (f" (against an fp64 reference too: error {second['max_abs_diff']:.3g}; "
                f"torch's own fp32 error {second['ref_max_abs_err']:.3g}, fp16-precision "
                f"inputs would give {second['low_precision_max_abs_err']:.3g})")
    return verdict, msg, stats, False


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


def _to_device(obj: Any, device: str) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list | tuple):
        return type(obj)(_to_device(o, device) for o in obj)
    return obj


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
    return res.data


def _run(res: _Result, job: dict[str, Any], task_src: str, cand_src: str) -> None:
    import torch

    from verifier.backends import get_backend
    from verifier.extspec import install_shim
    from verifier.fallback import judge_ops, make_trace_mode

    backend = get_backend(job["backend"])
    opts = job["options"]
    torch.set_num_threads(int(job.get("threads", 1)))
    exact_fp32()
    device = backend.device()
    res.data["device"] = backend.device_name()
    seed = int(opts.get("seed", 0))

    ref_ns: dict[str, Any] = {"__name__": "ks_reference"}
    try:
        exec(compile(task_src, "reference.py", "exec"), ref_ns)
        Model, get_inputs = ref_ns["Model"], ref_ns["get_inputs"]
        init_inputs = ref_ns["get_init_inputs"]()
        torch.manual_seed(seed)
        ref = Model(*init_inputs).to(device).eval()
    except Exception as exc:  # a broken task is the task's fault; say so
        res.finish("task_error", f"reference failed to load: {type(exc).__name__}: {exc}")

    def make_inputs(k: int) -> list[Any]:
        torch.manual_seed(seed + k)
        if device == "cpu":
            return list(_to_device(get_inputs(), device))
        with torch.device(device):  # random inputs made on the device (fast for big tensors)
            return list(_to_device(get_inputs(), device))

    timing = {"warmup": int(opts.get("perf_warmup", 3)),
              "min_trials": int(opts.get("perf_trials", 20)),
              "max_trials": int(opts.get("perf_max_trials", 100)),
              "budget_s": float(opts.get("perf_budget_s", 3.0)),
              "target_rel_iqr": float(opts.get("perf_target_rel_iqr", 0.02))}
    counter = [0]

    def timing_inputs(_i: int) -> list[Any]:  # fresh inputs for every timed call
        counter[0] += 1
        return make_inputs(5000 + counter[0])

    _baselines(res, job, backend, ref, timing_inputs, timing)

    install_shim(job["extensions"])
    guard = _guard_snapshot()
    threads_before = threading.active_count()
    # threads the harness itself started (torch.compile's helpers): not the candidate's
    res.data["harness_threads"] = threads_before

    res.progress("correctness")
    cand = types.ModuleType("candidate")
    cand.__file__ = "candidate.py"
    try:
        exec(compile(cand_src, "candidate.py", "exec"), cand.__dict__)
        model_new_cls = cand.__dict__["ModelNew"]
        torch.manual_seed(seed)
        new = model_new_cls(*init_inputs).to(device).eval()
    except Exception as exc:
        msg, line = _candidate_traceback(exc)
        res.data["error_line"] = line
        res.finish("runtime_error", msg)
    ref_sd, new_sd = ref.state_dict(), new.state_dict()
    if ref_sd and list(ref_sd) == list(new_sd) and all(
            ref_sd[k].shape == new_sd[k].shape for k in ref_sd):
        new.load_state_dict(ref_sd)

    trials = max(1, int(opts.get("trials", 5)))
    tol = (float(opts.get("atol_fp32", 1e-4)), float(opts.get("rtol_fp32", 1e-4)),
           float(opts.get("atol_low", 1e-2)), float(opts.get("rtol_low", 1e-2)))
    first_inputs = first_ref = prev_ref = prev_new = None
    ops: list[tuple[str, int | None]] = []  # (aten op, candidate line) of every forward
    own_calls = 0  # calls into the candidate's extension functions during forward
    worst: dict[str, float] = {}
    cand_s = 0.0  # time inside the candidate's forward (for the harness-overhead figure)
    for t in range(trials):
        inputs = make_inputs(1000 + t)
        pristine = _clone(inputs)
        try:
            with torch.no_grad():
                ref_out = ref(*_clone(inputs))
                cand_inputs = _clone(inputs)
                with make_trace_mode() as tr:  # every trial: no per-call-count behaviour
                    t_call = time.perf_counter()
                    new_out = new(*cand_inputs)
                    backend.synchronize()
                    cand_s += time.perf_counter() - t_call
                ops.extend(tr.ops)
                own_calls += tr.own_calls
        except Exception as exc:
            msg, line = _candidate_traceback(exc)
            res.data["error_line"] = line
            res.data["trials"] = t
            res.finish("runtime_error", msg)
        if prev_new is not None and _same(new_out, prev_new) and not _same(ref_out, prev_ref):
            res.data["trials"] = t + 1
            res.finding("result_caching", "the same output for different inputs")
            res.finish("cheat", "the output did not change with new inputs (cached result)")
        verdict, msg, stats, by_fp64 = _judge(ref, pristine, ref_out, new_out, tol)
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
        if not _same(cand_inputs, pristine):
            res.finding("input_mutation", "forward modified its input tensors in place")
            res.finish("incorrect", "forward modified its input tensors (the reference does not)")
        prev_ref, prev_new = ref_out, new_out
        if t == 0:
            first_inputs, first_ref = pristine, ref_out
    res.data.setdefault("mismatch_frac", 0.0)
    policy = str(opts.get("fallback", "strict"))
    found, cheat = judge_ops(ops, policy, own_calls)
    res.data["findings"].extend(found)
    res.data["own_calls"] = own_calls
    if cheat:
        res.finish("cheat", cheat)
    _check_tamper(res, guard, threads_before)
    res.data["ops"] = list(dict.fromkeys(op for op, _ in ops))[:50]
    _check_kernels(res, backend, job, lambda: new(*_clone(first_inputs)))

    res.progress("performance")
    try:
        with torch.no_grad():
            runs = [backend.time_call(new, timing_inputs, **timing)
                    for _ in range(max(1, int(opts.get("repeat_timing", 1))))]
            again = new(*_clone(first_inputs))
            backend.synchronize()
    except Exception as exc:
        msg, line = _candidate_traceback(exc)
        res.finish("runtime_error", f"during timing: {msg}")
    cand_t = runs[0]
    res.data.update(runtime_us=cand_t.median_us, runtime_iqr_us=cand_t.iqr_us,
                    timing_trials=cand_t.trials, timing_cv=cand_t.cv,
                    timing_method=cand_t.method, hidden_us=cand_t.hidden_us)
    for key in ("spin_us", "host_us", "uncovered_trials", "discarded_trials", "clock_mhz"):
        res.data[key] = getattr(cand_t, key, None)  # device timing only (gpu_timing)
    cand_s += cand_t.mean_us * cand_t.trials / 1e6
    res.data["candidate_s"] = cand_s
    if len(runs) > 1:
        from verifier.gpu_timing import coefficient_of_variation

        res.data["repeat_medians_us"] = [r.median_us for r in runs]
        res.data["repeat_cv"] = coefficient_of_variation(res.data["repeat_medians_us"])
    if cand_t.method == "device_sync":  # paid for in the timing; worth knowing in the data
        res.finding("hidden_work", f"{cand_t.hidden_us:.0f} us of device work was still "
                    "running after forward's stream finished (side streams or threads); timed "
                    "to device idle", severity="warning")
    verdict, msg, _, _ = _judge(ref, first_inputs, first_ref, again, tol)
    if verdict != "ok":
        res.finding("changed_after_timing", msg)
        res.finish("cheat", f"outputs changed after the timing runs: {msg}")
    _check_tamper(res, guard, threads_before)
    res.progress("done")
    res.finish("ok")


def _baselines(res: _Result, job: dict[str, Any], backend: Any, ref: Any,
               make_args: Callable[[int], list[Any]], timing: dict[str, Any]) -> None:
    """Eager / torch.compile timings of the reference, unless the parent has them cached."""
    import torch

    opts = job["options"]
    try:
        with torch.no_grad():
            if job.get("eager_us") is None:
                et = backend.time_call(ref, make_args, **timing)
                res.data.update(eager_us=et.median_us, eager_iqr_us=et.iqr_us,
                                eager_measured=True)
            else:
                res.data["eager_us"] = job["eager_us"]
            if opts.get("torch_compile_baseline") and backend.torch_compile_supported():
                if job.get("compiled_us") is None:
                    compiled = torch.compile(ref)
                    ct = backend.time_call(compiled, make_args, **timing)
                    res.data.update(compiled_us=ct.median_us, compiled_measured=True)
                else:
                    res.data["compiled_us"] = job["compiled_us"]
    except Exception as exc:  # a reference that cannot be timed is the task's problem
        res.finish("task_error", f"timing the reference failed: {type(exc).__name__}: {exc}")


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
    changed = [name for name, obj in guard.items() if now.get(name) is not obj]
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
    _write("result.json", data)
    sys.stdout.flush()
    os._exit(0)  # skip atexit/finalizers the candidate may have registered


if __name__ == "__main__":
    main()
