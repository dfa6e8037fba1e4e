"""GPU execution worker: runs prebuilt candidates on one GPU, one at a time, and reports verdicts.

Started by `verifier.gpu_service` as `python -m verifier.gpu_worker RESULT_FD` with
CUDA_VISIBLE_DEVICES pinned; reads one JSON job per stdin line, writes one JSON result per line to
RESULT_FD (the candidate's own prints go to stdout/stderr, never into results). The candidate's
`load_inline` calls are answered from the prebuilt extensions the compile service made (matched
by content key), so the GPU never waits for nvcc; a call with no prebuilt match falls back to
torch's real `load_inline`. After a CUDA error the context may be unusable ("sticky"), so the
worker reports and exits; the service starts a fresh one.

Checks: seeded construction of Model and ModelNew (state-dict copy when names match), N trials
with fresh seeded inputs and dtype-aware tolerances, `type(out) is torch.Tensor`, input mutation,
launched-kernel names (library/ATen fallback = cheat), timing with synchronized events and L2
flush, eager/torch.compile baselines cached per (task, device, torch), correctness re-checked
after timing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
import types
from typing import Any

import torch

from verifier.inline_builds import inline_key

_PREBUILT: dict[str, str] = {}  # content key -> path of a built extension .so


def _load_extension(path: str, module_name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load extension {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _install_load_inline_hook() -> None:
    from torch.utils import cpp_extension

    real = cpp_extension.load_inline

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, functions: Any = None,
                    extra_cflags: Any = None, extra_cuda_cflags: Any = None,
                    extra_ldflags: Any = None, extra_include_paths: Any = None,
                    **kwargs: Any) -> Any:
        key = inline_key(cpp_sources, cuda_sources, functions, extra_cflags, extra_cuda_cflags,
                         extra_ldflags, extra_include_paths)
        path = _PREBUILT.get(key)
        if path is not None:
            return _load_extension(path, os.path.basename(path).split(".")[0])
        return real(name, cpp_sources, cuda_sources, functions, extra_cflags, extra_cuda_cflags,
                    extra_ldflags, extra_include_paths, **kwargs)

    cpp_extension.load_inline = load_inline


def _exec_source(source: str, name: str) -> dict[str, Any]:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 (sandboxed worker)
    return module.__dict__


def _to_device(obj: Any, device: str) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    return obj


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(o) for o in obj)
    return obj


def _make_inputs(task: dict[str, Any], seed: int, device: str) -> list[Any]:
    torch.manual_seed(seed)
    with torch.device(device):  # random inputs made on the GPU directly (fast for big tensors)
        return list(_to_device(task["get_inputs"](), device))


def exact_fp32() -> None:
    """Reference math in true fp32: no TF32 in cuBLAS or cuDNN (torch enables it for cuDNN).

    With TF32 on, an fp32 conv reference carries ~1e-3 relative error, so an exact fp32 kernel
    fails the fp32 tolerance (1e-4) against it; TF32 is a precision downgrade, not the task.
    """
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _tolerance(dtype: torch.dtype, job: dict[str, Any]) -> tuple[float, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return job.get("atol_low", 1e-2), job.get("rtol_low", 1e-2)
    return job.get("atol", 1e-4), job.get("rtol", 1e-4)


def _compare(ref: Any, out: Any, job: dict[str, Any]) -> dict[str, Any] | None:
    """None when `out` matches `ref`, else a dict describing the mismatch."""
    if type(out) is not torch.Tensor:
        return {"reason": f"output type is {type(out).__name__}, expected torch.Tensor"}
    if out.shape != ref.shape:
        return {"reason": f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}"}
    if out.dtype != ref.dtype:
        return {"reason": f"output dtype {out.dtype} != expected {ref.dtype}"}
    atol, rtol = _tolerance(ref.dtype, job)
    diff = (out.float() - ref.float()).abs()
    bad = diff > atol + rtol * ref.float().abs()
    bad |= torch.isnan(out.float()) != torch.isnan(ref.float())
    if bool(bad.any()):
        return {"reason": "values differ", "max_abs_diff": float(diff.nan_to_num(1e30).max()),
                "mean_abs_diff": float(diff.nan_to_num(1e30).mean()),
                "mismatch_frac": float(bad.float().mean())}
    return {"max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
            "mean_abs_diff": float(diff.mean()) if diff.numel() else 0.0, "ok": True}


def _against_fp64(model: Any, inputs: list[Any], ref: Any, out: Any,
                  job: dict[str, Any]) -> dict[str, Any] | None:
    """Second opinion for an fp32 mismatch: is `out` as close to an fp64 reference as torch's
    own fp32 result is? Long reductions (matmul with K = 8192, long scans) differ from cuBLAS
    by more than 1e-4 in any summation order; that is fp32, not a bug. Passes when the
    candidate's max and mean error against fp64 are at most twice the reference's plus atol.
    None when no fp64 reference can be made (non-float outputs, a model that fails in fp64).
    """
    import copy

    if not (isinstance(ref, torch.Tensor) and ref.dtype == torch.float32
            and isinstance(out, torch.Tensor) and out.shape == ref.shape):
        return None
    try:
        model64 = copy.deepcopy(model).double()
        args = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                for x in inputs]
        exact = model64(*args)
    except Exception:  # fp64 unsupported by some op here: the fp32 verdict stands
        return None
    if not isinstance(exact, torch.Tensor) or exact.shape != ref.shape:
        return None
    atol = float(job.get("atol", 1e-4))
    err_new = (out.double() - exact).abs().nan_to_num(1e30)
    err_ref = (ref.double() - exact).abs().nan_to_num(1e30)
    ok = (float(err_new.max()) <= 2 * float(err_ref.max()) + atol
          and float(err_new.mean()) <= 2 * float(err_ref.mean()) + atol)
    result = {"max_abs_diff": float(err_new.max()), "mean_abs_diff": float(err_new.mean()),
              "ref_max_abs_err": float(err_ref.max())}
    if ok:
        return {**result, "ok": True}
    return {**result, "reason": "values differ (also against an fp64 reference: error "
            f"{float(err_new.max()):.3g} vs torch's own {float(err_ref.max()):.3g})",
            "mismatch_frac": float((err_new > 2 * err_ref + atol).double().mean())}


def _mismatch_text(cmp: dict[str, Any], trial: int) -> str:
    """One line for a failed comparison, with the numbers a repair prompt needs."""
    text = f"trial {trial + 1}: {cmp.get('reason', 'mismatch')}"
    if cmp.get("max_abs_diff") is not None:
        text += (f": max abs diff {cmp['max_abs_diff']:.3g}, mean {cmp['mean_abs_diff']:.3g}, "
                 f"{cmp['mismatch_frac']:.2%} of elements beyond tolerance")
    return text


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return True


def run_job(job: dict[str, Any], baseline_cache: Any) -> dict[str, Any]:
    """Verify one candidate (already built) on this worker's GPU; returns a result dict."""
    from verifier.gpu_anticheat import candidate_kernel_names, fallback_findings, launched_kernels
    from verifier.gpu_timing import L2Flusher, coefficient_of_variation, time_device_fn

    device = "cuda"
    exact_fp32()  # every job: an earlier candidate may have flipped them
    res: dict[str, Any] = {"candidate_id": job["candidate_id"], "findings": []}
    _PREBUILT.update(job.get("prebuilt", {}))
    t0 = time.monotonic()
    task = _exec_source(job["task_source"], f"ks_task_{job['candidate_id']}")
    init = task["get_init_inputs"]()
    try:
        cand = _exec_source(job["candidate_source"], f"ks_cand_{job['candidate_id']}")
    except Exception as exc:  # candidate module failed at import/build time
        return {**res, "status": "runtime_error", "stage": "correctness",
                "error": f"candidate module failed: {type(exc).__name__}: {exc}"[:2000]}
    if "ModelNew" not in cand:
        return {**res, "status": "format_error", "stage": "extract", "error": "no ModelNew"}
    seed = int(job.get("seed", 0))
    torch.manual_seed(seed)
    ref_model = task["Model"](*init).to(device).eval()
    torch.manual_seed(seed)
    new_model = cand["ModelNew"](*init).to(device).eval()
    ref_sd, new_sd = ref_model.state_dict(), new_model.state_dict()
    if ref_sd and set(ref_sd) == set(new_sd):
        new_model.load_state_dict(ref_sd)
    trials = int(job.get("trials", 5))
    worst: dict[str, Any] = {}
    with torch.no_grad():
        for t in range(trials):
            inputs = _make_inputs(task, seed + 1000 + t, device)
            ref = ref_model(*_clone(inputs))
            before = _clone(inputs)
            out = new_model(*inputs)
            torch.cuda.synchronize()
            if not _same(before, inputs):
                return {**res, "status": "incorrect", "stage": "correctness", "trials": t + 1,
                        "error": "ModelNew.forward modified its inputs in place"}
            cmp = _compare(ref, out, job)
            if cmp and cmp.get("reason") == "values differ":
                cmp = _against_fp64(ref_model, before, ref, out, job) or cmp
                if cmp.get("ok"):
                    res["tolerance"] = "fp64_reference"
            if not cmp or not cmp.get("ok"):
                return {**res, "status": "incorrect", "stage": "correctness", "trials": t + 1,
                        "error": _mismatch_text(cmp or {}, t),
                        **{k: v for k, v in (cmp or {}).items() if k != "reason"}}
            if cmp["max_abs_diff"] >= worst.get("max_abs_diff", -1.0):
                worst = cmp
    res.update(trials=trials, max_abs_diff=worst.get("max_abs_diff"),
               mean_abs_diff=worst.get("mean_abs_diff"), mismatch_frac=0.0)
    # Which kernels does forward launch? Library or ATen compute = fallback.
    probe = _make_inputs(task, seed + 7, device)
    kernels = launched_kernels(new_model, probe, device)
    own = candidate_kernel_names(job.get("device_sources", []))
    findings = fallback_findings(kernels, own)
    res["kernel_names"] = kernels[:50]
    res["findings"] = [f.as_finding() for f in findings]
    if any(f.category != "unknown" for f in findings):
        bad = next(f for f in findings if f.category != "unknown")
        return {**res, "status": "cheat", "stage": "correctness",
                "error": f"forward launched a {bad.category} kernel ({bad.kernel[:120]}): "
                         "the computation fell back to a library instead of the candidate's code"}
    if job.get("compile_only_correctness"):
        return {**res, "status": "correct_slow", "stage": "correctness"}
    # Performance: fresh inputs per timing iteration, made before each timed call.
    flusher = L2Flusher(device)
    counter = [0]

    def make_args(i: int) -> list[Any]:
        counter[0] += 1
        return _make_inputs(task, seed + 5000 + counter[0], device)

    timing_kw = {"warmup": int(job.get("warmup", 3)), "min_trials": int(job.get("min_trials", 25)),
                 "max_trials": int(job.get("max_trials", 100)),
                 "target_rel_iqr": float(job.get("target_rel_iqr", 0.02)),
                 "budget_s": float(job.get("budget_s", 5.0)), "flusher": flusher}
    repeats = int(job.get("repeat_timing", 1))
    runs = [time_device_fn(new_model, make_args, device=device, **timing_kw)
            for _ in range(repeats)]
    cand_t = runs[0]
    res.update(runtime_us=cand_t.median_us, runtime_iqr_us=cand_t.iqr_us,
               timing_trials=cand_t.trials, timing_cv=cand_t.cv,
               persisting_l2_reset=cand_t.persisting_l2_reset, timing_method=cand_t.method,
               hidden_us=cand_t.hidden_us)
    if cand_t.method == "device_sync":  # paid for in the timing; worth knowing in the data
        res["findings"].append({
            "rule": "hidden_work", "severity": "warning", "line": None,
            "message": f"{cand_t.hidden_us:.0f} us of GPU work was still running after forward's "
                       "stream finished (side streams or threads); timed to device idle"})
    if repeats > 1:
        medians = [r.median_us for r in runs]
        res["repeat_medians_us"] = medians
        res["repeat_cv"] = coefficient_of_variation(medians)
    eager, cached_e = baseline_cache.get_or_measure(
        job["task_source"], "eager", device,
        lambda: time_device_fn(ref_model, make_args, device=device, **timing_kw))
    res.update(eager_us=eager.median_us, speedup=eager.median_us / cand_t.median_us,
               eager_cached=cached_e)
    if job.get("torch_compile_baseline"):
        def measure_compiled() -> Any:
            compiled = torch.compile(ref_model)
            return time_device_fn(compiled, make_args, device=device, **timing_kw)

        try:
            comp, cached_c = baseline_cache.get_or_measure(job["task_source"], "compile", device,
                                                           measure_compiled)
            res.update(compiled_us=comp.median_us, compiled_cached=cached_c,
                       speedup_compiled=comp.median_us / cand_t.median_us)
        except Exception as exc:  # torch.compile unavailable (no triton): note and go on
            res["compile_baseline_error"] = f"{type(exc).__name__}: {exc}"[:300]
    # Correctness again after timing: a candidate that changes behaviour once warmed is caught.
    with torch.no_grad():
        inputs = _make_inputs(task, seed + 99, device)
        ref = ref_model(*_clone(inputs))
        cmp = _compare(ref, new_model(*inputs), job)
    if not cmp or not cmp.get("ok"):
        return {**res, "status": "incorrect", "stage": "performance",
                "error": "output wrong when re-checked after timing: " + (cmp or {}).get(
                    "reason", "mismatch")}
    fast = res["speedup"] > float(job.get("fast_threshold", 1.1))
    res.update(status="correct_fast" if fast else "correct_slow", stage="done", faster=fast,
               worker_s=time.monotonic() - t0)
    return res


def _sticky_error() -> str | None:
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return None
    except Exception as exc:  # the context is broken; this worker must not run more candidates
        return f"{type(exc).__name__}: {exc}"


def main(argv: list[str]) -> int:
    """Serve jobs from stdin until EOF; results go to the fd named in argv[0]."""
    from verifier.gpu_timing import BaselineCache

    out = os.fdopen(int(argv[0]), "w", buffering=1)
    _install_load_inline_hook()
    cache_dir = argv[1] if len(argv) > 1 else None
    cache = BaselineCache(cache_dir)
    torch.cuda.init()
    out.write(json.dumps({"ready": True, "pid": os.getpid(),
                          "device": torch.cuda.get_device_name(0)}) + "\n")
    for line in sys.stdin:
        job = json.loads(line)
        try:
            result = run_job(job, cache)
        except Exception as exc:
            result = {"candidate_id": job.get("candidate_id"), "status": "runtime_error",
                      "stage": "correctness", "findings": [],
                      "error": f"{type(exc).__name__}: {exc}"[:2000],
                      "traceback": traceback.format_exc()[-3000:]}
        sticky = _sticky_error() if result.get("status") == "runtime_error" else None
        result["worker_pid"] = os.getpid()
        if sticky:
            result["sticky_cuda_error"] = sticky
        out.write(json.dumps(result, default=str) + "\n")
        if sticky:
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
