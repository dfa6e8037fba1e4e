"""Judge-seconds per candidate (issue 29): a slow call needs few calls, a far slower than eager
window settles the verdict, and a step's hang deadline scales with the reference's own time
(`verifier.judge.pace`, `verifier.judge.clock`, `verifier.run.hang_watch`)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from verifier_cases import SCALE_TASK, serve_in_thread  # noqa: E402

from verifier.judge import clock, pace
from verifier.judge.clock import JudgeClock, time_windows
from verifier.judge.pace import Pace
from verifier.judge.window_judge import WindowJudge
from verifier.run.hang_watch import HangWatch

TOL = (1e-4, 1e-4, 1e-2, 1e-2)


def _timed(tmp_path: Path, call_s: float, reference: Pace | None) -> tuple[dict[str, Any], int]:
    """The judge's result for a worker whose calls take `call_s`, and the calls it made."""
    judge = WindowJudge(SCALE_TASK, 0, TOL, 16 << 20, path=str(tmp_path / "arena.bin"))
    spec = {**judge.spec, "path": str(tmp_path / "arena.bin")}
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=20.0)
    jc.pace = reference
    calls = [0]

    def forward(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        time.sleep(call_s)  # a call that truly takes call_s (the worker is a thread here)
        return x * 3.0 + 1.0

    t = serve_in_thread(tmp_path, spec, forward)
    t.join(timeout=60)
    result = jc.result()
    judge.close()
    assert not t.is_alive()
    return result, calls[0]


def test_a_slow_call_is_timed_in_windows_of_one_call(tmp_path: Path) -> None:
    """30 ms a call: the calibration's window of 1 call counts, two more of 1 call follow (3
    calls; before: 1 + 3 windows of 3 calls = 10)."""
    res, calls = _timed(tmp_path, 0.03, None)
    fig = res["figures"]
    assert res["failure"] == "" and fig["calls"] == 1 and len(fig["windows_us"]) == clock.WINDOWS
    assert calls == clock.WINDOWS
    assert fig["runtime_us"] >= 30000.0 and "early_stop" not in fig


def test_a_far_slower_than_eager_window_settles_the_timing(tmp_path: Path) -> None:
    res, calls = _timed(tmp_path, 0.03, Pace(eager_s=0.002, spread=0.1))
    fig = res["figures"]
    assert res["failure"] == "" and calls == 1 and len(fig["windows_us"]) == 1
    assert fig["early_stop"].startswith("timing settled after one window: 1")  # 15x or more
    assert fig["runtime_us"] >= 30000.0


def test_a_window_within_reach_of_eager_is_timed_in_full(tmp_path: Path) -> None:
    """1.5x slower than eager (and 2x with a spread that wide) may still be noise: 3 windows."""
    for reference in (Pace(eager_s=0.02), Pace(eager_s=0.009, spread=1.0)):
        (tmp_path / str(reference.eager_s)).mkdir()
        res, calls = _timed(tmp_path / str(reference.eager_s), 0.03, reference)
        assert "early_stop" not in res["figures"] and calls == clock.WINDOWS


def test_the_reference_baseline_reuses_its_calibration_window() -> None:
    calls = [0]

    def ref(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        time.sleep(0.025)
        return x

    figures = time_windows(ref, [[torch.ones(4)]], lambda n: None, lambda: None, lambda o: None)
    assert figures["calls"] == 1 and len(figures["windows_us"]) == clock.WINDOWS
    assert calls[0] == 1 + clock.WINDOWS  # the warm-up, then three windows of one call


def test_pace_of_a_baseline_and_its_settling_bound() -> None:
    assert Pace.of({}) is None and Pace.of({"eager_us": 0.0}) is None
    p = Pace.of({"eager_us": 100.0, "eager_iqr_us": 20.0})
    assert p is not None and abs(p.eager_s - 1e-4) < 1e-12 and abs(p.spread - 0.2) < 1e-9
    assert p.settled(3.5e-4, 0.05) == ""  # 3.5x: under 3 x 1.2
    assert p.settled(3.7e-3, 0.05).startswith("timing settled after one window: 37.0x")
    assert p.settled(3.7e-3, 0.005) == ""  # a window too short to settle anything


def test_an_honest_kernel_50x_behind_eager_fits_every_step() -> None:
    """The deadline of n calls holds 50x eager twice over, plus the floor, at any pace, on
    either backend's floor."""
    for backend, floor in (("cpu", pace.HANG_FLOOR_S), ("cuda", pace.DEVICE_CALL_FLOOR_S)):
        for eager_s in (1e-6, 1e-3, 0.05, 2.0):
            for n in (1, 3, 100):
                budget = Pace.of({"eager_us": eager_s * 1e6}, backend).step_s(n)
                assert budget >= floor + 2 * 50 * eager_s * n


def test_a_gpus_call_floor_is_its_own_and_a_timeout_names_it() -> None:
    """A GPU's call steps get `DEVICE_CALL_FLOOR_S` (KernelBench's slowest honest later call on
    an H100: 0.54 s); the candidate's load keeps `HANG_FLOOR_S`; the reason names the floor."""
    gpu, cpu = Pace.of({"eager_us": 10.0}, "cuda"), Pace.of({"eager_us": 10.0}, "cpu")
    assert gpu is not None and cpu is not None
    assert pace.DEVICE_CALL_FLOOR_S < pace.HANG_FLOOR_S
    assert abs(gpu.step_s(1) - (pace.DEVICE_CALL_FLOOR_S + pace.HANG_FACTOR * 1e-5)) < 1e-9
    assert abs(cpu.step_s(1) - (pace.HANG_FLOOR_S + pace.HANG_FACTOR * 1e-5)) < 1e-9
    w = HangWatch(gpu, 0.0, timeout_s=600.0)
    w.on("correctness", now=2.0)  # the candidate's load: the floor of every backend
    assert w.deadline() == 2.0 + pace.HANG_FLOOR_S + pace.LOAD_FACTOR * 2.0
    w.on("trial", now=3.0)
    assert abs(w.deadline() - (3.0 + gpu.step_s(1) + pace.FIRST_CALL_S)) < 1e-9
    why = w.why(now=3.0)
    assert f"({pace.DEVICE_CALL_FLOOR_S:g} s + {pace.HANG_FACTOR:g}x a call" in why, why


def _clock(serving: bool = False, window: tuple[float, int] | None = None) -> SimpleNamespace:
    return SimpleNamespace(serving=serving, open_window=window)


def test_hang_deadlines_follow_the_steps_and_the_judges_windows() -> None:
    start = 1000.0
    w = HangWatch(Pace(eager_s=0.01), start, timeout_s=600.0)
    assert w.deadline() == start + 600.0 and w.why() == ""  # the reference loads: trusted
    w.on("correctness", now=start + 2.0)  # the reference took 2 s: the candidate gets 5 + 6
    assert w.deadline() == start + 2.0 + pace.HANG_FLOOR_S + pace.LOAD_FACTOR * 2.0
    w.on("trial", now=start + 4.0)  # the first call: its lazy loads' allowance more
    assert w.deadline() == start + 4.0 + pace.HANG_FLOOR_S + pace.FIRST_CALL_S \
        + pace.HANG_FACTOR * 0.01
    w.on("trial", now=start + 5.0)
    assert w.deadline() == start + 5.0 + pace.HANG_FLOOR_S + pace.HANG_FACTOR * 0.01
    assert w.deadline(_clock(serving=True)) == start + 600.0  # the judge fills: its time
    assert w.deadline(_clock(True, (start + 9.0, 4))) == start + 9.0 + Pace(0.01).step_s(4)
    assert "a timed window of 4 calls may take 9.0 s" in w.why(_clock(True, (start + 9.0, 4)))
    w.on("variants", now=start + 20.0)  # sizes never timed: the run timeout
    assert w.deadline() == start + 600.0 and w.why() == ""
    now = time.monotonic()
    w = HangWatch(Pace(eager_s=0.01), now, timeout_s=600.0)
    assert w.deadline(_clock(True, (now, 4))) == now + Pace(0.01).step_s(4)
    after = w.deadline(_clock())  # the windows are over: the report, a floor from now
    assert abs(after - time.monotonic() - pace.HANG_FLOOR_S) < 1.0
    assert w.deadline(_clock()) == after and "the run's report" in w.why(_clock())
    # the caller hands over the clock, nothing else: `why` alone sees the windows end too
    w = HangWatch(Pace(eager_s=0.01), now, timeout_s=600.0)
    assert "a timed window of 4 calls" in w.why(_clock(True, (now - 60.0, 4)), now=now)
    assert w.deadline(_clock(), now=now + 3.0) == now + 3.0 + pace.HANG_FLOOR_S
    assert "the run's report" in w.why(_clock(), now=now + 9.0)


def test_a_candidate_that_compiles_at_its_first_call_keeps_the_jit_allowance() -> None:
    for source, jit in (("from torch.utils.cpp_extension import load_inline", False),
                        ("import triton\nimport triton.language as tl", True),
                        ("self.f = torch.compile(self.f)", True), ("import cupy as cp", True),
                        ("from numba import cuda", True), ("torch.relu(x)", False)):
        assert pace.jits(source) is jit, source
        w = HangWatch(Pace(eager_s=0.01), 0.0, 600.0, jit=pace.jits(source))
        w.on("trial", now=1.0)
        first = pace.JIT_FIRST_CALL_S if jit else pace.FIRST_CALL_S
        assert w.deadline() == 1.0 + pace.HANG_FLOOR_S + first + pace.HANG_FACTOR * 0.01
        assert "(the first)" in w.why(now=1.0)


def test_the_watch_keeps_the_seconds_of_the_first_call_and_the_slowest_later_one() -> None:
    w = HangWatch(Pace(eager_s=0.01), 0.0, timeout_s=600.0)
    for step, at in (("correctness", 2.0), ("trial", 4.0), ("trial", 5.5), ("kernels", 5.75),
                     ("trial", 6.0), ("performance", 6.25)):
        w.on(step, now=at)
    assert w.spent() == {"first_call": 1.5, "call_max": 0.25}  # the windows' step: not a call
    w = HangWatch(None, 0.0, timeout_s=600.0)  # no pace: still measured
    w.on("trial", now=time.monotonic() - 2.0)
    assert w.spent()["first_call"] >= 2.0


def test_without_a_baseline_every_step_has_the_run_timeout() -> None:
    w = HangWatch(None, 50.0, timeout_s=30.0)
    for step in ("correctness", "trial", "kernels"):
        w.on(step, now=51.0)
        assert w.deadline(_clock(True, (52.0, 3))) == 80.0 and w.why() == ""
