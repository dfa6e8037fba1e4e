"""The persistent GPU worker's execution slot (`verifier.api`, cuda): one warm worker per GPU
and its spares, the judge's arenas for its trials and timed windows (in a referee process on
the GPU, or here), and the worker replaced after a failure. Returns a `RunOutcome` as the
sandboxed slot does (`verifier.run.runners`)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from verifier.backends import get_backend
from verifier.compile.builder import ArtefactMismatch, verify_artefact
from verifier.judge.admission import windows_left
from verifier.judge.construct import DEVICE, HostOnly
from verifier.judge.pace import Pace
from verifier.judge.referee import Referee, RemoteJudge, RemoteTrials
from verifier.judge.trial_judge import DoesNotFit
from verifier.judge.window_judge import WindowJudge
from verifier.protocol import VerifyOptions
from verifier.run.baselines import baseline_forwards, default_cache_dir, serve_baselines
from verifier.run.gpu_pool import GpuWorkerProcess
from verifier.run.outcome import RunOutcome, confirmed, retimed
from verifier.run.runners import CPU_ARENA_BYTES, cpu_peaks
from verifier.run.spans import Spans

GPU_ARENA_BYTES = 8 << 30  # on a GPU (at most a quarter of its free memory)
CPU_TRIALS_BYTES = 4 << 30  # what the cpu loop's trials may hold (`verifier.judge.admission`)
RUNTIME_MB = 2048  # a GPU worker's host memory beyond the run's limit: torch, the CUDA runtime
# the eager baseline served by a reference-only worker (`_served_baseline`) for tasks whose
# inputs and output are at most this (an H100's in-process eager was 0.65x the served one at
# 64 MB, 0.98x at 1 GB); above it the referee's figure (a served 6 GiB ReLU took > 45 s)
SERVED_MAX_BYTES = 1 << 30
SERVED_TIMEOUT_S = 20.0  # a served baseline's job; past it the referee's figure stands
SERVED_FAILURES_MAX = 2  # then this runner stops asking its timer (a batch never stalls on it)


class GpuRunner:
    """One execution slot pinned to a GPU: a persistent `verifier.run.gpu_worker` process, and
    `standbys` warm spares beside it: a worker that a candidate kills (crash, hang, sticky
    CUDA error, tampering) is replaced by a spare at once instead of after a fresh start
    (import torch, CUDA context, the profiler's first session: ~12 s on an H100 node), and a
    new spare starts in the background. Cheating candidates come in runs, so one spare is not
    enough (with one, an H100 batch waited ~10 s four times for the previous swap's spare)."""

    def __init__(self, opts: VerifyOptions, env: dict[str, str], backend: str,
                 standbys: int = 0) -> None:
        self.opts, self.backend = opts, backend
        # RLIMIT_AS cannot bound a CUDA process: its host memory is bounded by a cgroup
        # (`verifier.isolation.membound`), the run's limit plus room for the runtime's own
        mem = opts.memory_limit_mb + RUNTIME_MB if opts.memory_limit_mb > 0 else 0
        self.worker = GpuWorkerProcess(env, backend, host_memory_mb=mem)
        # the eager baseline's worker: a process like the candidates' that only ever loads
        # references, started beside the candidates' worker (`warm`; on the cpu loop, at the
        # first baseline, `_served_baseline`); `timer_start`: that start, in the background
        self.timer: GpuWorkerProcess | None = None
        self.timer_start: threading.Thread | None = None
        self.env, self.host_memory_mb = env, mem
        self.served_failures = 0
        self.spares = [GpuWorkerProcess(env, backend, host_memory_mb=mem)
                       for _ in range(max(0, standbys))]
        # the trusted judge of the trials and timed windows: a referee process on the same
        # GPU (its arenas are device memory the worker maps); the cpu loop: this process
        self.referee = Referee(env, backend) if backend != "cpu" else None
        self.jobs = 0
        self.device_peaks: dict[str, Any] | None = None
        self.threads: dict[int, threading.Thread] = {}  # spare index -> its start, oldest first
        self.swaps = self.confirmations = 0
        self.spans = Spans()  # the job's steps here (the benchmarks' profile)
        self.closed = False
        self.starting: set[int] = set()  # spares whose start has not ended (state_lock)
        self.state_lock = threading.Lock()  # closed/starting, between close() and a start
        self.lock = threading.Lock()  # warm() and run() never drive the process at once

    def warm(self) -> None:
        """Start the worker ahead of the first job (it warms while candidates compile), and
        beside it the baselines' worker (the first baseline waited ~12 s for it, in series)."""
        with self.lock:
            if self.referee is not None and self.timer is None:
                self.timer_start = threading.Thread(target=self._new_timer().start, daemon=True)
                self.timer_start.start()
            if not self.worker.alive():
                self.worker.start()
            self._refill()

    def wait_ready(self) -> None:  # once warm() is done (a profile counts no start-up as a job)
        with self.lock:
            pass

    def _refill(self) -> None:
        """Start every spare that is neither up nor starting, in the background (lock held)."""
        for i, spare in enumerate(self.spares):
            with self.state_lock:
                if spare.alive() or i in self.starting:
                    continue
                self.starting.add(i)
            spare.stop()
            self.threads.pop(i, None)
            self.threads[i] = threading.Thread(target=self._start_spare, args=(i, spare),
                                               daemon=True)
            self.threads[i].start()

    def _start_spare(self, i: int, proc: GpuWorkerProcess) -> None:
        proc.start()
        with self.state_lock:
            self.starting.discard(i)
            leave = self.closed
        if leave:  # the batch ended while it started: nothing will use it
            proc.stop()

    def _swap_in_standby(self, wait: bool) -> None:
        """A warm spare becomes the worker when the worker is gone (lock held); `wait`: for
        the spare that started first, when none is up yet (before a job; after one, the next
        job waits instead)."""
        if not self.spares or self.worker.alive():
            return
        ready = [i for i, s in enumerate(self.spares) if s.alive()]
        if not ready:
            if not wait:
                return
            with self.state_lock:
                pending = [i for i in self.threads if i in self.starting]
            if pending:
                self.threads[pending[0]].join()
            ready = [i for i, s in enumerate(self.spares) if s.alive()]
        if ready:
            i = ready[0]
            self.worker.stop()
            self.worker, self.spares[i] = self.spares[i], self.worker
            self.swaps += 1
        self._refill()

    def run(self, item: Any, job: dict[str, Any], pace: Pace | None = None) -> RunOutcome:
        """One candidate's run on this slot's worker; a failure that worker reported after
        earlier jobs is made again in a fresh one (`verifier.run.outcome.confirmed`)."""
        built = [r for r in item.built.values() if r.ok]
        changed = [r.path for r in built if not verify_artefact(r)]
        if changed:
            return RunOutcome(None, "correctness", False, f"verifier build cache: built object "
                              f"{Path(changed[0]).name} changed after the build (hash mismatch)")
        job = {**job, "device_sources": [src for s in item.specs
                                         for src in (*s.cuda_sources, *s.cpp_sources)]}
        with self.lock:
            self.spans = Spans()
            if self.referee is not None:
                self.referee.spans = self.spans
            out = confirmed(lambda: self._run_judged(item, job, built, pace), self._fresh)
            out.spans = {**self.spans, **out.spans}
            return out

    def _fresh(self) -> None:  # the worker goes; the next run gets a spare or a fresh start
        self.worker.stop()
        self.confirmations += 1

    def _run_judged(self, item: Any, job: dict[str, Any], built: list,
                    pace: Pace | None) -> RunOutcome:
        """One run on fresh judge's arenas (lock held)."""
        with self.spans("standby_wait"):
            self._swap_in_standby(wait=True)
        judge, trials, fds = None, None, [-1, -1]  # the windows' and the trials' arenas
        try:
            if not job.get("baseline_only"):
                try:
                    with self.spans("prepare"):
                        trials, fds[1] = self._trials(item, job)
                        judge, fds[0] = self._judge(item, windows_left(trials),
                                                    job["options"].get("construct", DEVICE))
                except DoesNotFit as exc:  # the task's, not the candidate's
                    return RunOutcome(None, failure=str(exc), does_not_fit=str(exc))
                except HostOnly as exc:  # the parent runs it again the host's way
                    return RunOutcome(None, failure=str(exc), host_only=str(exc))
                except RuntimeError as exc:  # the verifier's fault, not the candidate's
                    return RunOutcome(None, failure=f"the verifier's referee failed: {exc}")
                job = {**job, "arena": judge.spec, "trials_arena": trials.spec}
                judge.trials = trials  # stepped by the judge's clock (`verifier.judge.trial_pace`)
            # the trials are checked before the worker settles (`GpuWorkerProcess.settle`)
            with self.spans("worker_run"):
                return retimed(self._run_locked(item, job, built, judge, *fds, pace=pace,
                                                check=lambda out: self._judged_here(out, trials)))
        finally:
            with self.spans("release"):
                for fd in [fd for fd in fds if fd >= 0]:
                    os.close(fd)
                for held in [held for held in (judge, trials) if held is not None]:
                    self._release_judge(held)
                self._swap_in_standby(wait=False)

    def _trials(self, item: Any, job: dict[str, Any]) -> tuple[Any, int]:
        """The job's trial judge and its arena's descriptor: the referee's on its GPU; on the
        cpu loop this process's, in a memfd. DoesNotFit when the task's run cannot fit."""
        from verifier.judge.trial_judge import DoesNotFit, TrialJudge

        opts = self.opts
        args = {"task_source": item.req.task_source, "seed": opts.seed,
                "input_seed": job["input_seed"], "trials": max(1, opts.trials),
                "variants": job.get("variants") or [], "stepped": True,  # paced, published at "p"
                "tol": (opts.atol_fp32, opts.rtol_fp32, opts.atol_low, opts.rtol_low),
                "window_max": GPU_ARENA_BYTES if self.referee is not None else CPU_ARENA_BYTES,
                "cpu_free": CPU_TRIALS_BYTES, "construct": job["options"].get("construct", DEVICE)}
        if self.referee is None:
            try:
                judge = TrialJudge(args, CPU_TRIALS_BYTES, CPU_ARENA_BYTES)
            except DoesNotFit:
                raise
            except HostOnly as exc:
                raise HostOnly(f"the task's Model(...) {exc}") from exc
            except Exception as exc:  # noqa: BLE001 - the reference fails: its task's error
                raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
            return judge, os.dup(judge.arena.fd)
        reply, fd = self.referee.prepare(args, op="trials")
        if reply.get("does_not_fit"):
            raise DoesNotFit(str(reply["does_not_fit"]))
        if reply.get("host_only"):
            raise HostOnly(str(reply["host_only"]))
        return RemoteTrials(self.referee, reply), fd

    def _judge(self, item: Any, budget: int = GPU_ARENA_BYTES,
               construct: str = DEVICE) -> tuple[Any, int]:
        """The job's window judge and its arena's descriptor, as `_trials`'."""
        opts = self.opts
        tol = (opts.atol_fp32, opts.rtol_fp32, opts.atol_low, opts.rtol_low)
        if self.referee is None:
            try:
                judge = WindowJudge(item.req.task_source, opts.seed, tol, CPU_ARENA_BYTES,
                                    construct=construct)
            except Exception as exc:  # noqa: BLE001 - the reference fails: its task's error
                raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
            return judge, os.dup(judge.arena.fd)
        reply, fd = self.referee.prepare({"task_source": item.req.task_source, "seed": opts.seed,
                                          "tol": tol, "budget_bytes": budget, "construct": construct})
        return RemoteJudge(self.referee, reply), fd

    def _release_judge(self, judge: Any) -> None:
        try:
            judge.release() if isinstance(judge, RemoteJudge) else judge.close()
        except RuntimeError as exc:  # the referee restarts on its next use
            print(f"kernelsynth verifier: the referee did not release a judge: {exc}",
                  file=sys.stderr)

    def baseline(self, task_source: str, job_options: dict[str, Any]) -> dict[str, Any] | None:
        """The reference's baselines, timed by the candidates' very method: on a GPU a worker
        that only ever loads references serves the referee's windows with the reference as its
        forward (`_served_baseline`) for a task of at most `SERVED_MAX_BYTES`; else the
        referee times it in-process (`timed_calls.time_reference`; the cpu loop: here). None
        when they cannot be timed."""
        args = {"task_source": task_source, "seed": self.opts.seed, "backend": self.backend,
                "torch_compile": bool(job_options.get("torch_compile_baseline")),
                "budget_bytes": GPU_ARENA_BYTES if self.referee is not None else CPU_ARENA_BYTES}
        try:
            if self.referee is None:
                from verifier.judge.referee import baseline

                return baseline(args)["figures"]
            served = self._served_if_small(task_source, job_options, args)
            if served is not None:
                return {**served, "method": "served"}
            return {**self.referee.request("baseline", args)["figures"], "method": "referee"}
        except Exception as exc:  # noqa: BLE001 - an untimeable reference: no baseline
            print(f"kernelsynth verifier: no baseline for a task: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return None

    def _served_if_small(self, task_source: str, job_options: dict[str, Any],
                         args: dict[str, Any]) -> dict[str, Any] | None:
        """The served baseline (`_served_baseline`) of a task whose input set and output are at
        most `SERVED_MAX_BYTES` (the referee's `sizes`); None where the referee's method stands:
        a larger task, a failed served one (counted), or after `SERVED_FAILURES_MAX` of them."""
        assert self.referee is not None
        if self.served_failures >= SERVED_FAILURES_MAX:
            return None
        sizes = self.referee.request("sizes", args)["sizes"]
        if sizes["set_bytes"] + sizes["out_bytes"] > SERVED_MAX_BYTES:
            return None
        try:
            served = self._served_baseline(task_source, job_options)
        except Exception as exc:  # noqa: BLE001 - the referee's own method still times it
            print(f"kernelsynth verifier: no served baseline: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            served = None
        if served is None:
            self.served_failures += 1
        return served

    def _served_baseline(self, task_source: str, job_options: dict[str, Any]
                         ) -> dict[str, Any] | None:
        """Eager (and torch.compile) served to the referee's windows by `self.timer` as a
        candidate's forward is (an in-process eager made every H100 speedup 0.65x what it
        is); None when the timer cannot serve them."""
        forwards = baseline_forwards(get_backend(self.backend), job_options)
        job = {"backend": self.backend, "options": job_options, "extensions": {},
               "device_sources": []}
        with self.lock:
            timer = self.timer or self._new_timer()
            if self.timer_start is not None:
                self.timer_start.join()  # started by `warm`
            if not timer.alive():
                timer.stop()
                if not timer.start():
                    print("kernelsynth verifier: the baseline worker did not start "
                          f"({timer.describe_exit()}); the referee times eager itself",
                          file=sys.stderr)
                    timer.stop()
                    return None
            return serve_baselines(task_source, forwards, job, self._serve_one)

    def _new_timer(self) -> GpuWorkerProcess:  # the baselines' worker, not started yet
        self.timer = GpuWorkerProcess(self.env, self.backend, host_memory_mb=self.host_memory_mb)
        return self.timer

    def _serve_one(self, item: Any, job: dict[str, Any]) -> RunOutcome:
        """One baseline job on the timer, served to a fresh window judge (lock held)."""
        assert self.timer is not None
        judge, fd = self._judge(item, GPU_ARENA_BYTES)
        try:
            return self.timer.run({"job": {**job, "arena": judge.spec},
                                   "task_source": item.req.task_source, "candidate_source": ""},
                                  min(self.opts.run_timeout_s, SERVED_TIMEOUT_S), judge, fd)
        finally:
            os.close(fd)
            self._release_judge(judge)

    def peaks(self) -> dict[str, Any] | None:
        """The GPU's peaks for the physics floor, measured once by the referee (cached)."""
        if self.referee is None:
            return cpu_peaks()
        if self.device_peaks is None:
            try:
                self.device_peaks = self.referee.request(
                    "peaks", {"cache_dir": str(default_cache_dir())})["peaks"]
            except RuntimeError as exc:
                print(f"kernelsynth verifier: no physics floor: {exc}", file=sys.stderr)
                self.device_peaks = {}
        return self.device_peaks or None

    def _judged_here(self, out: RunOutcome, trials: Any) -> RunOutcome:
        """The judge's check of a run its worker called ok: the trials' outputs in their slots
        against its references; its figures replace the worker's (`decide.parent_check`)."""
        p = out.payload
        if p is None or p.get("outcome") != "ok" or trials is None:
            return out
        out.rechecked = out.judge_compared = True  # the worker's "ok" is not believed
        began, early = time.monotonic(), (out.clock or {}).get("trials")
        if early:  # the variants the judge checked at "t" (the run's end may say others)
            p["variants_checked"] = early[4]
        report = p.pop("trial_report", None)
        try:  # checked at the clock's "t" (`trial_pace.trials_checked`): that answer stands
            ok, why, stats = early[:3] if early else trials.check(report, p.get("variants_checked"))
        except RuntimeError as exc:  # the referee failed: the parent's check says so
            ok, why, stats = None, str(exc), {}
        out.referee_s += early[3] if early else time.monotonic() - began  # the profile
        p.update(stats)
        p["trials"] = held = int(trials.spec["trials"])
        if held < max(1, self.opts.trials):
            p.setdefault("findings", []).append({
                "rule": "trials_admitted", "severity": "warning", "line": None,
                "message": f"{held} of {self.opts.trials} trials: the device holds no more "
                           f"(`verifier.judge.admission`)"})

        def answer(op: str, args: dict[str, Any]) -> tuple[bool, str]:
            if ok is None:
                raise RuntimeError(why)
            return ok, why

        out.referee = answer
        return out

    def _run_locked(self, item: Any, job: dict[str, Any], built: list, judge: Any = None,
                    arena_fd: int = -1, trials_fd: int = -1, pace: Pace | None = None,
                    check: Any = None) -> RunOutcome:
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
                                    "candidate_source": item.code}, self.opts.run_timeout_s,
                                   judge, arena_fd, trials_fd, pace, check)
        staged = None
        try:
            entries, staged = self.worker.stage(built)
            return self.worker.run({"job": {**job, "extensions": entries},
                                    "task_source": item.req.task_source,
                                    "candidate_source": item.code}, self.opts.run_timeout_s,
                                   judge, arena_fd, trials_fd, pace, check)
        except (ArtefactMismatch, OSError) as exc:  # the worker is not trusted further
            self.worker.stop()  # (its directory: perhaps an earlier job's doing)
            return RunOutcome(None, "correctness", False, f"verifier build cache: {exc}",
                              False, 0.0, suspect=str(exc) if self.worker.earlier else "")
        finally:
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)

    def close(self) -> None:
        """Stop every process; a spare still starting stops itself once it is up."""
        with self.lock:
            self.worker.stop()
            if self.timer_start is not None:
                self.timer_start.join()
            if self.timer is not None:
                self.timer.stop()
            with self.state_lock:
                self.closed = True
                starting = set(self.starting)
            for i, spare in enumerate(self.spares):
                if i not in starting:
                    spare.stop()
            if self.referee is not None:
                self.referee.close()
