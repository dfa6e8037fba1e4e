"""Execution worker (child side, inside the sandbox): correctness, anti-cheat, performance.

Reads `job.json`, `task.py` and `candidate.py` from its working directory, deletes the job and the
task file before the candidate runs (the candidate cannot read the reference or the result
nonce from disk), and writes `progress.json` after each stage and `result.json` at the end. The
parent decides the status, the reward and the feedback; this process only measures.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

# Ops a candidate's forward may run through the dispatcher: allocation, views, shape queries and
# copies. Anything else (aten.mm, aten.relu, ...) is torch doing the candidate's work.
ALLOWED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "fill_", "zero_", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided",
    "contiguous", "clone", "copy_", "_to_copy", "to", "detach", "alias", "lift_fresh",
    "lift_fresh_copy", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "select",
    "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "flatten", "unflatten",
    "view_as", "expand_as", "resize_", "size", "sym_size", "stride", "sym_stride", "numel",
    "sym_numel", "dim", "is_contiguous", "storage_offset", "sym_storage_offset", "item",
    "_local_scalar_dense", "set_", "_has_compatible_shallow_copy_type", "is_same_size",
    "empty_permuted", "unfold",
})

# Functions the harness relies on; a candidate that replaces any of them is tampering.
_GUARDED = (
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "time"),
    ("time", "monotonic"), ("time", "sleep"), ("torch", "allclose"), ("torch", "equal"),
    ("torch.cuda", "synchronize"), ("torch.cuda", "Event"),
    ("torch.testing", "assert_close"), ("torch.Tensor", "__eq__"), ("torch.Tensor", "clone"),
    ("torch.Tensor", "abs"), ("torch.Tensor", "double"), ("torch.Tensor", "to"),
    ("torch.nn.Module", "__call__"), ("threading", "Thread"),
)


def _write(name: str, data: dict) -> None:
    tmp = Path(f".{name}.tmp")
    tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    os.replace(tmp, name)


class _Result:
    def __init__(self, nonce: str):
        self.data: dict[str, Any] = {"nonce": nonce, "stage": "correctness", "outcome": "ok",
                                     "findings": [], "error": ""}

    def progress(self, stage: str) -> None:
        self.data["stage"] = stage
        _write("progress.json", {"stage": stage})

    def finish(self, outcome: str, error: str = "") -> None:
        self.data["outcome"] = outcome
        if error:
            self.data["error"] = error[:4000]
        _write("result.json", self.data)
        sys.stdout.flush()
        os._exit(0)  # skip atexit/finalizers the candidate may have registered

    def finding(self, rule: str, message: str, line: int | None = None) -> None:
        self.data["findings"].append({"rule": rule, "message": message, "line": line,
                                      "severity": "error"})


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


def _flatten(out: Any) -> list[Any] | None:
    if isinstance(out, tuple | list):
        return list(out)
    return [out]


def _compare(ref: Any, new: Any, atol: float, rtol: float, atol_low: float, rtol_low: float
             ) -> tuple[str, str, dict[str, float]]:
    """(verdict, message, stats): verdict ok | incorrect | cheat."""
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
        rd, nd = r.detach().double().cpu(), n.detach().double().cpu()
        diff = (nd - rd).abs()
        both_nan = rd.isnan() & nd.isnan()
        same_inf = rd.isinf() & (nd == rd)
        bad = ~(both_nan | same_inf) & ~(diff <= a + rt * rd.abs())
        finite = torch.isfinite(diff)
        if finite.any():
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
            if total:
                stats["mean_abs_diff"] /= total
                stats["mismatch_frac"] /= total
            return "incorrect", msg, stats
    if total:
        stats["mean_abs_diff"] /= total
        stats["mismatch_frac"] /= total
    return "ok", "", stats


def _clone(xs: list[Any]) -> list[Any]:
    import torch

    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _same(a: Any, b: Any) -> bool:
    import torch

    fa, fb = _flatten(a), _flatten(b)
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x.cpu(), y.cpu()):
                return False
        elif x != y:
            return False
    return True


def _median_iqr(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)

    def q(p: float) -> float:
        k = (len(s) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return q(0.5), q(0.75) - q(0.25)


def run(job: dict[str, Any], task_src: str, cand_src: str) -> None:
    res = _Result(job["nonce"])
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from verifier.backends import get_backend
    from verifier.extspec import install_shim

    backend = get_backend(job["backend"])
    opts = job["options"]
    torch.set_num_threads(int(job.get("threads", 1)))
    # fp32 references in true fp32 (torch enables TF32 in cuDNN): see gpu_worker.exact_fp32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = backend.device()
    res.data["device"] = backend.device_name()

    ref_ns: dict[str, Any] = {"__name__": "ks_reference"}
    try:
        exec(compile(task_src, "reference.py", "exec"), ref_ns)
    except Exception as exc:  # a broken task is the task's fault; say so
        res.finish("task_error", f"reference failed to load: {exc}")
    Model, get_inputs = ref_ns["Model"], ref_ns["get_inputs"]
    init_inputs = ref_ns["get_init_inputs"]()

    install_shim(job["extensions"])
    guard = _guard_snapshot()
    threads_before = threading.active_count()

    class _Trace(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    res.progress("correctness")
    cand = types.ModuleType("candidate")
    cand.__file__ = "candidate.py"
    try:
        exec(compile(cand_src, "candidate.py", "exec"), cand.__dict__)
        model_new_cls = cand.__dict__["ModelNew"]
        seed = int(opts.get("seed", 0))
        torch.manual_seed(seed)
        ref = Model(*init_inputs).to(device)
        torch.manual_seed(seed)
        new = model_new_cls(*init_inputs).to(device)
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
    first_inputs = None
    first_ref = None
    prev_ref = prev_new = None
    ops: list[str] = []
    worst: dict[str, float] = {}
    cand_s = 0.0  # time inside the candidate's forward (for the harness-overhead figure)
    for t in range(trials):
        torch.manual_seed(seed + 1000 + t)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in get_inputs()]
        pristine = _clone(inputs)
        try:
            with torch.no_grad():
                ref_out = ref(*_clone(inputs))
                cand_inputs = _clone(inputs)
                with _Trace() as tr:  # every trial: a forward must not behave per call count
                    t_call = time.perf_counter()
                    new_out = new(*cand_inputs)
                    cand_s += time.perf_counter() - t_call
                ops.extend(tr.ops)
            backend.synchronize()
        except Exception as exc:
            msg, line = _candidate_traceback(exc)
            res.data["error_line"] = line
            res.data["trials"] = t
            res.finish("runtime_error", msg)
        if prev_new is not None and _same(new_out, prev_new) and not _same(ref_out, prev_ref):
            res.data["trials"] = t + 1
            res.finding("result_caching", "the same output for different inputs")
            res.finish("cheat", "the output did not change with new inputs (cached result)")
        verdict, msg, stats = _compare(ref_out, new_out, *tol)
        for k, v in stats.items():
            worst[k] = max(worst.get(k, 0.0), v)
        res.data.update(worst)
        res.data["trials"] = t + 1
        if verdict == "cheat":
            res.finding("output_type", msg)
        if verdict != "ok":
            res.finish(verdict, f"trial {t + 1}: {msg}")
        if not _same(cand_inputs, pristine):
            res.finding("input_mutation", "forward modified its input tensors in place")
            res.finish("incorrect", "forward modified its input tensors (the reference does not)")
        prev_ref, prev_new = ref_out, new_out
        if t == 0:
            first_inputs, first_ref = pristine, ref_out
    forbidden = [op for op in dict.fromkeys(ops)
                 if op.split(".")[0] == "aten" and op.split(".")[1] not in ALLOWED_OPS]
    if forbidden:
        for op in forbidden:
            res.finding("aten_fallback", f"forward ran {op} through torch (dispatcher trace)")
        res.finish("cheat", f"forward computes with torch ops: {', '.join(forbidden[:5])}")
    _check_tamper(res, guard, threads_before)
    res.data["ops"] = list(dict.fromkeys(ops))[:50]
    try:
        res.data["kernel_names"] = backend.kernel_names(lambda: new(*_clone(first_inputs)))
    except Exception as exc:  # profiling is best effort; say why it failed
        res.data["kernel_names_error"] = str(exc)[:200]

    res.progress("performance")
    warmup, ptrials = int(opts.get("perf_warmup", 3)), int(opts.get("perf_trials", 20))
    timing_inputs = _clone(first_inputs)
    try:
        with torch.no_grad():
            times = backend.time_us(lambda: new(*timing_inputs), warmup, ptrials)
            res.data["runtime_us"], res.data["runtime_iqr_us"] = _median_iqr(times)
            cand_s += sum(times) / 1e6 * (1 + warmup / max(1, ptrials))
            res.data["candidate_s"] = cand_s
            if job.get("eager_us") is None:
                eager_inputs = _clone(first_inputs)
                et = backend.time_us(lambda: ref(*eager_inputs), warmup, ptrials)
                res.data["eager_us"], res.data["eager_iqr_us"] = _median_iqr(et)
                res.data["eager_measured"] = True
            else:
                res.data["eager_us"] = job["eager_us"]
            if opts.get("torch_compile_baseline") and backend.torch_compile_supported():
                if job.get("compiled_us") is None:
                    compiled = torch.compile(ref)
                    ci = _clone(first_inputs)
                    ct = backend.time_us(lambda: compiled(*ci), warmup, ptrials)
                    res.data["compiled_us"] = _median_iqr(ct)[0]
                    res.data["compiled_measured"] = True
                else:
                    res.data["compiled_us"] = job["compiled_us"]
            again = new(*_clone(first_inputs))
            backend.synchronize()
    except Exception as exc:
        msg, line = _candidate_traceback(exc)
        res.finish("runtime_error", f"during timing: {msg}")
    verdict, msg, _ = _compare(first_ref, again, *tol)
    if verdict != "ok":
        res.finding("changed_after_timing", msg)
        res.finish("cheat", f"outputs changed after the timing runs: {msg}")
    _check_tamper(res, guard, threads_before)
    res.progress("done")
    res.finish("ok")


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
    job = json.loads(Path("job.json").read_text(encoding="utf-8"))
    task_src = Path("task.py").read_text(encoding="utf-8")
    cand_src = Path("candidate.py").read_text(encoding="utf-8")
    os.unlink("job.json")
    os.unlink("task.py")
    os.unlink("options.json") if Path("options.json").exists() else None
    start = time.perf_counter()
    try:
        run(job, task_src, cand_src)
    except SystemExit:
        raise
    except BaseException as exc:  # harness bug or exotic candidate error: still report it
        _write("result.json", {"nonce": job["nonce"], "outcome": "runtime_error",
                               "stage": "correctness", "findings": [],
                               "error": f"{type(exc).__name__}: {exc}"[:2000],
                               "harness_s": time.perf_counter() - start})
        os._exit(0)


if __name__ == "__main__":
    main()
