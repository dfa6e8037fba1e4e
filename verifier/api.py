"""The verifier's Python API: `verify_batch(requests, options) -> verdicts`.

Stages per candidate: extract and static checks in the caller (pure Python, fast); extension
specs from literal arguments or a sandboxed collect run; C++ static checks; batch builds on a
compile pool (threads driving compiler processes, `options.compile_workers` at a time, many
candidates per translation unit, load-checked); as soon as all of a candidate's extensions are
built it goes to an execution slot, so execution overlaps compilation and devices never wait for
the compiler. Slots: on cpu (and musa) `options.workers` sandboxed children, one per candidate,
forked from `verifier.run.forkserver` (torch imported once); on cuda one persistent worker per GPU
(`verifier.run.gpu_worker`, replaced after a failure). Both run `verifier.run.worker.run_job`. Status,
reward and feedback are decided here from what the workers measured.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from verifier.backends import (
    Backend,
    BackendUnavailable,
    compile_cpus,
    get_backend,
    select_backend,
)
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.builder import BuildContext, Builder, BuildResult, candidate_log, flags_key
from verifier.compile.cache_bound import build_lease, trim
from verifier.compile.compile_plan import compile_all
from verifier.isolation.cpu_bound import compile_cores
from verifier.isolation.sandbox import SpawnLauncher
from verifier.isolation.stale_cgroups import reap_stale_cgroups
from verifier.judge.construct import HOST
from verifier.judge.performance import judge_speed
from verifier.judge.reward import finalize
from verifier.protocol import CORRECT_STATUSES, VerdictData, VerifyOptions, VerifyRequest
from verifier.run.baselines import BESIDE_COMPILES, Baselines, default_cache_dir, prefetch
from verifier.run.batch_stats import BatchStats
from verifier.run.forkserver import ForkServer, ForkServerError
from verifier.run.gpu_runner import GpuRunner
from verifier.run.runners import SandboxRunner
from verifier.stages import (
    JOB_OPTIONS,
    Item,
    collect_specs,
    cpp_stage,
    execute,
    front_stages,
)


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


CPU_STANDBYS = 3  # the cpu loop's spares at most: one starts in ~3 s (a GPU worker: ~12 s)


def _standbys(opts: VerifyOptions, backend: str) -> int:
    spares = opts.standby_workers if opts.standby_worker else 0
    return min(spares, CPU_STANDBYS) if backend == "cpu" else spares


def verify_batch(requests: list[VerifyRequest], options: VerifyOptions | None = None,
                 progress: Callable[[VerdictData], None] | None = None,
                 timings: dict[str, dict[str, float]] | None = None,
                 stats: dict[str, Any] | None = None) -> list[VerdictData]:
    """Verify every request; one verdict each, in order. Raises BackendUnavailable up front.

    `progress` is called with each verdict as it is final; `timings`, when given, receives
    per-candidate collect/compile/exec/candidate seconds, and `stats` where the batch's wall
    time went (`verifier.run.batch_stats`; for benchmarks).
    """
    opts = options or VerifyOptions()
    record = BatchStats()
    names = {_resolve_backend(opts, r) for r in requests} if requests else set()
    items = []
    for r in requests:
        name = _resolve_backend(opts, r)
        items.append(Item(r, VerdictData(r.candidate_id, r.task_id, "runtime_error", "extract",
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


def _verify_group(items: list[Item], backend: Backend, opts: VerifyOptions,
                  progress: Callable[[VerdictData], None] | None,
                  server: ForkServer | None, stats: BatchStats) -> None:
    cache = build_cache(opts)
    lock = threading.Lock()
    persistent = backend.persistent_worker and not opts.compile_only
    # cpu children, collect runs and load checks are forked; cuda candidates run in GPU workers
    launcher = _ForkOrSpawn(server if backend.fork_safe else None, device_safe=False)
    collect_launcher = _ForkOrSpawn(server if backend.fork_safe else None,
                                    device_safe=backend.name != "cpu")

    def finish(item: Item) -> None:
        item.verdict.wall_s = round(time.monotonic() - item.t0, 3)
        finalize(item.verdict, opts.fallback)
        if progress:
            progress(item.verdict)

    with stats.span("front"):
        for it in items:
            front_stages(it, opts.fallback, opts.namespace)
    pending = [it for it in items if not it.done]
    slots: queue.Queue = queue.Queue()
    runners: list[SandboxRunner | GpuRunner] = []
    lanes: dict[int, str] = {}  # id(runner) -> its slot's name (profile lanes)
    if pending and not opts.compile_only:
        chosen = backend.execution_slots(opts.workers)
        if persistent and opts.gpus > 0:  # one worker per GPU: use only the first `gpus`
            chosen = chosen[:opts.gpus]
        for slot in chosen:
            runner: SandboxRunner | GpuRunner = (
                GpuRunner(opts, slot.env, backend.name, _standbys(opts, backend.name))
                if persistent else
                SandboxRunner(launcher, backend, opts, slot.env, threads=1))
            runners.append(runner)
            lanes[id(runner)] = slot.label
            slots.put(runner)

    def warm(r: GpuRunner) -> None:
        with stats.span("worker_start", lanes[id(r)]):
            r.warm()

    warmers = [threading.Thread(target=warm, args=(r,), daemon=True) for r in runners
               if isinstance(r, GpuRunner)]
    for t in warmers:  # GPU workers start (torch, CUDA, profiler) while candidates compile
        t.start()
    gpu_lanes = sum(isinstance(r, GpuRunner) for r in runners)
    try:  # the compilers keep off the cores the GPU lanes' launches and clocks need
        with compile_cpus(compile_cores(gpu_lanes) if gpu_lanes else None):
            _build_and_run(pending, items, backend, opts, cache, lock, slots,
                           (launcher, collect_launcher), finish, stats, lanes)
    finally:
        for t in warmers:
            t.join()
        for r in runners:
            r.close()
            stats.count("worker replaced by its standby", getattr(r, "swaps", 0))
            stats.count("runs confirmed in a fresh worker", getattr(r, "confirmations", 0))


def _build_and_run(pending: list[Item], items: list[Item], backend: Backend,
                   opts: VerifyOptions, cache: Path, lock: threading.Lock, slots: queue.Queue,
                   launchers: tuple[_ForkOrSpawn, _ForkOrSpawn],
                   finish: Callable[[Item], None], stats: BatchStats,
                   lanes: dict[int, str]) -> None:
    launcher, collect_launcher = launchers
    with stats.span("collect"), ThreadPoolExecutor(max(1, opts.compile_workers)) as pool:
        list(pool.map(lambda it: collect_specs(it, opts, collect_launcher), pending))
    t_static = time.monotonic()
    for it in pending:
        if not it.done:
            cpp_stage(it, opts)
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
    ordered = sorted(unique.values(), key=lambda s: (not s.batchable, repr(flags_key(s))))
    run = _Landings(pending, backend, opts, lock, slots, finish, stats, lanes)
    run.prefetch([it.req.task_source for s in ordered for it in pending if s in it.specs])
    try:  # units longest first on `workers` threads; each spec lands as soon as it is final
        units, records = compile_all(Builder(ctx), ordered, max(1, opts.compile_workers),
                                     opts.compile_batch, run.after_build,
                                     pch_span=lambda a, b: stats.add("pch", a, b))
        stats.count("compile_units_planned", len(units))
        stats.count("compile_rebuilds", sum(r.rebuild for r in records))
        for r in records:
            stats.add("compile", r.start, r.end, r.worker)
        run.wait()
        run.settle()
    finally:
        run.close()


class _Landings:
    """Candidates whose builds have landed: each goes to an execution slot as soon as all of
    its extensions are built (a compile error or `compile_only` ends it there)."""

    def __init__(self, pending: list[Item], backend: Backend, opts: VerifyOptions,
                 lock: threading.Lock, slots: queue.Queue, finish: Callable[[Item], None],
                 stats: BatchStats, lanes: dict[int, str]) -> None:
        self.pending, self.backend, self.opts, self.lock = pending, backend, opts, lock
        self.slots, self.finish, self.stats, self.lanes = slots, finish, stats, lanes
        self.results: dict[str, BuildResult] = {}
        self.exec_pool = ThreadPoolExecutor(max(1, slots.qsize()))
        self.baselines = Baselines(opts, backend)
        self.futures: list[Any] = []
        self.stop_prefetch, self.prefetcher = threading.Event(), None
        self.held: list[Item] = []  # verdicts whose baseline was timed beside compiles

    def prefetch(self, tasks: list[str]) -> None:
        """GPU workers idle until a build lands: the tasks' baselines meanwhile."""
        if self.backend.persistent_worker and self.slots.qsize():
            self.prefetcher = threading.Thread(target=prefetch, daemon=True, args=(
                tasks, self.backend, self.opts, self.baselines, self.slots, self.lanes,
                {k: getattr(self.opts, k) for k in JOB_OPTIONS}, self.stats,
                self.stop_prefetch))
            self.prefetcher.start()

    def run_exec(self, it: Item, landed: float) -> None:  # landed: when its build was ready
        """Run one built candidate on the next free slot."""
        stats = self.stats
        runner = self.slots.get()
        getattr(runner, "wait_ready", lambda: None)()  # a GPU worker still starting
        start = time.monotonic()
        stats.add("exec_wait", landed, start)
        try:
            execute(it, self.backend, self.opts, self.baselines, runner)
        except Exception as exc:  # a harness failure must still yield a verdict
            it.stop("runtime_error", "correctness", f"verifier error: {exc}")
        finally:
            stats.add("exec", start, time.monotonic(), self.lanes.get(id(runner), ""))
            self.slots.put(runner)
        for phase, secs in (it.timing.get("phase_s") or {}).items():
            stats.count(f"worker {phase} s", float(secs))
        for step, secs in (it.timing.get("spans") or {}).items():
            stats.count(f"slot {step} s", float(secs))
        if it.timing.get("referee_s"):
            stats.count("referee s", float(it.timing["referee_s"]))
        if it.timing.get("construct") == HOST:  # `verifier.judge.construct`'s second run
            stats.count("runs built on the host")
        if it.provisional_base and it.verdict.status in CORRECT_STATUSES:
            with self.lock:  # its speedup waits for a quiet baseline (`settle`)
                self.held.append(it)
            return
        self.finish(it)

    def settle(self) -> None:
        """The held verdicts, re-judged and written: their tasks' baselines timed again now that
        the batch's compiles and runs are over (`verifier.run.baselines.Baselines.retime`)."""
        job_options = {k: getattr(self.opts, k) for k in JOB_OPTIONS}
        with self.lock:
            held, self.held = self.held, []
        for task in dict.fromkeys(it.req.task_source for it in held):
            mine = [it for it in held if it.req.task_source == task]
            base: dict[str, Any] = {}
            runner = self.slots.get()
            try:
                base = self.baselines.retime(task, runner, job_options)
                self.stats.count("baselines re-timed after the compiles")
            except Exception as exc:  # the verdicts keep the first figure; never unwritten
                print(f"kernelsynth verifier: baseline not re-timed: {exc}", file=sys.stderr)
            finally:
                self.slots.put(runner)
            for it in mine:
                if base.get("eager_us"):
                    it.verdict.status = judge_speed(it.verdict, self.opts, base)
                self._finish_held(it, loaded=not base.get("eager_us")
                                  or bool(base.get(BESIDE_COMPILES)))

    def _finish_held(self, it: Item, loaded: bool) -> None:
        """Write a held verdict; `loaded`: its speedup is still from a baseline timed while
        compilers ran (said in an info finding)."""
        if loaded:
            it.verdict.findings.append({
                "rule": "baseline_beside_compiles", "severity": "info", "line": None,
                "message": "the task's baseline was timed while compilers ran"})
        self.finish(it)

    def after_build(self, chunk_results: dict[str, BuildResult]) -> None:
        """Specs that are final: every candidate they complete ends or goes to a slot."""
        with self.lock:
            self.results.update(chunk_results)
            ready = [it for it in self.pending if not it.done and not it.built
                     and all(s.key in self.results for s in it.specs)]
            for it in ready:
                it.built = {s.key: self.results[s.key] for s in it.specs}
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
                self.finish(it)
            elif self.opts.compile_only:
                it.stop("compiled", "compile")
                self.finish(it)
            else:
                with self.lock:
                    self.futures.append(self.exec_pool.submit(self.run_exec, it,
                                                              time.monotonic()))

    def wait(self) -> None:
        """Until every submitted run has ended (runs submit no others, builds may)."""
        while True:
            with self.lock:
                waiting = [f for f in self.futures if not f.done()]
            if not waiting:
                break
            for f in waiting:
                f.result()

    def close(self) -> None:
        self.exec_pool.shutdown(wait=True)
        with self.lock:  # a batch that failed before `settle`: as judged, never unwritten
            held, self.held = self.held, []
        for it in held:
            self._finish_held(it, loaded=True)
        self.stop_prefetch.set()
        if self.prefetcher is not None:
            self.prefetcher.join()


def verify_one(task_source: str, response: str, options: VerifyOptions | None = None,
               candidate_id: str = "candidate", task_id: str = "task") -> VerdictData:
    """Verify a single candidate (the CLI's single mode)."""
    opts = options or VerifyOptions()
    return verify_batch([VerifyRequest(candidate_id, task_id, task_source, response,
                                       opts.backend)], opts)[0]


__all__ = ["BackendUnavailable", "verify_batch", "verify_one", "default_cache_dir"]
