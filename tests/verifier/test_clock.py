"""The judge's clock (issue 28): the runtime is the judge's own measurement of windows of calls
on inputs it writes right before each window; nothing the worker says is a figure."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from verifier_cases import SCALE_TASK, serve_in_thread  # noqa: E402

from verifier.judge import clock
from verifier.judge.clock import JudgeClock, calls_for, time_windows
from verifier.judge.window_judge import POOL_MAX, WindowJudge

TOL = (1e-4, 1e-4, 1e-2, 1e-2)


def _judge_run(tmp_path: Path, forward: Any) -> dict[str, Any]:
    judge = WindowJudge(SCALE_TASK, 0, TOL, 16 << 20, path=str(tmp_path / "arena.bin"))
    spec = {**judge.spec, "path": str(tmp_path / "arena.bin")}
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=20.0)
    t = serve_in_thread(tmp_path, spec, forward)
    t.join(timeout=60)
    result = jc.result()
    judge.close()
    assert not t.is_alive()
    return result


def test_an_honest_worker_is_timed_by_the_judge(tmp_path: Path) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)  # a call that truly takes 2 ms (sleep: the worker is a thread here)
        return x * 3.0 + 1.0

    res = _judge_run(tmp_path, forward)
    fig = res["figures"]
    assert res["failure"] == "" and res["judge_error"] == ""
    assert 2000.0 <= fig["runtime_us"] < 20000.0, fig  # never less than a call takes
    # n from the judge's own calibration: about TARGET_S of work (a loaded host inflates the
    # calibrated call, so fewer calls, never fewer than MIN_CALLS)
    assert clock.MIN_CALLS <= fig["calls"] <= clock.TARGET_S / 0.002 + 1
    assert len(fig["windows_us"]) == clock.WINDOWS and fig["out_bytes"] == 64 * 32 * 4


def test_a_worker_that_skips_its_calls_fails_the_judges_check(tmp_path: Path) -> None:
    """Returning an earlier output (no work) is fast, and the judge sees the stale slot."""
    seen: list[torch.Tensor] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not seen:
            seen.append(x * 3.0 + 1.0)
        return seen[0]

    res = _judge_run(tmp_path, forward)
    assert "the output of a timed call was wrong" in res["failure"]
    assert res["figures"] == {}


def test_a_worker_that_writes_its_inputs_fails_the_judges_check(tmp_path: Path) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        out = x * 3.0 + 1.0
        x.zero_()
        return out

    res = _judge_run(tmp_path, forward)
    assert "modified its input tensors" in res["failure"]


def test_a_protocol_violation_is_a_failure_not_a_figure(tmp_path: Path) -> None:
    judge = WindowJudge(SCALE_TASK, 0, TOL, 16 << 20, path=str(tmp_path / "arena.bin"))
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=5.0)
    wfd = os.open(tmp_path / clock.REQ, os.O_WRONLY)
    os.write(wfd, b"r 0.001\n")  # the old protocol's "here is my runtime": not believed
    time.sleep(0.5)
    os.close(wfd)
    res = jc.result()
    judge.close()
    assert "unexpected clock message" in res["failure"] and res["figures"] == {}


def test_no_message_before_the_end_is_no_failure(tmp_path: Path) -> None:
    """A run that failed before its timing never says "t": the judge has nothing to say."""
    judge = WindowJudge(SCALE_TASK, 0, TOL, 16 << 20, path=str(tmp_path / "arena.bin"))
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=5.0)
    res = jc.result()
    judge.close()
    assert res == {"figures": {}, "failure": "", "judge_error": "", "failed_check": "",
                   "trials": None, "fastest_us": None}


def test_calls_for_keeps_the_round_trip_under_one_percent() -> None:
    assert calls_for(1e-3) == max(clock.MIN_CALLS, 20)  # 20 ms of work at 1 ms a call
    assert calls_for(1e-5, round_trip_s=1e-3) == 10_000  # 100 ms: the round trip is 1%
    assert calls_for(10.0) == 1  # one call is a window of 10 s: more calls add no precision
    assert calls_for(clock.TARGET_S) == 1 and calls_for(clock.TARGET_S * 0.99) == clock.MIN_CALLS
    assert calls_for(0.5, round_trip_s=0.005) == 1 and calls_for(0.5, round_trip_s=0.1) == 20
    assert calls_for(1e-9) == clock.MAX_CALLS
    assert calls_for(float("nan")) == clock.MIN_CALLS


def test_time_windows_measures_what_a_call_takes() -> None:
    sets = [[torch.ones(4)] for _ in range(2)]
    fresh = []
    figures = time_windows(lambda x: (time.sleep(0.001), x * 2)[1], sets,
                           lambda n: fresh.append(n), lambda: None, lambda out: None)
    assert 1000.0 <= figures["runtime_us"] < 20000.0
    assert len(fresh) >= clock.WINDOWS + 2  # fresh inputs before every window


def test_one_formula_deducts_a_windows_output_copies() -> None:
    """A window's time per call less its n output copies, never more than half the window."""
    assert clock.deducted(10.0, 4, 1.0) == 1.5
    assert clock.deducted(10.0, 4, 5.0) == 1.25
    assert clock.deducted(1.0, 0, 1.0) == 1.0  # no calls: no copies deducted


@pytest.mark.parametrize("budget", [16 << 20, 1])
def test_the_judge_sizes_its_input_sets_from_its_budget(tmp_path: Path, budget: int) -> None:
    judge = WindowJudge(SCALE_TASK, 0, TOL, budget, path=str(tmp_path / "a.bin"))
    try:
        assert judge.sets == (POOL_MAX if budget > 1 else 1)
        judge.fill(judge.sets)
        first = [p[0].clone() for p in judge.pristine]
        judge.fill(judge.sets)  # every window gets inputs the worker has never seen
        assert all(not torch.equal(a, p[0]) for a, p in zip(first, judge.pristine, strict=True))
    finally:
        judge.close()


def test_call_time_deducts_the_judges_copies_at_most_half_the_window(tmp_path: Path) -> None:
    judge = WindowJudge(SCALE_TASK, 0, TOL, 16 << 20, path=str(tmp_path / "arena.bin"))
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=5.0)
    try:
        judge.copy_s = 1e-4  # 10 copies: 1 ms of a 10 ms window
        assert jc.call_time(0.010, 10) == pytest.approx(0.0009)
        judge.copy_s = 1.0  # a copy timed under a load spike: at most half the window goes
        assert jc.call_time(0.010, 10) == pytest.approx(0.0005)
        assert jc.call_time(0.004, 0) == pytest.approx(0.004)  # the round trip: nothing to copy
    finally:
        jc.stop()
        judge.close()
