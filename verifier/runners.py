"""Execution slots of `verifier.api`: a sandboxed child per candidate (cpu, musa) or a persistent
GPU worker (cuda). Both return a `RunOutcome`: the worker's measurements, its raw trial outputs
for the parent's own comparison (`verifier.decide`), or why there are none."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from verifier.backends import Backend
from verifier.build import ArtefactMismatch, copy_for_worker, verify_artefact
from verifier.clock import ParentClock
from verifier.decide import load_outputs
from verifier.gpu_pool import GpuWorkerProcess, RunOutcome
from verifier.protocol import VerifyOptions
from verifier.referee import Referee
from verifier.sandbox import Launcher, SandboxLimits

_FLOOD_BYTES = 16 << 20  # stdout+stderr beyond this is a flood (the file limit stops it at 64 MB)
_DISK_BYTES = 128 << 20  # all files a run writes (the file-size rlimit bounds each one)
RUNTIME_MB = 2048  # a GPU worker's host memory beyond the run's limit: torch, the CUDA runtime


class _SandboxRunner:
    """One execution slot: each candidate in a fresh sandboxed child (forked or spawned)."""

    def __init__(self, launcher: Launcher, backend: Backend, opts: VerifyOptions,
                 env: dict[str, str], threads: int) -> None:
        self.launcher, self.backend, self.opts = launcher, backend, opts
        self.env, self.threads = env, threads

    def run(self, item: Any, job: dict[str, Any]) -> RunOutcome:
        workdir = Path(tempfile.mkdtemp(prefix="ks-run-"))
        try:
            try:
                exts = copy_for_worker(list(item.built.values()), workdir)
            except ArtefactMismatch as exc:
                return RunOutcome(None, "correctness", False, f"verifier build cache: {exc}",
                                  False, 0.0)
            job = {**job, "extensions": exts, "threads": self.threads}
            clock = ParentClock(workdir)  # the parent's own clock for the timing windows
            try:
                res = self.launcher.run_module(
                    "verifier.worker",
                    limits=SandboxLimits(timeout_s=self.opts.run_timeout_s,
                                         memory_mb=self.backend.sandbox_memory_mb(
                                             self.opts.memory_limit_mb)),
                    input_files={"job.json": json.dumps(job), "task.py": item.req.task_source,
                                 "candidate.py": item.code},
                    env={"OMP_NUM_THREADS": str(self.threads), **self.env}, workdir=workdir)
            finally:
                windows = clock.stop()
            clock_data = None
            if res.payload is not None and res.payload.get("outcome") == "ok":
                clocked = (load_outputs(workdir / "clocked.pt") if self.backend.name == "cpu"
                           else None)
                clock_data = (windows, clock.protocol_error, clocked)
            try:
                stage = json.loads((workdir / "progress.json").read_text()).get(
                    "stage", "correctness")
            except (OSError, ValueError):
                stage = "correctness"
            # Python ignores SIGXFSZ, so a flood ends in failed writes, not a signal: sizes.
            outputs = load_outputs(workdir / "outputs.pt") if res.payload else None
            flood = sum((workdir / n).stat().st_size for n in (".stdout", ".stderr")
                        if (workdir / n).exists()) >= _FLOOD_BYTES
            # the file-size rlimit is per file: the total the run wrote is bounded here
            written = sum(f.stat().st_size for f in workdir.rglob("*") if f.is_file()
                          and not f.is_symlink() and f.suffix != ".so")
            if written > _DISK_BYTES and res.payload is not None:
                res.payload = None
                res.stderr += (f"\nthe run wrote {written >> 20} MB to its directory (limit "
                               f"{_DISK_BYTES >> 20} MB in all)")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        failure = "" if res.payload is not None else res.describe_failure()
        if "MB to its directory" in res.stderr and res.payload is None:
            failure = res.stderr.strip().splitlines()[-1]
        if res.payload is None and "fork server" in res.stderr:
            failure = "the verifier's fork server stopped answering (" + failure + ")"
        # references on this host's cpu match cpu runs; device backends: the worker's checks
        return RunOutcome(res.payload, stage, res.timed_out, failure, flood, res.wall_s,
                          outputs, self.backend.name == "cpu", clock_data)

    def close(self) -> None:
        return None


class _GpuRunner:
    """One execution slot pinned to a GPU: a persistent `verifier.gpu_worker` process, and a
    warm standby beside it (`standby`): a worker that a candidate kills (crash, hang, sticky
    CUDA error, tampering) is replaced by the standby at once instead of after a fresh start
    (import torch, CUDA context, the profiler's first session: ~10 s), and a new standby
    starts in the background."""

    def __init__(self, opts: VerifyOptions, env: dict[str, str], backend: str,
                 standby: bool = False) -> None:
        self.opts, self.backend = opts, backend
        # RLIMIT_AS cannot bound a CUDA process: its host memory is bounded by a cgroup
        # (`verifier.membound`), the run's limit plus room for the runtime's own
        mem = opts.memory_limit_mb + RUNTIME_MB if opts.memory_limit_mb > 0 else 0
        # jobs' raw outputs land in this slot's own directory (the workers never see it)
        self.outdir = Path(tempfile.mkdtemp(prefix="ks-gpu-judge-"))
        self.worker = GpuWorkerProcess(env, backend, host_memory_mb=mem, outdir=self.outdir)
        self.standby = GpuWorkerProcess(env, backend, host_memory_mb=mem,
                                        outdir=self.outdir) if standby else None
        # the parent judges raw outputs itself: here on the cpu, else by a trusted referee
        # process on the same GPU (inputs drawn there cannot be regenerated on the cpu)
        self.referee = Referee(env, backend) if backend != "cpu" else None
        self.jobs = 0
        self.standby_thread: threading.Thread | None = None
        self.swaps = 0
        self.closed = self.starting = False
        self.state_lock = threading.Lock()  # closed/starting, between close() and a start
        self.lock = threading.Lock()  # warm() and run() never drive the process at once

    def warm(self) -> None:
        """Start the worker ahead of the first job (it warms while candidates compile)."""
        with self.lock:
            if not self.worker.alive():
                self.worker.start()
            self._refill()

    def wait_ready(self) -> None:
        """Return once warm() is done (so a profile does not count start-up as job time)."""
        with self.lock:
            return

    def _refill(self) -> None:
        """Start the standby in the background unless it is up or starting (lock held)."""
        if self.standby is None or self.standby.alive() or (
                self.standby_thread is not None and self.standby_thread.is_alive()):
            return
        self.standby.stop()
        with self.state_lock:
            self.starting = True
        self.standby_thread = threading.Thread(target=self._start_standby, args=(self.standby,),
                                               daemon=True)
        self.standby_thread.start()

    def _start_standby(self, proc: GpuWorkerProcess) -> None:
        proc.start()
        with self.state_lock:
            self.starting = False
            leave = self.closed
        if leave:  # the batch ended while it started: nothing will use it
            proc.stop()

    def _swap_in_standby(self, wait: bool) -> None:
        """The standby becomes the worker when the worker is gone (lock held); `wait`: for a
        standby still starting (before a job; after one, the next job waits instead)."""
        if self.standby is None or self.worker.alive():
            return
        if self.standby_thread is not None and self.standby_thread.is_alive():
            if not wait:
                return
            self.standby_thread.join()
        if self.standby.alive():
            self.worker.stop()
            self.worker, self.standby = self.standby, self.worker
            self.swaps += 1
        self._refill()

    def run(self, item: Any, job: dict[str, Any]) -> RunOutcome:
        built = [r for r in item.built.values() if r.ok]
        changed = [r.path for r in built if not verify_artefact(r)]
        if changed:
            return RunOutcome(None, "correctness", False, "verifier build cache: built object "
                              f"{Path(changed[0]).name} changed after the build (hash mismatch)",
                              False, 0.0)
        job = {**job, "device_sources": [src for s in item.specs
                                         for src in (*s.cuda_sources, *s.cpp_sources)]}
        with self.lock:
            self._swap_in_standby(wait=True)
            try:
                out = self._run_locked(item, job, built)
                return self._judged_here(out)
            finally:
                self._swap_in_standby(wait=False)

    def _judged_here(self, out: RunOutcome) -> RunOutcome:
        """The job's raw outputs (in this slot's directory) loaded for the parent's own
        comparison (cpu) or handed to the referee (its GPU)."""
        mine = Path(out.outputs_file) if out.outputs_file else self.outdir / "none.pt"
        if out.payload is None or out.payload.get("outcome") != "ok":
            return out
        out.rechecked = True  # the worker's "ok" is not believed
        if self.referee is None:
            data = load_outputs(mine) if mine.exists() else None
            raw, clocked = data if data is not None and len(data) == 2 else (None, None)
            out.outputs = raw if isinstance(raw, list) else None
            if out.clock is not None:
                out.clock = (*out.clock[:2], clocked if isinstance(clocked, list) else None)
        else:
            self.jobs += 1  # the referee reads each job's outputs file once
            out.referee = functools.partial(self.referee, outputs=str(mine), job=str(self.jobs))
        return out

    def _run_locked(self, item: Any, job: dict[str, Any], built: list) -> RunOutcome:
        """One job on the current worker (lock held): start it if gone, stage the objects."""
        if not self.worker.alive():  # objects are staged in a started worker's directory
            self.worker.stop()
            if not self.worker.start():
                why = self.worker.describe_exit()
                bound = self.worker.memory_bound
                self.worker.stop()
                return RunOutcome(None, failure=f"the GPU worker did not start: {why} "
                                  f"(host memory bound: {bound})")
        if not self.worker.limits.isolate:  # it sees the build cache itself
            entries = {r.key: {**r.to_entry(), "path": os.path.abspath(r.path)}
                       for r in built}
            return self.worker.run({"job": {**job, "extensions": entries},
                                    "task_source": item.req.task_source,
                                    "candidate_source": item.code}, self.opts.run_timeout_s)
        staged = None
        try:
            entries, staged = self.worker.stage(built)
            return self.worker.run({"job": {**job, "extensions": entries},
                                    "task_source": item.req.task_source,
                                    "candidate_source": item.code}, self.opts.run_timeout_s)
        except (ArtefactMismatch, OSError) as exc:  # the worker is not trusted further
            self.worker.stop()
            return RunOutcome(None, "correctness", False, f"verifier build cache: {exc}",
                              False, 0.0)
        finally:
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)

    def close(self) -> None:
        """Stop both processes; a standby still starting stops itself once it is up (the
        batch does not wait for it)."""
        with self.lock:
            self.worker.stop()
            with self.state_lock:
                self.closed = True
                starting = self.starting
            if self.standby is not None and not starting:
                self.standby.stop()
            if self.referee is not None:
                self.referee.close()
            shutil.rmtree(self.outdir, ignore_errors=True)
