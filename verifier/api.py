"""The verifier's Python API: `verify_batch(requests, options) -> verdicts`.

Stages per candidate: extract and static checks in the caller (pure Python, fast); extension
specs from literal arguments or a sandboxed collect run; C++ static checks; batch builds on a
compile pool (threads driving compiler processes, `options.compile_workers` at a time, many
candidates per translation unit, load-checked); as soon as all of a candidate's extensions are
built it goes to an execution slot, so execution overlaps compilation and devices never wait for
the compiler. Slots: on cpu (and musa) `options.workers` sandboxed children, one per candidate,
forked from `verifier.forkserver` (torch imported once); on cuda one persistent worker per GPU
(`verifier.gpu_worker`, replaced after a failure). Both run `verifier.worker.run_job`. Status,
reward and feedback are decided here from what the workers measured.
"""

from __future__ import annotations

import queue
import secrets
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifier.backends import Backend, BackendUnavailable, get_backend, select_backend
from verifier.baselines import Baselines, default_cache_dir, prefetch
from verifier.batch_stats import BatchStats
from verifier.build import BuildContext, Builder, BuildResult, _flags_key, candidate_log
from verifier.cache_bound import build_lease, trim
from verifier.compile_plan import compile_all
from verifier.decide import parent_check
from verifier.extract import FormatError, check_candidate, extract_code
from verifier.extspec import ExtensionSpec, specs_from_source
from verifier.fallback import apply_policy, errors
from verifier.forkserver import ForkServer, ForkServerError
from verifier.generalize import record_generalisation, request_variants
from verifier.inputs import trial_input_seed
from verifier.performance import judge_performance
from verifier.protocol import VerdictData, VerifyOptions, VerifyRequest
from verifier.reward import finalize, record_share
from verifier.runners import _FLOOD_BYTES, _GpuRunner, _SandboxRunner
from verifier.sandbox import Launcher, SandboxLimits, SpawnLauncher
from verifier.stale_cgroups import reap_stale_cgroups
from verifier.static import check_cpp, check_python


@dataclass
class _Item:
    req: VerifyRequest
    verdict: VerdictData
    code: str = ""
    specs: list[ExtensionSpec] = field(default_factory=list)
    built: dict[str, BuildResult] = field(default_factory=dict)
    done: bool = False
    t0: float = field(default_factory=time.monotonic)
    timing: dict[str, Any] = field(default_factory=dict)  # collect/compile/exec seconds

    def stop(self, status: str, stage: str, error: str = "") -> None:
        self.verdict.status, self.verdict.stage = status, stage
        if error:
            self.verdict.error = error[:4000]
        self.done = True


def _collect_specs(item: _Item, opts: VerifyOptions, launcher: Launcher) -> None:
    """Fill item.specs from literals, else by running the module in a collect sandbox."""
    specs = specs_from_source(item.code)
    if specs is not None:
        item.specs = specs
        return
    t0 = time.monotonic()
    res = launcher.run_module("verifier.collect",
                              limits=SandboxLimits(timeout_s=min(opts.run_timeout_s, 60.0),
                                                   memory_mb=opts.memory_limit_mb),
                              input_files={"candidate.py": item.code,
                                           "task.py": item.req.task_source})
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


_JOB_OPTIONS = ("trials", "atol_fp32", "rtol_fp32", "atol_low", "rtol_low", "perf_trials",
                "perf_max_trials", "perf_budget_s", "perf_target_rel_iqr", "perf_warmup",
                "repeat_timing", "torch_compile_baseline", "seed", "fallback", "namespace")


_TIMING_DIAGNOSTICS = ("candidate_s", "timing_cv", "timing_trials", "timing_method", "hidden_us",
                      "repeat_medians_us", "repeat_cv", "tolerance", "worker_pid",
                      "spin_us", "host_us", "uncovered_trials", "discarded_trials", "clock_mhz",
                      "worker_device", "phase_s")


def _execute(item: _Item, backend: Backend, opts: VerifyOptions, baselines: Baselines,
             runner: _SandboxRunner | _GpuRunner) -> None:
    """Run the correctness and performance stages for one candidate on one execution slot."""
    v = item.verdict
    job_options = {k: getattr(opts, k) for k in _JOB_OPTIONS}
    # timed in a process that never ran candidate code, before this candidate runs
    base = baselines.ensure(item.req.task_source, runner, job_options)
    nonce = secrets.token_hex(16)
    job = {"nonce": nonce, "backend": backend.name, "input_seed": trial_input_seed(),
           "options": job_options}
    variants = request_variants(item.req, opts)
    job["variants"] = variants
    out = runner.run(item, job)
    item.timing["exec_s"] = out.wall_s
    item.timing["exec_end"] = time.monotonic()  # run order (builds land in any order)
    p = out.payload
    if out.does_not_fit:  # the task's footprint, before the candidate ran
        return item.stop("does_not_fit", "correctness", out.does_not_fit)
    for key in _TIMING_DIAGNOSTICS:  # for benchmarks (verify_batch's `timings`)
        if p and p.get(key) is not None:
            item.timing[key] = p[key]
    stage = out.stage
    if out.flood:
        return item.stop("runtime_error", stage, "the candidate flooded stdout/stderr (over "
                         f"{_FLOOD_BYTES >> 20} MB); output is capped and the run was ended")
    if out.timed_out:
        return item.stop("timeout", stage, f"{stage} stage {out.failure}")
    if p is None:
        return item.stop("runtime_error", stage, out.failure)
    if p.get("nonce") != nonce:
        v.findings.append({"rule": "forged_result", "message": "the result was not written by "
                           "the harness", "line": None, "severity": "error"})
        return item.stop("cheat", stage, "the candidate wrote the harness's result")
    _record_measurements(v, p)
    outcome = p.get("outcome")
    if outcome != "ok":
        if outcome == "task_error":
            return item.stop("runtime_error", p.get("stage", stage),
                             "task error (not the candidate's): " + p.get("error", ""))
        return item.stop(outcome if outcome in ("runtime_error", "incorrect", "cheat")
                         else "runtime_error", p.get("stage", stage), p.get("error", ""))
    if out.rechecked:  # the worker's "ok" is not believed: the parent compares the outputs
        verdict, why = parent_check(out, item.req.task_source, opts, job, variants, p)
        item.timing["referee_s"] = out.referee_s  # the benchmarks' profile
        if verdict == "cheat":
            v.findings.append({"rule": "parent_check", "message": why, "line": None,
                               "severity": "error"})
        if verdict != "ok":
            return item.stop(verdict, "correctness", why)
    record_generalisation(v, variants, p.get("variants_checked"))
    item.timing["judge_clock"] = (out.clock or {}).get("figures")
    item.timing["referee_s"] = out.referee_s
    status, why = judge_performance(v, opts, out.clock, base, runner.peaks(),
                                    item.req.flops, item.req.bytes_moved)
    item.stop(status, "done" if status.startswith("correct") else "performance", why)


def _record_measurements(v: VerdictData, p: dict[str, Any]) -> None:
    """Copy what the worker measured onto the verdict (also for failed candidates)."""
    v.device = p.get("device", v.device)
    v.trials = int(p.get("trials", 0))
    for k in ("max_abs_diff", "mean_abs_diff", "mismatch_frac"):
        if p.get(k) is not None:
            setattr(v, k, float(p[k]))
    v.findings.extend(p.get("findings", []))
    v.kernel_names = [str(k) for k in p.get("kernel_names", [])]
    record_share(v, p.get("own_share"), p.get("own_calls"))


def _front_stages(item: _Item, policy: str = "strict", namespace: str = "isolated") -> None:
    """extract and static (Python) in the caller."""
    try:
        item.code = extract_code(item.req.response)
        tree = check_candidate(item.code, item.req.task_source)
    except FormatError as exc:
        return item.stop("format_error", "extract", str(exc))
    findings = apply_policy(check_python(tree, item.req.task_source, namespace), policy)
    item.verdict.findings = findings
    if errors(findings):
        return item.stop("static_reject", "static", "; ".join(
            f"{f['rule']}: {f['message']}" for f in errors(findings)[:3]))
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


def build_cache(opts: VerifyOptions) -> Path:
    """The build cache directory (all toolchain roots) of these options."""
    return Path(opts.build_cache_dir) if opts.build_cache_dir else default_cache_dir() / "builds"


def verify_batch(requests: list[VerifyRequest], options: VerifyOptions | None = None,
                 progress: Callable[[VerdictData], None] | None = None,
                 timings: dict[str, dict[str, float]] | None = None,
                 stats: dict[str, Any] | None = None) -> list[VerdictData]:
    """Verify every request; one verdict each, in order. Raises BackendUnavailable up front.

    `progress` is called with each verdict as it is final; `timings`, when given, receives
    per-candidate collect/compile/exec/candidate seconds, and `stats` where the batch's wall
    time went (`verifier.batch_stats`; for benchmarks).
    """
    opts = options or VerifyOptions()
    record = BatchStats()
    names = {_resolve_backend(opts, r) for r in requests} if requests else set()
    items = []
    for r in requests:
        name = _resolve_backend(opts, r)
        items.append(_Item(r, VerdictData(r.candidate_id, r.task_id, "runtime_error", "extract",
                                          name, tolerance_policy=opts.tolerance_policy())))
    if items:  # cgroups of a verifier that was killed before it could remove them
        record.count("stale_cgroups_removed", len(reap_stale_cgroups()))
    server = ForkServer() if opts.fork_server and items else None
    try:
        with build_lease(build_cache(opts)):  # what this batch uses stays in the cache
            for name in sorted(names):
                group = [it for it in items if it.verdict.backend == name]
                _verify_group(group, get_backend(name), opts, progress, server, record)
    finally:
        if server is not None:
            server.close()
    if opts.build_cache_max_gb > 0:
        try:
            record.count("build_cache_evicted", len(trim([build_cache(opts)],
                                                         int(opts.build_cache_max_gb * 2**30))))
        except OSError as exc:  # the verdicts stand; the cache stays as it is
            print(f"kernelsynth verifier: build cache not trimmed: {exc}", file=sys.stderr)
    if timings is not None:
        for it in items:
            timings[it.req.candidate_id] = dict(it.timing)
    if stats is not None:
        stats.update(record.summary())
    return [it.verdict for it in items]


class _ForkOrSpawn:
    """The fork server while it works, else a fresh interpreter per run (said once on stderr).

    `device_safe`: runs that may initialize the device (a candidate module's top level in a
    collect run) fork only when the server's children can still initialize CUDA; load checks
    only import a shared object and fork regardless.
    """

    def __init__(self, server: ForkServer | None, device_safe: bool) -> None:
        self.server, self.spawn = server, SpawnLauncher()
        self.device_safe = device_safe
        self.lock = threading.Lock()

    def _server(self) -> ForkServer | None:
        with self.lock:
            if self.server is None:
                return None
            try:
                self.server.start()
            except ForkServerError as exc:
                print(f"kernelsynth verifier: {exc}; starting a fresh interpreter per run "
                      "instead", file=sys.stderr)
                self.server = None
                return None
            if self.device_safe and not self.server.cuda_fork_safe:
                return None
            return self.server

    def run_module(self, entry: str, **kwargs: Any) -> Any:
        server = self._server()
        if server is not None:
            return server.run_module(entry, **kwargs)
        return self.spawn.run_module(entry, **kwargs)


def _verify_group(items: list[_Item], backend: Backend, opts: VerifyOptions,
                  progress: Callable[[VerdictData], None] | None,
                  server: ForkServer | None, stats: BatchStats) -> None:
    cache = build_cache(opts)
    lock = threading.Lock()
    persistent = backend.persistent_worker and not opts.compile_only
    # cpu children, collect runs and load checks are forked; cuda candidates run in GPU workers
    launcher = _ForkOrSpawn(server if backend.fork_safe else None, device_safe=False)
    collect_launcher = _ForkOrSpawn(server if backend.fork_safe else None,
                                    device_safe=backend.name != "cpu")

    def finish(item: _Item) -> None:
        item.verdict.wall_s = round(time.monotonic() - item.t0, 3)
        finalize(item.verdict, opts.fallback)
        if progress:
            progress(item.verdict)

    with stats.span("front"):
        for it in items:
            _front_stages(it, opts.fallback, opts.namespace)
    pending = [it for it in items if not it.done]
    slots: queue.Queue = queue.Queue()
    runners: list[_SandboxRunner | _GpuRunner] = []
    lanes: dict[int, str] = {}  # id(runner) -> its slot's name (profile lanes)
    if pending and not opts.compile_only:
        chosen = backend.execution_slots(opts.workers)
        if persistent and opts.gpus > 0:  # one worker per GPU: use only the first `gpus`
            chosen = chosen[:opts.gpus]
        for slot in chosen:
            runner: _SandboxRunner | _GpuRunner = (
                _GpuRunner(opts, slot.env, backend.name,
                           opts.standby_workers if opts.standby_worker else 0) if persistent else
                _SandboxRunner(launcher, backend, opts, slot.env, threads=1))
            runners.append(runner)
            lanes[id(runner)] = slot.label
            slots.put(runner)

    def warm(r: _GpuRunner) -> None:
        with stats.span("worker_start", lanes[id(r)]):
            r.warm()

    warmers = [threading.Thread(target=warm, args=(r,), daemon=True) for r in runners
               if isinstance(r, _GpuRunner)]
    for t in warmers:  # GPU workers start (torch, CUDA, profiler) while candidates compile
        t.start()
    try:
        _build_and_run(pending, items, backend, opts, cache, lock, slots,
                       (launcher, collect_launcher), finish, stats, lanes)
    finally:
        for t in warmers:
            t.join()
        for r in runners:
            r.close()
            stats.count("worker replaced by its standby", getattr(r, "swaps", 0))


def _build_and_run(pending: list[_Item], items: list[_Item], backend: Backend,
                   opts: VerifyOptions, cache: Path, lock: threading.Lock, slots: queue.Queue,
                   launchers: tuple[_ForkOrSpawn, _ForkOrSpawn],
                   finish: Callable[[_Item], None], stats: BatchStats,
                   lanes: dict[int, str]) -> None:
    launcher, collect_launcher = launchers
    with stats.span("collect"), ThreadPoolExecutor(max(1, opts.compile_workers)) as pool:
        list(pool.map(lambda it: _collect_specs(it, opts, collect_launcher), pending))
    t_static = time.monotonic()
    for it in pending:
        if it.done:
            continue
        if not it.specs:
            it.stop("static_reject", "static", "no load_inline call ran: the candidate has no "
                                               "kernel of its own")
            continue
        cpp_findings = apply_policy(check_cpp(it.specs, it.code, it.req.task_source),
                                    opts.fallback)
        it.verdict.findings = it.verdict.findings + cpp_findings
        if errors(cpp_findings):
            it.stop("static_reject", "static", "; ".join(
                f"{f['rule']}: {f['message']}" for f in errors(cpp_findings)[:3]))
    stats.add("cpp_static", t_static, time.monotonic())
    for it in items:
        if it.done:
            finish(it)
    pending = [it for it in pending if not it.done]
    if not pending:
        return

    # a CUDA/MUSA extension cannot be imported on a host without the device's torch build
    ctx = BuildContext(backend, cache, timeout_s=opts.compile_timeout_s,
                       check_import=not opts.compile_only or backend.is_available(),
                       launcher=launcher,
                       load_memory_mb=min(backend.sandbox_memory_mb(opts.memory_limit_mb),
                                          4096) or 0)
    unique: dict[str, ExtensionSpec] = {}
    for it in pending:
        for s in it.specs:
            unique.setdefault(s.key, s)
    ordered = sorted(unique.values(), key=lambda s: (not s.batchable, repr(_flags_key(s))))
    workers = max(1, opts.compile_workers)
    results: dict[str, BuildResult] = {}
    exec_pool = ThreadPoolExecutor(max(1, slots.qsize()))
    baselines = Baselines(opts, backend)
    futures = []
    stop_prefetch, prefetcher = threading.Event(), None
    if backend.persistent_worker and slots.qsize():  # GPU workers idle until a build lands
        tasks = [it.req.task_source for s in ordered for it in pending if s in it.specs]
        prefetcher = threading.Thread(target=prefetch, daemon=True, args=(
            tasks, backend, opts, baselines, slots, lanes,
            {k: getattr(opts, k) for k in _JOB_OPTIONS}, stats, stop_prefetch))
        prefetcher.start()

    def run_exec(it: _Item, landed: float) -> None:  # landed: when its build was ready
        runner = slots.get()
        getattr(runner, "wait_ready", lambda: None)()  # a GPU worker still starting
        start = time.monotonic()
        stats.add("exec_wait", landed, start)
        try:
            _execute(it, backend, opts, baselines, runner)
        except Exception as exc:  # a harness failure must still yield a verdict
            it.stop("runtime_error", "correctness", f"verifier error: {exc}")
        finally:
            stats.add("exec", start, time.monotonic(), lanes.get(id(runner), ""))
            slots.put(runner)
        for phase, secs in (it.timing.get("phase_s") or {}).items():
            stats.count(f"worker {phase} s", float(secs))
        if it.timing.get("referee_s"):
            stats.count("referee s", float(it.timing["referee_s"]))
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
            it.timing["compile_s"] = v.compile_s
            failed = [r for r in it.built.values() if not r.ok]
            if failed:
                spec_of = {s.key: s for s in it.specs}  # each log at this candidate's lines
                v.compile_log = "\n".join(candidate_log(r.log, spec_of[r.key], it.code)
                                          for r in failed)[-20000:]
                first = next((ln for ln in v.compile_log.splitlines() if "error" in ln),
                             v.compile_log.strip()[:300])
                it.stop("compile_error", "compile", first)
                finish(it)
            elif opts.compile_only:
                it.stop("compiled", "compile")
                finish(it)
            else:
                with lock:
                    futures.append(exec_pool.submit(run_exec, it, time.monotonic()))

    try:  # units longest first on `workers` threads; each spec lands as soon as it is final
        units, records = compile_all(Builder(ctx), ordered, workers, opts.compile_batch,
                                     after_build, pch_span=lambda a, b: stats.add("pch", a, b))
        stats.count("compile_units_planned", len(units))
        stats.count("compile_rebuilds", sum(r.rebuild for r in records))
        for r in records:
            stats.add("compile", r.start, r.end, r.worker)
        while True:
            with lock:
                waiting = [f for f in futures if not f.done()]
            if not waiting:
                break
            for f in waiting:
                f.result()
    finally:
        exec_pool.shutdown(wait=True)
        stop_prefetch.set()
        if prefetcher is not None:
            prefetcher.join()


def verify_one(task_source: str, response: str, options: VerifyOptions | None = None,
               candidate_id: str = "candidate", task_id: str = "task") -> VerdictData:
    """Verify a single candidate (the CLI's single mode)."""
    opts = options or VerifyOptions()
    return verify_batch([VerifyRequest(candidate_id, task_id, task_source, response,
                                       opts.backend)], opts)[0]


__all__ = ["BackendUnavailable", "verify_batch", "verify_one", "default_cache_dir"]
