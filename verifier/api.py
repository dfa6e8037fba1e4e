"""The verifier's Python API: `verify_batch(requests, options) -> verdicts`.

Stages per candidate: extract and static checks in the caller (pure Python, fast); extension
specs from literal arguments or a sandboxed collect run; C++ static checks; batch builds on a
compile pool (threads driving compiler processes, `options.compile_workers` at a time); as soon as
all of a candidate's extensions are built it goes to the execution pool (`options.workers`
sandboxed worker processes, one candidate each), so execution overlaps compilation. Status,
reward and feedback are decided here from what the workers measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifier.backends import Backend, BackendUnavailable, get_backend, select_backend
from verifier.build import BuildContext, Builder, BuildResult, _flags_key, copy_for_worker
from verifier.extract import FormatError, check_candidate, extract_code
from verifier.extspec import ExtensionSpec, specs_from_source
from verifier.protocol import VerdictData, VerifyOptions, VerifyRequest
from verifier.reward import finalize
from verifier.sandbox import SandboxLimits, run_sandboxed
from verifier.static import check_cpp, check_python

_PKG_ROOT = str(Path(__file__).resolve().parent.parent)
_FLOOD_BYTES = 16 << 20  # stdout+stderr beyond this is a flood (the file limit stops it at 64 MB)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kernelsynth"


@dataclass
class _Item:
    req: VerifyRequest
    verdict: VerdictData
    code: str = ""
    specs: list[ExtensionSpec] = field(default_factory=list)
    built: dict[str, BuildResult] = field(default_factory=dict)
    done: bool = False
    t0: float = field(default_factory=time.monotonic)
    timing: dict[str, float] = field(default_factory=dict)  # collect_s, exec_s, candidate_s

    def stop(self, status: str, stage: str, error: str = "") -> None:
        self.verdict.status, self.verdict.stage = status, stage
        if error:
            self.verdict.error = error[:4000]
        self.done = True


def _worker_env() -> dict[str, str]:
    return {"PYTHONPATH": _PKG_ROOT}


def _collect_specs(item: _Item, opts: VerifyOptions) -> None:
    """Fill item.specs from literals, else by running the module in a collect sandbox."""
    specs = specs_from_source(item.code)
    if specs is not None:
        item.specs = specs
        return
    t0 = time.monotonic()
    res = run_sandboxed([sys.executable, "-m", "verifier.collect"],
                        limits=SandboxLimits(timeout_s=min(opts.run_timeout_s, 60.0),
                                             memory_mb=opts.memory_limit_mb),
                        input_files={"candidate.py": item.code}, env=_worker_env())
    item.timing["collect_s"] = time.monotonic() - t0
    if res.timed_out:
        item.stop("timeout", "compile", "running the candidate module (to find its load_inline "
                                        f"calls) {res.describe_failure()}")
        return
    if res.payload is None:
        item.stop("runtime_error", "compile", "running the candidate module failed: "
                  + res.describe_failure())
        return
    item.specs = [ExtensionSpec.from_dict(d) for d in res.payload.get("specs", [])]
    if res.payload.get("error") and not item.specs:
        line = res.payload.get("line")
        item.stop("runtime_error", "compile",
                  (f"candidate.py line {line}: " if line else "") + res.payload["error"])


def _baseline_path(opts: VerifyOptions, backend: Backend, task_source: str, device: str) -> Path:
    import torch

    key = hashlib.sha256("\0".join([task_source, backend.name, device, torch.__version__,
                                    str(opts.perf_trials), str(opts.seed)]).encode()).hexdigest()
    base = Path(opts.baseline_cache_dir) if opts.baseline_cache_dir else (
        default_cache_dir() / "baselines")
    return base / f"{key[:24]}.json"


class _Baselines:
    """Eager / torch.compile timings per (task, device, torch version), on disk."""

    def __init__(self, opts: VerifyOptions, backend: Backend):
        self.opts, self.backend = opts, backend
        self.lock = threading.Lock()

    def get(self, task_source: str, device: str) -> dict[str, Any]:
        try:
            return json.loads(_baseline_path(self.opts, self.backend, task_source,
                                             device).read_text())
        except (OSError, ValueError):
            return {}

    def put(self, task_source: str, device: str, data: dict[str, Any]) -> None:
        path = _baseline_path(self.opts, self.backend, task_source, device)
        with self.lock:
            merged = {**self.get(task_source, device), **data}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(merged))
            os.replace(tmp, path)


def _execute(item: _Item, backend: Backend, opts: VerifyOptions, baselines: _Baselines,
             threads: int, slot_env: dict[str, str] | None = None) -> None:
    """Run the correctness and performance stages for one candidate in a sandboxed worker."""
    v = item.verdict
    device_label = backend.baseline_key()
    base = baselines.get(item.req.task_source, device_label)
    nonce = secrets.token_hex(16)
    workdir = Path(tempfile.mkdtemp(prefix="ks-run-"))
    try:
        entries = copy_for_worker(list(item.built.values()), workdir)
        job = {"nonce": nonce, "backend": backend.name, "extensions": entries,
               "options": {k: getattr(opts, k) for k in (
                   "trials", "atol_fp32", "rtol_fp32", "atol_low", "rtol_low", "perf_trials",
                   "perf_warmup", "torch_compile_baseline", "seed")},
               "eager_us": base.get("eager_us"), "compiled_us": base.get("compiled_us"),
               "threads": threads}
        res = run_sandboxed(
            [sys.executable, "-m", "verifier.worker"],
            limits=SandboxLimits(timeout_s=opts.run_timeout_s,
                                 memory_mb=backend.sandbox_memory_mb(opts.memory_limit_mb)),
            input_files={"job.json": json.dumps(job), "task.py": item.req.task_source,
                         "candidate.py": item.code},
            env={**_worker_env(), "OMP_NUM_THREADS": str(threads), **(slot_env or {})},
            workdir=workdir)
        item.timing["exec_s"] = res.wall_s
        if res.payload and "candidate_s" in res.payload:
            item.timing["candidate_s"] = float(res.payload["candidate_s"])
        progress = {}
        try:
            progress = json.loads((workdir / "progress.json").read_text())
        except (OSError, ValueError):
            pass
        # Python ignores SIGXFSZ, so a flood ends in failed writes, not a signal: look at sizes.
        flood = sum((workdir / n).stat().st_size for n in (".stdout", ".stderr")
                    if (workdir / n).exists()) >= _FLOOD_BYTES
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    stage = progress.get("stage", "correctness")
    if flood:
        return item.stop("runtime_error", stage, "the candidate flooded stdout/stderr (over "
                         f"{_FLOOD_BYTES >> 20} MB); output is capped and the run was ended")
    if res.timed_out:
        return item.stop("timeout", stage, f"{stage} stage {res.describe_failure()}")
    p = res.payload
    if p is None:
        return item.stop("runtime_error", stage, res.describe_failure())
    if p.get("nonce") != nonce:
        v.findings.append({"rule": "forged_result", "message": "result.json was not written by "
                           "the harness", "line": None, "severity": "error"})
        return item.stop("cheat", stage, "the candidate wrote the harness's result file")
    v.device = p.get("device", v.device)
    v.trials = int(p.get("trials", 0))
    for k in ("max_abs_diff", "mean_abs_diff", "mismatch_frac"):
        if p.get(k) is not None:
            setattr(v, k, float(p[k]))
    v.findings.extend(p.get("findings", []))
    v.kernel_names = [str(k) for k in p.get("kernel_names", [])]
    outcome = p.get("outcome")
    if outcome != "ok":
        status = {"task_error": "runtime_error"}.get(outcome, outcome)
        return item.stop(status if status in ("runtime_error", "incorrect", "cheat")
                         else "runtime_error", p.get("stage", stage), p.get("error", ""))
    if p.get("eager_measured"):
        baselines.put(item.req.task_source, device_label, {"eager_us": p["eager_us"]})
    if p.get("compiled_measured"):
        baselines.put(item.req.task_source, device_label, {"compiled_us": p["compiled_us"]})
    v.runtime_us, v.runtime_iqr_us = p.get("runtime_us"), p.get("runtime_iqr_us")
    v.eager_us, v.compiled_us = p.get("eager_us"), p.get("compiled_us")
    if v.runtime_us and v.eager_us:
        v.speedup = round(v.eager_us / v.runtime_us, 4)
    if v.runtime_us and v.compiled_us:
        v.speedup_compiled = round(v.compiled_us / v.runtime_us, 4)
    v.faster = bool(v.speedup and v.speedup > opts.fast_threshold)
    item.stop("correct_fast" if v.faster else "correct_slow", "done")


def _front_stages(item: _Item) -> None:
    """extract and static (Python) in the caller."""
    try:
        item.code = extract_code(item.req.response)
        tree = check_candidate(item.code, item.req.task_source)
    except FormatError as exc:
        return item.stop("format_error", "extract", str(exc))
    findings = check_python(tree, item.req.task_source)
    if findings:
        item.verdict.findings = findings
        return item.stop("static_reject", "static", "; ".join(
            f"{f['rule']}: {f['message']}" for f in findings[:3]))
    if "load_inline" not in item.code and "cpp_extension" not in item.code:
        return item.stop("static_reject", "static",
                         "no load_inline call: the candidate has no kernel of its own")
    return None


def _resolve_backend(opts: VerifyOptions, r: VerifyRequest) -> str:
    """select_backend, except that --compile-only may name a backend with no device here."""
    requested = opts.backend if opts.backend != "auto" else (r.backend or "auto")
    if opts.compile_only and requested != "auto":
        get_backend(requested)  # unknown names still raise BackendUnavailable
        return requested
    return select_backend(requested)


def verify_batch(requests: list[VerifyRequest], options: VerifyOptions | None = None,
                 progress: Callable[[VerdictData], None] | None = None,
                 timings: dict[str, dict[str, float]] | None = None) -> list[VerdictData]:
    """Verify every request; one verdict each, in order. Raises BackendUnavailable up front.

    `progress` is called with each verdict as it is final; `timings`, when given, receives
    per-candidate collect/exec/candidate seconds (for benchmarks).
    """
    opts = options or VerifyOptions()
    names = {_resolve_backend(opts, r) for r in requests} if requests else set()
    items = []
    for r in requests:
        name = _resolve_backend(opts, r)
        items.append(_Item(r, VerdictData(r.candidate_id, r.task_id, "runtime_error", "extract",
                                          name)))
    for name in sorted(names):
        group = [it for it in items if it.verdict.backend == name]
        _verify_group(group, get_backend(name), opts, progress)
    if timings is not None:
        for it in items:
            timings[it.req.candidate_id] = dict(it.timing)
    return [it.verdict for it in items]


def _verify_group(items: list[_Item], backend: Backend, opts: VerifyOptions,
                  progress: Callable[[VerdictData], None] | None) -> None:
    cache = Path(opts.build_cache_dir) if opts.build_cache_dir else default_cache_dir() / "builds"
    lock = threading.Lock()

    def finish(item: _Item) -> None:
        item.verdict.wall_s = round(time.monotonic() - item.t0, 3)
        finalize(item.verdict)
        if progress:
            progress(item.verdict)

    for it in items:
        _front_stages(it)
    pending = [it for it in items if not it.done]
    with ThreadPoolExecutor(max(1, opts.compile_workers)) as pool:
        list(pool.map(lambda it: _collect_specs(it, opts), pending))
    for it in pending:
        if it.done:
            continue
        if not it.specs:
            it.stop("static_reject", "static", "no load_inline call ran: the candidate has no "
                                               "kernel of its own")
            continue
        cpp_findings = check_cpp(it.specs, it.code, it.req.task_source)
        if cpp_findings:
            it.verdict.findings = cpp_findings
            it.stop("static_reject", "static", "; ".join(
                f"{f['rule']}: {f['message']}" for f in cpp_findings[:3]))
    for it in items:
        if it.done:
            finish(it)
    pending = [it for it in pending if not it.done]
    if not pending:
        return
    if (backend.name == "cuda" and opts.gpu_service and not opts.compile_only
            and backend.is_available()):
        _verify_on_gpu_service(pending, opts, cache, finish)
        return

    # a CUDA/MUSA extension cannot be imported on a host without the device's torch build
    ctx = BuildContext(backend, cache, timeout_s=opts.compile_timeout_s,
                       check_import=not opts.compile_only or backend.is_available(),
                       code_of={s.key: it.code for it in pending for s in it.specs})
    unique: dict[str, ExtensionSpec] = {}
    for it in pending:
        for s in it.specs:
            unique.setdefault(s.key, s)
    ordered = sorted(unique.values(), key=lambda s: (not s.batchable, repr(_flags_key(s))))
    size = max(1, opts.compile_batch)
    chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    results: dict[str, BuildResult] = {}
    threads = 1  # one intra-op thread per worker: workers share the cores, baselines too
    slots: queue.Queue = queue.Queue()
    for slot in backend.execution_slots(opts.workers):
        slots.put(slot)
    exec_pool = ThreadPoolExecutor(max(1, slots.qsize()))
    baselines = _Baselines(opts, backend)
    futures = []

    def run_exec(it: _Item) -> None:
        slot = slots.get()
        try:
            _execute(it, backend, opts, baselines, threads, slot.env)
        except Exception as exc:  # a harness failure must still yield a verdict
            it.stop("runtime_error", "correctness", f"verifier error: {exc}")
        finally:
            slots.put(slot)
        finish(it)

    def after_build(chunk_results: dict[str, BuildResult]) -> None:
        with lock:
            results.update(chunk_results)
            ready = [it for it in pending if not it.done and not it.built
                     and all(s.key in results for s in it.specs)]
            for it in ready:
                it.built = {s.key: results[s.key] for s in it.specs}
        for it in ready:
            v = it.verdict
            v.compile_s = round(sum(r.seconds for r in it.built.values()), 3)
            failed = [r for r in it.built.values() if not r.ok]
            if failed:
                v.compile_log = "\n".join(r.log for r in failed)[-20000:]
                first = next((ln for ln in v.compile_log.splitlines() if "error" in ln),
                             v.compile_log.strip()[:300])
                it.stop("compile_error", "compile", first)
                finish(it)
            elif opts.compile_only:
                it.stop("compiled", "compile")
                finish(it)
            else:
                with lock:
                    futures.append(exec_pool.submit(run_exec, it))

    def build_chunk(chunk: list[ExtensionSpec]) -> None:
        try:
            after_build(Builder(ctx).build(chunk))
        except Exception as exc:  # keep the batch going; these specs fail with the reason
            after_build({s.key: BuildResult(s.key, False, log=f"build error: {exc}")
                         for s in chunk})

    try:
        Builder(ctx).prepare_pch(ordered)
        with ThreadPoolExecutor(max(1, opts.compile_workers)) as cpool:
            list(cpool.map(build_chunk, chunks))
        while True:
            with lock:
                waiting = [f for f in futures if not f.done()]
            if not waiting:
                break
            for f in waiting:
                f.result()
    finally:
        exec_pool.shutdown(wait=True)


# gpu_worker result keys that are verdict fields (the rest are diagnostics)
_SERVICE_FIELDS = ("status", "stage", "error", "compile_log", "trials", "max_abs_diff",
                   "mean_abs_diff", "mismatch_frac", "findings", "kernel_names", "runtime_us",
                   "runtime_iqr_us", "eager_us", "compiled_us", "speedup", "speedup_compiled",
                   "faster")


def apply_service_result(verdict: VerdictData, result: dict[str, Any]) -> None:
    """Copy a `verifier.gpu_service` result dict onto a verdict (api field names)."""
    for key in _SERVICE_FIELDS:
        if key == "findings":  # keep what the static stage recorded
            verdict.findings = [*verdict.findings, *(result.get("findings") or [])]
        elif result.get(key) is not None:
            setattr(verdict, key, result[key])
    verdict.faster = bool(result.get("faster", verdict.status == "correct_fast"))
    verdict.compile_s = round(float(result.get("compile_s") or 0.0), 3)
    if verdict.status == "compile_error" and not verdict.error:
        log = verdict.compile_log
        verdict.error = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:300])
    if result.get("gpu") is not None:
        verdict.device = f"cuda:{result['gpu']}"


def _verify_on_gpu_service(items: list[_Item], opts: VerifyOptions, cache: Path,
                           finish: Callable[[_Item], None]) -> None:
    """Compile pool + one persistent worker per GPU for items that passed the static stage."""
    from verifier.gpu_service import GpuJob, GpuService, ServiceOptions

    sopts = ServiceOptions(
        compile_workers=max(1, opts.compile_workers), compile_timeout_s=opts.compile_timeout_s,
        run_timeout_s=opts.run_timeout_s, trials=opts.trials,
        torch_compile_baseline=opts.torch_compile_baseline, fast_threshold=opts.fast_threshold,
        job_extra={"atol": opts.atol_fp32, "rtol": opts.rtol_fp32, "atol_low": opts.atol_low,
                   "rtol_low": opts.rtol_low, "seed": opts.seed})
    service = GpuService(Path(opts.baseline_cache_dir or cache) / "gpu-service", sopts)
    # ids unique within the run (the service keys results by id; requests may repeat one)
    jobs = [GpuJob(f"c{i}", it.req.task_source, it.code, it.req.task_id)
            for i, it in enumerate(items)]
    try:
        results = service.run(jobs)
    except Exception as exc:  # the service itself failed: every item still gets a verdict
        results = [{"status": "runtime_error", "stage": "correctness",
                    "error": f"verifier error (gpu service): {type(exc).__name__}: {exc}"}
                   for _ in items]
    for it, res in zip(items, results, strict=True):
        apply_service_result(it.verdict, res)
        it.done = True
        finish(it)


def verify_one(task_source: str, response: str, options: VerifyOptions | None = None,
               candidate_id: str = "candidate", task_id: str = "task") -> VerdictData:
    """Verify a single candidate (the CLI's single mode)."""
    opts = options or VerifyOptions()
    return verify_batch([VerifyRequest(candidate_id, task_id, task_source, response,
                                       opts.backend)], opts)[0]


__all__ = ["BackendUnavailable", "verify_batch", "verify_one", "default_cache_dir"]
