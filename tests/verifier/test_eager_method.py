"""Issue 28: the eager baseline is timed by the candidates' method (cpu). The same forward,
judged once as a candidate and once as the task's baseline, must come out near 1.0x; before,
the baseline was timed in-process (inputs hot in its cache, one output copy per window) and a
candidate that was the reference itself scored ~0.5x."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from verifier_cases import relu_task

from verifier.backends.cpu import CpuBackend
from verifier.isolation.cpu_meter import CpuCgroup
from verifier.isolation.sandbox import SandboxLimits, SpawnLauncher, run_sandboxed
from verifier.judge.ip_sampler import SamplingClock
from verifier.judge.window_judge import WindowJudge
from verifier.protocol import VerifyOptions
from verifier.run.baselines import Baselines
from verifier.run.runners import ARENA_FILE, CPU_ARENA_BYTES, CPU_GRANTS, SandboxRunner
from verifier.run.worker import run_job

# 2^18 elements: the cpu task cap (pipeline.tasks.taskfile.cpu_max_numel), where the old
# method's bias was largest (the per-call output copy into memory not in cache)
TASK = relu_task(512, 512)
# the worker's timing half, on the reference's forward: what a candidate whose forward is the
# reference gets from the judge (its correctness stage would call it a fallback, so it is left out)
SERVE_AS_CANDIDATE = """
import json, torch
import pytest

from verifier.backends.cpu import CpuBackend
from verifier.judge import decide
from verifier.judge.timed_calls import serve_timed_windows
torch.set_num_threads(1)
model, get_inputs = decide.reference(open("task.py").read(), 0)
with torch.no_grad():
    model(*decide.make_inputs(get_inputs, 1))
    serve_timed_windows({"arena": json.load(open("spec.json"))}, model, CpuBackend())
"""
TOL = (1e-4, 1e-4, 1e-2, 1e-2)
# A speedup of one forward against itself on a loaded 2-core host: each side is the fastest of
# its windows over the rounds so far (load only adds time, so a minimum is what load leaves
# alone, and more rounds only bring each side nearer its own floor: a method 2x apart stays 2x
# apart however many rounds are run); +-30% (and up to ROUNDS interleaved rounds) holds under
# the 7-agent load of benchmarks/results/eager_method_cpu2.md, and fails the old method's 0.5x.
LOW, HIGH = 0.7, 1 / 0.7
ROUNDS = 4
ROOT = Path(__file__).resolve().parents[2]


def _runner(tmp_path: Path) -> SandboxRunner:
    opts = VerifyOptions(backend="cpu", run_timeout_s=60.0, trials=2, fallback="partial",
                         baseline_cache_dir=str(tmp_path / "bl"))
    return SandboxRunner(SpawnLauncher(), CpuBackend(), opts, {}, threads=1)


def _as_candidate(tmp_path: Path) -> dict[str, Any]:
    """The judge's figures of the reference's forward served as a candidate's is, wired as
    `SandboxRunner.run` wires a candidate: this process judges (`WindowJudge`, the sampling
    clock, stepped as the runner's is, the run's cpu meter), a sandboxed child pinned to its
    granted cpu serves."""
    run = Path(tempfile.mkdtemp(dir=tmp_path))
    judge = WindowJudge(TASK, 0, TOL, CPU_ARENA_BYTES, path=str(run / ARENA_FILE))
    clock = SamplingClock(judge, policy="partial", workdir=run, wait_s=60.0, stepped=True)
    meter = CpuCgroup.make()
    if meter is not None:
        clock.watch(meter.cpu_s, cpus=1, runnable=meter.runnable)
    cpus = CPU_GRANTS.take(1)
    try:
        res = run_sandboxed(
            [sys.executable, "-c", SERVE_AS_CANDIDATE],
            limits=SandboxLimits(timeout_s=120.0, cpu_cgroup=str(meter.path) if meter else "",
                                 cpus=cpus),
            input_files={"task.py": TASK,
                         "spec.json": json.dumps({**judge.spec, "path": ARENA_FILE})},
            env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, workdir=run)
    finally:
        CPU_GRANTS.give(cpus)
        timed = clock.result()
        judge.close()
        if meter is not None:
            meter.remove()
    assert res.returncode == 0, res.stderr[-2000:]
    assert not timed["failure"] and not timed["judge_error"] and timed["figures"], timed
    return timed["figures"]


def test_a_forward_judged_as_candidate_and_as_baseline_scores_near_one(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    options = {"trials": 2, "seed": 0, "fallback": "partial"}
    eager, cand = [], []
    for _ in range(ROUNDS):  # interleaved: a load spike hits both sides alike
        base = runner.baseline(TASK, options)
        assert base is not None
        eager.append(base["eager_us"])
        cand.append(_as_candidate(tmp_path)["runtime_us"])
        if LOW < min(eager) / min(cand) < HIGH:
            break
    windows = base["eager_windows"]  # the judge's own figures, as a candidate's
    assert windows["sets"] >= 1 and windows["calls"] >= 1 and windows["copy_us"] > 0
    assert LOW < min(eager) / min(cand) < HIGH, (eager, cand)


def test_the_baseline_cache_holds_the_served_figures_and_is_keyed_by_method(
        tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    cache = Baselines(runner.opts, runner.backend)
    got = cache.ensure(TASK, runner, {"trials": 2, "seed": 0})
    assert set(got) == {"eager_us", "eager_iqr_us", "eager_timings_us"} and got["eager_us"] > 0
    assert len(got["eager_timings_us"]) == 2 and got["eager_us"] == min(got["eager_timings_us"])
    assert cache.complete(TASK, runner.backend.baseline_key())
    files = list((tmp_path / "bl").glob("*.json"))
    assert len(files) == 1  # written here, by the trusted parent, not by the child


def test_a_baseline_child_without_a_judge_still_times_the_reference_itself() -> None:
    job = {"nonce": "n2", "backend": "cpu", "extensions": {}, "baseline_only": True,
           "baseline_forward": "eager", "options": {"trials": 1}}
    res = run_job(job, TASK, "")  # no arena in the job: the in-process method (GPU referee's)
    assert res["outcome"] == "baseline" and res["eager_us"] > 0


def test_the_cpu_backend_times_no_compiled_baseline(tmp_path: Path) -> None:
    """torch.compile is not timed on cpu (`CpuBackend.torch_compile_supported`): asked for, the
    served baseline is eager only (the compiled forward is served the same way where a backend
    supports it: `timed_calls.serve_baseline`)."""
    runner = _runner(tmp_path)
    assert not runner.backend.torch_compile_supported()
    base = runner.baseline(TASK, {"trials": 2, "seed": 0, "torch_compile_baseline": True})
    assert base is not None and base["eager_us"] > 0 and "compiled_us" not in base


def test_a_reference_no_judge_can_build_is_timed_by_its_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the parent cannot make the windows' judge (its reference raised), the baseline
    child gets no arena and times the reference itself, as before: the task keeps a baseline."""
    import verifier.run.runners as runners

    def no_judge(*args: Any, **kw: Any) -> None:
        raise RuntimeError("this reference builds only on the host")

    monkeypatch.setattr(runners, "WindowJudge", no_judge)
    base = _runner(tmp_path).baseline(TASK, {"trials": 2, "seed": 0})
    assert base is not None and base["eager_us"] > 0
    assert "copy_us" not in base["eager_windows"]  # the child's own figures, not a judge's


def test_a_baseline_timed_under_a_burst_of_load_keeps_its_faster_timing(tmp_path: Path) -> None:
    """Load only slows a timing: of a baseline's two timings the faster is kept, with its
    spread, and both eagers are recorded (a default build cached eagers 2-8x slow, timed while
    compiles loaded both cores, and labelled its kernels 4.6-9.4x)."""
    runner = _runner(tmp_path)
    timings = iter([{"eager_us": 900.0, "eager_iqr_us": 400.0},
                    {"eager_us": 150.0, "eager_iqr_us": 3.0}])

    class Loaded:  # the runner's baseline under a burst of load, then quiet
        def baseline(self, task_source: str, job_options: dict) -> dict:
            return next(timings)

    cache = Baselines(runner.opts, runner.backend)
    got = cache.ensure(TASK, Loaded(), {"trials": 2, "seed": 0})
    assert got["eager_us"] == 150.0 and got["eager_iqr_us"] == 3.0
    assert got["eager_timings_us"] == [900.0, 150.0]
