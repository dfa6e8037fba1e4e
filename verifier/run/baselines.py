"""Per-task reference baselines (eager and torch.compile timings), cached on disk per (task,
device), and measured ahead of the candidates while they compile.

Only processes that never ran candidate code time a baseline or write this cache: a fresh
sandboxed child that loads nothing but the reference (cpu), or on a GPU a worker that only ever
loads references, or the referee; the timing is the candidates' method: the child or the worker
serves the judge's windows with the reference as its forward (`serve_baselines`,
`verifier.judge.timed_calls.serve_baseline`); on a GPU, for a task whose input set and output
pass `verifier.run.gpu_runner.SERVED_MAX_BYTES`, the referee times them in its own process
(`verifier.judge.timed_calls.time_reference`).

On a host that runs candidates beside each other (cpu: the sandboxed children of the batch's
slots), a baseline is timed with the host to itself (`HostTurns`): timed while another slot ran
a candidate that streamed memory on its own cores, eager came out slower, and that figure was
cached for every later candidate of the task (a candidate could raise every speedup of a task
by loading the host while its baseline was timed; tests/verifier/test_redteam_round7.py).
GPU slots time their baselines on their own device: no turns there.

Compilers share the host too: a candidate that compiles slowly loads the cores while a landed
candidate's task baseline is timed (cpu), and that inflated eager would be cached and inflate
every later speedup of the task. A cpu baseline whose every timing overlapped a compiler of this
process (`verifier.backends.tool_load`) is marked `BESIDE_COMPILES` and kept in memory, never
cached; the batch re-times it once its compiles are over (`Baselines.retime`) and re-judges the
verdicts that used it before they are written (`verifier.api`); only a quiet figure is cached.

The cache key is the task source, backend, device model, torch version, timing trials and
seed, so a re-run on the same kind of device never times a reference twice. `prefetch` sends
one baseline-only job per task that has no cached entry to the execution slots as soon as they
are warm: the GPU workers would otherwise sit idle until the first build lands, and the first
candidate of each task would pay its task's timing on the critical path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from verifier.backends import Backend
from verifier.backends.tool_load import TOOL_LOAD
from verifier.judge.clock import NO_JUDGE
from verifier.judge.inputs import trial_input_seed
from verifier.protocol import VerifyOptions
from verifier.run.batch_stats import BatchStats
from verifier.run.outcome import RunOutcome

METHOD = "judge-windows-1"  # how baselines are timed: a new method never reads old entries
# cpu: the reference served to the judge's windows as a candidate is (runners.SandboxRunner);
# 3: the deducted copy is timed into as many cold slots as the window has (window_judge)
# gpu: served by a reference-only worker (`verifier.run.gpu_runner.GpuRunner.baseline`)
METHODS = {"cpu": "judge-served-windows-3", "cuda": "judge-served-windows-3",
           "musa": "judge-served-windows-3"}
TIMINGS = {"cpu": 2}  # timings of a baseline, the fastest kept (`Baselines._timed`)
TIMING_GAP_S = 0.5
# what the cache keeps; method (gpu): how eager was timed (`verifier.run.gpu_runner.GpuRunner.
# baseline`: "served" or "referee"); eager_timings_us: every timing's eager (`Baselines._timed`)
_BASELINE_KEYS = ("eager_us", "eager_iqr_us", "compiled_us", "method", "eager_timings_us")
# in figures timed while compilers of this process ran (every timing of them): never cached
BESIDE_COMPILES = "beside_compiles"
# how long a re-timing waits for this process's compilers to end (another batch's, where
# batches share a process); past it, it is timed anyway and cached only if no compiler ran
QUIET_WAIT_S = 120.0


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kernelsynth"


def baseline_path(opts: VerifyOptions, backend: Backend, task_source: str, device: str) -> Path:
    import torch

    key = hashlib.sha256("\0".join([task_source, backend.name, device, torch.__version__,
                                    str(opts.seed), METHODS.get(backend.name, METHOD)]
                                   ).encode()).hexdigest()
    base = Path(opts.baseline_cache_dir) if opts.baseline_cache_dir else (
        default_cache_dir() / "baselines")
    return base / f"{key[:24]}.json"


def baseline_forwards(backend: Backend, job_options: dict[str, Any]) -> list[str]:
    """The forwards a baseline serves to the judge's windows: eager, then its torch.compile
    where the job asks for it and the backend has one."""
    return ["eager"] + (["compiled"] if job_options.get("torch_compile_baseline")
                        and backend.torch_compile_supported() else [])


def serve_baselines(task_source: str, forwards: list[str], job: dict[str, Any],
                    run: Callable[[Any, dict[str, Any]], RunOutcome]) -> dict[str, Any] | None:
    """The reference's baselines, one baseline-only job per forward (`job` plus a fresh nonce and
    input seed) run by `run(item, job)` in a process that never runs candidate code, each timed
    by the judge's clock as a candidate's forward is; None when eager was not timed. A forward
    "" (the child times itself), or a reference no judge here can serve (`NO_JUDGE`, the child
    timed it), answers the child's own figures. The first forward that fails ends the loop."""
    item = SimpleNamespace(built={}, specs=[], code="", req=SimpleNamespace(
        task_source=task_source, task_id="baseline"))
    figures: dict[str, Any] = {}
    for forward in forwards:
        this = {**job, "nonce": secrets.token_hex(16), "input_seed": trial_input_seed(),
                "baseline_only": True, "baseline_forward": forward}
        out = run(item, this)
        p, timed = out.payload or {}, out.clock or {}
        ok = p.get("nonce") == this["nonce"] and p.get("outcome") == "baseline"
        if ok and (not forward or (timed.get("judge_error") == NO_JUDGE and "eager_us" in p)):
            return p
        got = timed.get("figures") or {}
        if not ok or not got or timed.get("failure") or timed.get("judge_error"):
            why = timed.get("failure") or timed.get("judge_error") or out.failure or "no windows"
            print(f"kernelsynth verifier: no served {forward} baseline: {why}", file=sys.stderr)
            break
        figures.update({f"{forward}_us": got["runtime_us"], f"{forward}_iqr_us": got["iqr_us"],
                        f"{forward}_windows": got})
    return figures if "eager_us" in figures else None


class HostTurns:
    """Candidate runs share the host; a baseline's timing has it alone: it waits for the runs
    in flight to end and holds new ones (and other baselines) back until it is timed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._runs = self._waiting = 0
        self._timing = False

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        """A candidate's run: beside other runs, never beside a baseline's timing."""
        with self._cond:
            self._cond.wait_for(lambda: not self._waiting and not self._timing)
            self._runs += 1
        try:
            yield
        finally:
            with self._cond:
                self._runs -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """A baseline's timing, with no run and no other baseline beside it."""
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._runs and not self._timing)
            self._waiting -= 1
            self._timing = True
        try:
            yield
        finally:
            with self._cond:
                self._timing = False
                self._cond.notify_all()


HOST_TURNS = HostTurns()  # every batch of this process: runs of one batch load another's too


class Baselines:
    """Eager / torch.compile timings per (task, device, torch version), on disk."""

    def __init__(self, opts: VerifyOptions, backend: Backend):
        self.opts, self.backend = opts, backend
        self.lock = threading.Lock()
        self.task_locks: dict[str, threading.Lock] = {}
        self.provisional: dict[str, dict[str, Any]] = {}  # task -> figures beside compiles

    @property
    def watches_compiles(self) -> bool:
        """Whether a timing beside this process's compilers is marked: where the reference is
        timed on the host's cores (no persistent GPU workers)."""
        return not self.backend.persistent_worker

    def _task_lock(self, task_source: str) -> threading.Lock:
        with self.lock:
            return self.task_locks.setdefault(task_source, threading.Lock())

    def get(self, task_source: str, device: str) -> dict[str, Any]:
        try:
            return json.loads(baseline_path(self.opts, self.backend, task_source,
                                            device).read_text())
        except (OSError, ValueError):
            return {}

    def put(self, task_source: str, device: str, data: dict[str, Any]) -> None:
        path = baseline_path(self.opts, self.backend, task_source, device)
        with self.lock:
            merged = {**self.get(task_source, device), **data}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps(merged))
            os.replace(tmp, path)

    def turn(self, baseline: bool = False) -> contextlib.AbstractContextManager[None]:
        """The host's turn for a candidate's run (`baseline`: a baseline's timing, alone), where
        runs share the host's cores (no persistent GPU workers)."""
        if self.backend.persistent_worker:
            return contextlib.nullcontext()
        return HOST_TURNS.alone() if baseline else HOST_TURNS.run()

    def complete(self, task_source: str, device: str) -> bool:
        """Whether every baseline these options ask for is cached."""
        have = self.get(task_source, device)
        return "eager_us" in have and (not self.opts.torch_compile_baseline
                                       or "compiled_us" in have)

    def ensure(self, task_source: str, runner: Any, job_options: dict[str, Any]
               ) -> dict[str, Any]:
        """The task's baselines: cached, else timed now by the slot's trusted process
        (`runner.baseline`, never a process that ran candidate code) and cached; {} when the
        reference cannot be timed."""
        device = self.backend.baseline_key()
        with self._task_lock(task_source):  # one timing per task, however many candidates wait
            if not self.complete(task_source, device):
                if task_source in self.provisional:  # timed again when the compiles are over
                    return _kept(self.provisional[task_source])
                figures = self._timed(task_source, runner, job_options)
                if figures and figures.get(BESIDE_COMPILES):
                    self.provisional[task_source] = figures
                    return _kept(figures)
                if figures:
                    self.put(task_source, device, _kept(figures))
            return self.get(task_source, device)

    def retime(self, task_source: str, runner: Any, job_options: dict[str, Any],
               quiet_wait_s: float = QUIET_WAIT_S) -> dict[str, Any]:
        """A baseline `ensure` answered `BESIDE_COMPILES`, timed again once no compiler of this
        process runs (waiting at most `quiet_wait_s`): a quiet figure is cached and answered;
        one that compilers overlapped again gives the faster of both, still marked, not cached."""
        device = self.backend.baseline_key()
        with self._task_lock(task_source):
            old = self.provisional.get(task_source)
            if old is None or self.complete(task_source, device):
                self.provisional.pop(task_source, None)
                return self.get(task_source, device)
            TOOL_LOAD.wait_quiet(quiet_wait_s)
            figures = self._timed(task_source, runner, job_options)
            if figures and not figures.get(BESIDE_COMPILES):
                del self.provisional[task_source]
                self.put(task_source, device, _kept(figures))
                return self.get(task_source, device)
            if figures:
                _take_faster(old, figures)
            return _kept(old)

    def _timed(self, task_source: str, runner: Any, job_options: dict[str, Any]
               ) -> dict[str, Any] | None:
        """The baselines timed `TIMINGS[backend]` times, each in its own turn, the fastest
        kept (load only slows a timing; a default cpu build cached eagers 2-8x slow, timed
        while compiles loaded both cores: 644 vs 135 us, 1869 vs 231, and labelled kernels
        4.6-9.4x that were 1.2-2.9x), with every timing's eager in `eager_timings_us`."""
        best: dict[str, Any] | None = None
        seen: list[float] = []
        beside = self.watches_compiles
        for i in range(TIMINGS.get(self.backend.name, 1)):
            if i:
                time.sleep(TIMING_GAP_S)  # a burst of load is less likely to span both
            with self.turn(baseline=True):
                mark = TOOL_LOAD.mark()
                figures = runner.baseline(task_source, job_options)
                loaded = TOOL_LOAD.ran_since(mark)
            if not figures or "eager_us" not in figures:
                break
            beside = beside and loaded  # one quiet timing bounds the fastest: load only slows
            seen.append(float(figures["eager_us"]))
            if best is None:
                best = figures
                continue
            _take_faster(best, figures)
        if best is not None:
            best["eager_timings_us"] = seen
            best.pop(BESIDE_COMPILES, None)
            if beside:
                best[BESIDE_COMPILES] = True
        return best


def _take_faster(best: dict[str, Any], figures: dict[str, Any]) -> None:
    """Into `best`, each baseline of `figures` that is faster (with its spread)."""
    for key, spread in (("eager_us", "eager_iqr_us"), ("compiled_us", None)):
        if key in figures and figures[key] < best.get(key, float("inf")):
            best[key] = figures[key]
            if spread and spread in figures:
                best[spread] = figures[spread]


def _kept(figures: dict[str, Any]) -> dict[str, Any]:
    """What a caller (and the cache, which never sees `BESIDE_COMPILES`) keeps of figures."""
    return {k: figures[k] for k in (*_BASELINE_KEYS, BESIDE_COMPILES) if k in figures}


def prefetch(task_sources: list[str], backend: Backend, opts: VerifyOptions,
             baselines: Baselines, slots: queue.Queue, lanes: dict[int, str],
             job_options: dict[str, Any], stats: BatchStats, stop: threading.Event) -> None:
    """Measure the baselines of `task_sources` (in order) on the execution slots, one job each,
    skipping tasks already cached; stops early when `stop` is set (the batch is over)."""
    device = backend.baseline_key()
    for src in dict.fromkeys(task_sources):
        if stop.is_set():
            return
        if baselines.complete(src, device):
            stats.count("baseline_cache_hits")
            continue
        runner = slots.get()
        if stop.is_set():
            slots.put(runner)
            return
        getattr(runner, "wait_ready", lambda: None)()
        start = time.monotonic()
        try:
            if baselines.ensure(src, runner, job_options):
                stats.count("baselines_prefetched")
        finally:
            stats.add("baseline", start, time.monotonic(), lanes.get(id(runner), ""))
            slots.put(runner)
