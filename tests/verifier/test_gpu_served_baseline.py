"""The GPU slot's eager baseline served to the judge's windows by a worker that only ever loads
references (`verifier.run.gpu_runner.GpuRunner._served_baseline`), on the cpu loop here: the same
code a GPU runs, with the judge in this process instead of the referee. On an H100 the
referee's in-process method gave eager 48 us for a 64 MB ReLU that the worker path took 70-75 us
for (the reference itself judged as a candidate: 0.65x), so every speedup was compressed."""

from __future__ import annotations

import time
from typing import Any

import pytest
from verifier_cases import relu_task

from verifier.backends.cpu import CpuBackend
from verifier.isolation.sandbox import SpawnLauncher
from verifier.judge.referee import Referee
from verifier.protocol import VerifyOptions
from verifier.run import gpu_runner
from verifier.run.baselines import serve_baselines
from verifier.run.gpu_runner import GpuRunner
from verifier.run.runners import CPU_ARENA_BYTES, SandboxRunner

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)


def test_the_baseline_is_served_by_its_own_worker_through_the_judges_clock() -> None:
    runner = GpuRunner(VerifyOptions(backend="cpu"), {}, "cpu")
    try:
        runner.warm()
        figures = runner._served_baseline(relu_task(256, 1024), {})
        assert figures is not None, "no served baseline"
        windows = figures["eager_windows"]
        # the judge's clock figures (its copy deduction, its input sets), not a self-timing
        assert figures["eager_us"] > 0 and windows["runtime_us"] == figures["eager_us"]
        assert "copy_us" in windows and windows["sets"] >= 1 and windows["calls"] >= 1
        # the reference ran in the timer, a process the candidates' worker is not
        assert runner.timer is not None and runner.timer.proc is not None
        assert runner.worker.proc is not None
        timer_pid = runner.timer.proc.pid
        assert timer_pid != runner.worker.proc.pid
        again = runner._served_baseline(relu_task(256, 1024), {})  # the same warm timer
        assert again is not None and runner.timer.proc.pid == timer_pid
        # a second timing is the judge's again (no ratio asserted: a loaded host moves it 10x)
        assert again["eager_windows"]["runtime_us"] == again["eager_us"] > 0
    finally:
        runner.close()


def test_both_slots_loop_believes_only_its_own_jobs_payload(tmp_path) -> None:
    """`serve_baselines`, the loop both slots time a baseline with (`SandboxRunner.baseline`,
    `GpuRunner._served_baseline`): a real sandboxed child serves eager; an outcome replayed for
    a later job (a payload with the earlier job's nonce) is not believed, and the loop stops
    at that forward without figures from it."""
    runner = SandboxRunner(SpawnLauncher(), CpuBackend(), VerifyOptions(
        backend="cpu", run_timeout_s=60.0, trials=2, baseline_cache_dir=str(tmp_path)),
        {}, threads=1)
    task = relu_task(64, 256)
    seen: list[tuple[str, Any]] = []

    def replaying(item: Any, job: dict[str, Any]) -> Any:
        out = runner.run(item, job) if not seen else seen[0][1]
        seen.append((job["nonce"], out))
        return out

    job = {"backend": "cpu", "options": {"trials": 2, "seed": 0},
           "arena_budget": CPU_ARENA_BYTES}
    figures = serve_baselines(task, ["eager"], job, replaying)
    assert figures is not None and figures["eager_us"] > 0, figures
    assert figures["eager_windows"]["runtime_us"] == figures["eager_us"]
    assert serve_baselines(task, ["eager", "eager"], job, replaying) is None
    assert len(seen) == 2 and seen[0][0] != seen[1][0]  # one job each: the replay ended it


def test_the_gpu_slot_picks_its_method_by_a_size_probe_that_times_nothing(monkeypatch) -> None:
    """A GPU slot learns a task's sizes from its referee's `sizes` (one reference call, nothing
    timed), not by timing eager in the referee first: a small task's eager is served by the
    timer and the referee's `baseline` never runs; a task past `SERVED_MAX_BYTES` is timed by
    the referee's own method. (The cpu loop's slot with a referee process beside it, as a GPU
    slot has.)"""
    runner = GpuRunner(VerifyOptions(backend="cpu"), {}, "cpu")
    runner.referee = referee = Referee({}, "cpu")
    ops: list[str] = []
    request = referee.request

    def recorded(op: str, args: dict[str, Any]) -> dict[str, Any]:
        ops.append(op)
        return request(op, args)

    monkeypatch.setattr(referee, "request", recorded)
    task = relu_task(256, 1024)
    try:
        runner.warm()
        got = referee.request("sizes", {"task_source": task, "seed": 0})["sizes"]
        assert got == {"set_bytes": 256 * 1024 * 4, "out_bytes": 256 * 1024 * 4}
        ops.clear()
        served = runner.baseline(task, {})
        assert served is not None and served["method"] == "served", served
        assert served["eager_us"] > 0 and served["eager_windows"]["runtime_us"] > 0
        assert ops[0] == "sizes" and "baseline" not in ops, ops  # eager timed once: served
        assert set(served) == {"eager_us", "eager_iqr_us", "eager_windows", "method"}
        monkeypatch.setattr(gpu_runner, "SERVED_MAX_BYTES", 2 * 256 * 1024 * 4 - 1)
        ops.clear()
        own = runner.baseline(task, {})
        assert own is not None and own["method"] == "referee" and own["eager_us"] > 0, own
        assert ops == ["sizes", "baseline"] and runner.served_failures == 0
    finally:
        runner.close()


def test_the_baselines_worker_starts_beside_the_candidates_worker(monkeypatch: Any) -> None:
    """On a GPU (a referee: here a stand-in while `warm` runs) the timer starts in the
    background beside the worker, not in series at the first baseline (an H100 batch's first
    baseline waited ~12 s for it); the first baseline then uses that very process."""
    from verifier.run.gpu_pool import GpuWorkerProcess

    spans: dict[int, tuple[float, float]] = {}
    start = GpuWorkerProcess.start

    def timed(self: GpuWorkerProcess) -> bool:
        began = time.monotonic()
        try:
            return start(self)
        finally:
            spans[id(self)] = (began, time.monotonic())

    monkeypatch.setattr(GpuWorkerProcess, "start", timed)
    runner = GpuRunner(VerifyOptions(backend="cpu"), {}, "cpu")
    try:
        runner.referee = object()  # type: ignore[assignment]  (only `warm` reads it)
        runner.warm()
        runner.referee = None
        assert runner.timer is not None
        runner.timer_start.join()
        timer, worker = spans[id(runner.timer)], spans[id(runner.worker)]
        assert timer[0] < worker[1] and worker[0] < timer[1], (timer, worker)  # overlapped
        assert runner.timer.alive()
        pid = runner.timer.proc.pid
        figures = runner._served_baseline(relu_task(256, 1024), {})
        assert figures is not None and runner.timer.proc.pid == pid
        assert len(spans) == 2  # no second start of either
    finally:
        runner.close()
