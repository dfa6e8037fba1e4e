"""The judge's figures on the persistent worker's loop beside its windows (issue 28, "the judge
owns every number"): the traced trials timed by the judge's clock (`verifier.judge.trial_pace`),
and the own-kernel share taken as the worker measured it (`verifier.run.outcome.Measured`),
not from the result the candidate can write during its timed calls."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from verifier.judge.clock import JudgeClock
from verifier.judge.clock_serve import FDS_ENV
from verifier.judge.trial_pace import (
    ALLOW_US,
    RATIO,
    WorkerPace,
    timed_finding,
    trial_figures,
)
from verifier.run.outcome import Measured

sys.path.insert(0, str(Path(__file__).parent))
PROBE = Path(__file__).parent / "share_probe"  # its sitecustomize: a share on the cpu


class _Judge:
    """What a JudgeClock asks of its judge before any window: nothing (no window is run)."""

    sets, copy_s, set_bytes, out_bytes = 1, 0.0, 0, 0


def test_the_judge_times_each_trial_between_its_go_and_the_workers_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose trials take 20, 5 and 5 ms (a sleep inside each paced trial), over the
    clock's real pipes: the judge's clock times each from its "g" to the worker's "q"; the
    figure is the fastest past the first (cold) trial."""
    req_r, req_w = os.pipe()
    go_r, go_w = os.pipe()
    os.set_blocking(req_r, False)
    monkeypatch.setenv(FDS_ENV, f"{req_w},{go_r}")
    clock = JudgeClock(_Judge(), fds=(req_r, go_w), wait_s=10.0)

    def worker() -> None:
        pace = WorkerPace(True)
        try:
            for s in (0.02, 0.005, 0.005):
                with pace.trial():
                    time.sleep(s)
        finally:
            pace.close()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10.0)
    deadline = time.monotonic() + 5.0
    while len(clock.trial_s) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    clock.stop()
    for fd in (req_r, req_w, go_r, go_w):
        os.close(fd)
    assert len(clock.trial_s) == 3, clock.trial_s
    assert clock.trial_s[0] >= 0.02 and all(t >= 0.005 for t in clock.trial_s[1:])
    figures = trial_figures(clock.trial_s)
    assert figures["trial_us"] == round(min(clock.trial_s[1:]) * 1e6, 2)
    assert figures["trial_us"] < clock.trial_s[0] * 1e6
    assert not clock.failure


@pytest.mark.parametrize("paced", [0, 2])
def test_the_judge_times_as_many_trials_as_the_job_has(
        monkeypatch: pytest.MonkeyPatch, paced: int) -> None:
    """Any thread of the run can speak the clock's protocol: fast trials of its own beside
    the harness's (a thread's "p" and "q") would lower the trials' figure, and none at all
    would leave nothing to hold the windows against. The judge times exactly the job's trials
    (its trial arena's count): one more, or "t" before all of them, fails the windows."""
    req_r, req_w = os.pipe()
    go_r, go_w = os.pipe()
    os.set_blocking(req_r, False)
    monkeypatch.setenv(FDS_ENV, f"{req_w},{go_r}")
    clock = JudgeClock(_Judge(), fds=(req_r, go_w), wait_s=10.0)
    clock.trials_due = 1
    pace, refused = WorkerPace(True), []
    try:
        for _ in range(paced):
            with pace.trial():
                pass
        if not paced:
            os.write(req_w, b"t\n")
    except ValueError as exc:  # the judge said "e" where a trial's "g" was due
        refused.append(str(exc))
    finally:
        pace.close()
    deadline = time.monotonic() + 5.0
    while not clock.failure and time.monotonic() < deadline:
        time.sleep(0.01)
    clock.stop()
    for fd in (req_r, req_w, go_r, go_w):
        os.close(fd)
    want = "more paced trials than the job's 1" if paced else "0 paced trials before the windows"
    assert want in clock.failure, clock.failure
    assert bool(refused) == bool(paced), refused


def test_a_worker_without_a_judge_is_not_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with no judge's windows (nothing reads the pipes): the trials run unpaced."""
    monkeypatch.setenv(FDS_ENV, "")
    pace = WorkerPace(False)
    with pace.trial():
        pass
    assert pace.pipes is None


def test_the_rule_holds_the_windows_against_the_trials() -> None:
    """Finding only past RATIO times the windows plus ALLOW_US and the judge's copy, with at
    least MIN_TIMED trials past the first; both figures named."""
    assert trial_figures([]) == {} and "trial_us" not in trial_figures([0.001, 0.001])
    assert timed_finding({"runtime_us": 100.0}) == ""  # no trial figure: nothing to hold
    edge = RATIO * 100.0 + ALLOW_US
    assert timed_finding({"runtime_us": 100.0, "trial_us": edge}) == ""
    why = timed_finding({"runtime_us": 100.0, "trial_us": edge + 1})
    assert "windows 100 us a call" in why and f"trials {edge + 1:g} us" in why
    assert timed_finding({"runtime_us": 100.0, "trial_us": edge + 1, "copy_us": 2.0}) == ""


def test_a_second_measurement_line_is_out_of_protocol() -> None:
    """The harness sends one measurement per job: a second (the candidate's) is tampering."""
    taken = Measured()
    assert taken.take({"progress": "correctness"}) == "" and taken.get("own_share") is None
    assert taken.take({"measured": {"own_share": 0.25}}) == ""
    assert taken.get("own_share") == 0.25
    assert "second" in taken.take({"measured": {"own_share": 1.0}})
    assert taken.get("own_share") == 0.25
    assert "malformed" in Measured().take({"measured": [1.0]})


def _verify(rows: list[tuple[str, str]], tmp_path: Path, task: str,
            **opts: Any) -> dict[str, Any]:
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    reqs = [VerifyRequest(n, "relu", task, c, "cpu") for n, c in rows]
    return {v.candidate_id: v for v in verify_batch(reqs, VerifyOptions(
        backend="cpu", gpus=1, workers=1, build_cache_dir=str(tmp_path / "builds"),
        baseline_cache_dir=str(tmp_path / "baselines"), **opts))}


@pytest.mark.slow
def test_a_share_forged_in_the_result_during_timed_calls_does_not_reach_the_reward(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --fallback partial the own-kernel share scales the reward. On CUDA it was taken
    from the worker's result, which the candidate writes during its timed calls (frame walk to
    `res.data`): before (H100, benchmarks/results/redteam_round10_cuda.md) the forged run had
    own_share 1.0 and reward 0.633 where the same forward unforged had 0.494 and 0.506. Now the
    worker sends the share as it measures it, before the candidate's code runs again, and the
    verdict takes that copy. The cpu loop with a profiler that reads 0.25 (share_probe): both
    runs' share is 0.25. Since round 15 (a forger reached the measurement line itself) the
    share never scales the reward: both speed terms are their speedups' alone."""
    from redteam_cases import candidate
    from redteam_round10_cases import SHARE_EXTRA, SHARE_FORWARD, SHARE_HONEST_FORWARD
    from verifier_cases import relu_task

    import verifier.stages as stages
    from verifier.backends.cpu import CpuBackend
    from verifier.run.gpu_pool import GpuWorkerProcess

    caches = GpuWorkerProcess.private_caches
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setattr(GpuWorkerProcess, "private_caches", lambda self: {
        **caches(self), "PYTHONPATH": f"{PROBE}:{root}"})
    monkeypatch.setattr(stages, "check_python", lambda *a, **k: [])
    monkeypatch.setattr(stages, "check_cpp", lambda *a, **k: [])
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    rows = [(name, candidate(SHARE_EXTRA, forward=fwd, name="r10_share", prelude=False))
            for name, fwd in (("measured", SHARE_HONEST_FORWARD), ("forged", SHARE_FORWARD))]
    got = _verify(rows, tmp_path, relu_task(16, 1024), fallback="partial")
    for name in ("measured", "forged"):
        v = got[name]
        comps = json.loads(v.reward_components)
        assert v.status.startswith("correct"), v
        assert comps["own_share"] == 0.25, (name, comps)
        unscaled = min(1.0, math.log2(1.0 + max(0.0, v.speedup or 0.0)) / 2.0)
        assert comps["speed"] == pytest.approx(unscaled, abs=1e-5), (name, comps)
