"""Execution slots of `verifier.api`: a sandboxed child per candidate (cpu, musa; here) or a
persistent GPU worker (cuda, `verifier.run.gpu_runner`). Both return a `RunOutcome`: the worker's measurements, its raw trial outputs
for the parent's own comparison (`verifier.judge.decide`), or why there are none."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from verifier.backends import Backend
from verifier.compile.builder import ArtefactMismatch, copy_for_worker
from verifier.isolation.cpu_bound import CpuGrants
from verifier.isolation.cpu_meter import CpuCgroup
from verifier.isolation.sandbox import Launcher, SandboxLimits, candidates_words
from verifier.judge.clock import JudgeClock, no_judge
from verifier.judge.construct import DEVICE
from verifier.judge.decide import load_outputs
from verifier.judge.ip_sampler import SamplingClock
from verifier.judge.pace import Pace
from verifier.judge.window_judge import WindowJudge
from verifier.protocol import VerifyOptions
from verifier.run.baselines import baseline_forwards, default_cache_dir, serve_baselines
from verifier.run.outcome import RunOutcome, window_failed

FLOOD_BYTES = 16 << 20  # stdout+stderr beyond this is a flood (the file limit stops it at 64 MB)
_DISK_BYTES = 128 << 20  # all files a run writes (the file-size rlimit bounds each one)
ARENA_FILE = "arena.bin"
CPU_GRANTS = CpuGrants()  # the cpus concurrent runs are pinned to, fewest-held first
CPU_ARENA_BYTES = 16 << 20  # the judge's input sets and output slot for a cpu run


_PEAKS: dict[str, Any] = {}


def cpu_peaks() -> dict[str, Any] | None:
    """This host's cpu peaks (measured once per host and torch, cached on disk)."""
    if "cpu" not in _PEAKS:
        from verifier.judge.floor import device_peaks

        try:
            _PEAKS["cpu"] = device_peaks("cpu", default_cache_dir())
        except (OSError, RuntimeError) as exc:  # no floor, said once: the verdicts stand
            print(f"kernelsynth verifier: no physics floor: {exc}", file=sys.stderr)
            _PEAKS["cpu"] = None
    return _PEAKS["cpu"]


def _placed(f: Path, placed: dict[str, int]) -> bool:
    """Whether `f` is an object the runner copied in, unchanged in size (a file the run
    wrote under an object's name, or grew, counts against its disk bound)."""
    real = os.path.realpath(f)
    return placed.get(real) == f.stat().st_size


class SandboxRunner:
    """One execution slot: each candidate in a fresh sandboxed child (forked or spawned)."""

    def __init__(self, launcher: Launcher, backend: Backend, opts: VerifyOptions,
                 env: dict[str, str], threads: int) -> None:
        self.launcher, self.backend, self.opts = launcher, backend, opts
        self.env, self.threads = env, threads

    def run(self, item: Any, job: dict[str, Any], pace: Pace | None = None) -> RunOutcome:
        """One job in a fresh sandboxed child; `pace`: the reference's, for the clock's
        settled verdicts (`verifier.judge.pace`; the child's deadline is the run timeout)."""
        workdir = Path(tempfile.mkdtemp(prefix="ks-run-"))
        try:
            try:
                exts = copy_for_worker(list(item.built.values()), workdir)
            except ArtefactMismatch as exc:
                return RunOutcome(None, "correctness", False, f"verifier build cache: {exc}",
                                  False, 0.0)
            placed = {os.path.realpath(workdir / e["path"]): (workdir / e["path"]).stat().st_size
                      for e in exts.values()}
            job = {**job, "extensions": exts, "threads": self.threads}
            judge, clock = self._judge(item, job, workdir)
            meter = CpuCgroup.make() if clock is not None else None
            if judge is not None:
                job["arena"] = {**judge.spec, "path": ARENA_FILE}
            if clock is not None:
                clock.pace = pace
            if clock is not None and meter is not None:  # the run's cpu time, for the clock
                clock.watch(meter.cpu_s, cpus=self.threads, runnable=meter.runnable)
            if isinstance(clock, SamplingClock):  # where its cpu time goes (ip_sampler)
                clock.sample_tasks(meter.path if meter else None, {e["path"] for e in exts.values()})
            cpus = CPU_GRANTS.take(self.threads)  # a bound, not a request (verifier.isolation.cpu_bound)
            try:
                res = self.launcher.run_module(
                    "verifier.run.worker",
                    limits=SandboxLimits(timeout_s=self.opts.run_timeout_s,
                                         memory_mb=self.backend.sandbox_memory_mb(
                                             self.opts.memory_limit_mb),
                                         cpu_cgroup=str(meter.path) if meter else "",
                                         cpus=cpus),
                    input_files={"job.json": json.dumps(job), "task.py": item.req.task_source,
                                 "candidate.py": item.code},
                    env={"OMP_NUM_THREADS": str(self.threads), **self.env}, workdir=workdir)
            finally:
                CPU_GRANTS.give(cpus)
                timed = clock.result() if clock is not None else no_judge()
                if judge is not None:
                    judge.close()
                if meter is not None:
                    meter.remove()
            clock_data = None
            if res.payload is not None and res.payload.get("outcome") in ("ok", "baseline"):
                clock_data = timed
            try:
                stage = json.loads((workdir / "progress.json").read_text()).get(
                    "stage", "correctness")
            except (OSError, ValueError, RecursionError):  # the run's file: any text
                stage = "correctness"
            # Python ignores SIGXFSZ, so a flood ends in failed writes, not a signal: sizes.
            outputs = load_outputs(workdir / "outputs.pt") if res.payload else None
            flood = sum((workdir / n).stat().st_size for n in (".stdout", ".stderr")
                        if (workdir / n).exists()) >= FLOOD_BYTES
            # the file-size rlimit is per file: the total the run wrote is bounded here; only
            # the exact objects copy_for_worker placed (same path, same size) are not the run's
            # (all *.so were not: a run wrote 180 MB as ks_fill*.so past the 128 MB bound)
            written = sum(f.stat().st_size for f in workdir.rglob("*") if f.is_file()
                          and not f.is_symlink() and f.name != ARENA_FILE  # the judge's
                          and not _placed(f, placed))
            over = ""  # the parent's own words (a candidate can print these too)
            if written > _DISK_BYTES and res.payload is not None:
                res.payload = None
                over = (f"the run wrote {written >> 20} MB to its directory (limit "
                        f"{_DISK_BYTES >> 20} MB in all)")
                res.stderr += f"\n{over}"
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        failure = over or ("" if res.payload is not None else res.describe_failure())
        if res.payload is None and "fork server" in res.stderr and not res.started:
            failure = "the verifier's fork server stopped answering (" + failure + ")"
        if res.started and isinstance((res.payload or {}).get("error"), str):
            # written in the candidate's process: its words, never the environment's
            res.payload["error"] = candidates_words(res.payload["error"])
        if self.backend.name == "cpu" and res.payload is not None:  # this host's, not the run's
            res.payload["device"] = self.backend.device_name()  # (its JobResult is its own)
        # references on this host's cpu match cpu runs; device backends: the worker's checks
        out = RunOutcome(res.payload, stage, res.timed_out, failure, flood, res.wall_s,
                         outputs, self.backend.name == "cpu", clock_data)
        return window_failed(out, timed, job.get("nonce"))  # a failed window, then its end

    def _judge(self, item: Any, job: dict[str, Any], workdir: Path
               ) -> tuple[WindowJudge | None, JudgeClock | None]:
        """The verifier's own judge of this run's timed windows (cpu: this process), and its
        clock (stepped windows: `verifier.judge.stepped`); a baseline served to the windows
        (`baseline_forward`) gets a plain clock: the
        reference's calls are library code by definition (no ip sampling), the rest as a
        candidate's (the same fills, checks, cpu meter and copy deduction)."""
        if self.backend.name != "cpu" or (job.get("baseline_only")
                                          and not job.get("baseline_forward")):
            return None, None
        opts = self.opts
        try:
            judge = WindowJudge(item.req.task_source, opts.seed,
                                (opts.atol_fp32, opts.rtol_fp32, opts.atol_low, opts.rtol_low),
                                CPU_ARENA_BYTES, path=str(workdir / ARENA_FILE),
                                construct=job["options"].get("construct", DEVICE))
        except Exception as exc:  # the reference itself fails: the worker will say how
            print(f"kernelsynth verifier: no timing judge for {item.req.task_id}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return None, None
        if job.get("baseline_only"):
            return judge, JudgeClock(judge, workdir=workdir, wait_s=opts.run_timeout_s,
                                     stepped=True)
        return judge, SamplingClock(judge, policy=opts.fallback, workdir=workdir,
                                    wait_s=opts.run_timeout_s, stepped=True)

    def baseline(self, task_source: str, job_options: dict[str, Any]) -> dict[str, Any] | None:
        """The reference's baselines, each in a fresh sandboxed child that loads nothing but
        the reference (a process that never runs candidate code); None when eager failed.
        cpu: the child serves this judge's windows with the reference (then its torch.compile)
        as its forward, so a baseline is timed by the candidates' own method (issue 28: timed
        in-process, on inputs hot in its cache and one output copy per window, eager was ~2x
        faster than the same forward judged as a candidate); elsewhere the child times it."""
        forwards = (baseline_forwards(self.backend, job_options) if self.backend.name == "cpu"
                    else [""])
        job = {"backend": self.backend.name, "options": job_options,
               "arena_budget": CPU_ARENA_BYTES}
        return serve_baselines(task_source, forwards, job, self.run)

    def peaks(self) -> dict[str, Any] | None:
        """The device's peaks for the physics floor, measured here (cpu: this trusted process)."""
        return cpu_peaks() if self.backend.name == "cpu" else None

    def close(self) -> None:
        return None
